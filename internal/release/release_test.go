package release_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/release"
)

// The same files give the same archive, whatever their dates on disk: a release can be rebuilt
// and compared. The control: another content gives another archive.
func TestArchiveIsReproducible(t *testing.T) {
	dir := t.TempDir()
	bin, doc := filepath.Join(dir, "ghcrsync"), filepath.Join(dir, "README.md")
	_ = os.WriteFile(bin, []byte("binary"), 0o755)
	_ = os.WriteFile(doc, []byte("readme"), 0o644)

	files := []release.File{{Path: bin, Name: "ghcrsync", Mode: 0o755}, {Path: doc, Name: "README.md", Mode: 0o644}}
	epoch := time.Unix(1_700_000_000, 0)

	archive := func(name string) []byte {
		p := filepath.Join(dir, name)
		if err := release.Archive(p, files, epoch); err != nil {
			t.Fatal(err)
		}

		b, _ := os.ReadFile(p)

		return b
	}

	first := archive("a.tar.gz")
	_ = os.Chtimes(bin, time.Now(), time.Now().Add(time.Hour))

	if !bytes.Equal(first, archive("b.tar.gz")) {
		t.Fatal("the same files archived twice differ")
	}

	_ = os.WriteFile(bin, []byte("another binary"), 0o755)

	if bytes.Equal(first, archive("c.tar.gz")) {
		t.Fatal("control: another content gave the same archive")
	}

	if out, err := exec.Command("tar", "-tvzf", filepath.Join(dir, "a.tar.gz")).CombinedOutput(); err != nil ||
		!bytes.Contains(out, []byte("-rwxr-xr-x root/root")) || !bytes.Contains(out, []byte("2023-11-14")) {
		t.Fatalf("tar reads: %v\n%s", err, out)
	}
}

// SHA256SUMS is what sha256sum --check reads, and the provenance names each subject's digest,
// the commit and the builder.
func TestChecksumsAndProvenance(t *testing.T) {
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "b.tar.gz"), []byte("b"), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "a.cdx.json"), []byte("{}"), 0o644)

	subjects, err := release.Subjects(dir, []string{"b.tar.gz", "a.cdx.json"})
	if err != nil || len(subjects) != 2 || subjects[0].Name != "a.cdx.json" {
		t.Fatalf("%v %+v", err, subjects)
	}

	// Checksums writes by name, whatever order it is given.
	sums := release.Checksums([]release.Subject{subjects[1], subjects[0]})
	if !strings.HasPrefix(string(sums), subjects[0].Digest.SHA256+"  a.cdx.json\n") {
		t.Fatalf("SHA256SUMS not by name:\n%s", sums)
	}

	_ = os.WriteFile(filepath.Join(dir, "SHA256SUMS"), sums, 0o644)

	c := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	c.Dir = dir

	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum --check: %v\n%s", err, out)
	}

	js, err := release.NewStatement(subjects, release.Build{Version: "v1.2.3", Commit: "abc123", Repository: "git+https://github.com/acme/ghcrsync",
		Platforms: []string{"linux/amd64"}}).JSON()
	if err != nil {
		t.Fatal(err)
	}

	var st struct {
		Type          string            `json:"_type"`
		PredicateType string            `json:"predicateType"`
		Subject       []release.Subject `json:"subject"`
		Predicate     struct {
			BuildDefinition struct {
				ResolvedDependencies []release.ResourceDescriptor `json:"resolvedDependencies"`
			} `json:"buildDefinition"`
			RunDetails struct {
				Builder release.Builder `json:"builder"`
			} `json:"runDetails"`
		} `json:"predicate"`
	}

	if err := json.Unmarshal(js, &st); err != nil || st.Type != release.StatementType || st.PredicateType != release.PredicateType ||
		len(st.Subject) != 2 || st.Subject[1].Digest.SHA256 != subjects[1].Digest.SHA256 ||
		st.Predicate.BuildDefinition.ResolvedDependencies[0].Digest.GitCommit != "abc123" || st.Predicate.RunDetails.Builder.ID == "" {
		t.Fatalf("%v\n%s", err, js)
	}
}
