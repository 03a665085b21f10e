package release

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The image of two platforms' binaries, written twice: the same bytes (reproducible); read back
// as an OCI layout, index.json names one image index by the version, with one image per
// platform whose config says that platform, runs the binary as the non-root user, dates it
// at the commit, and whose one layer holds the binary at ImageBinary, 0755.
func TestImageIsReproducibleAndShaped(t *testing.T) {
	dir := t.TempDir()
	bins := map[string]string{}

	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		path := filepath.Join(dir, strings.ReplaceAll(p, "/", "_"))
		if err := os.WriteFile(path, []byte("binary for "+p), 0o755); err != nil {
			t.Fatal(err)
		}

		bins[p] = path
	}

	mtime := time.Unix(1_790_000_000, 0)
	src := ImageSource{Version: "v0.3.0", Commit: "abc123", Repository: "git+https://github.com/acme/ghcrsync"}

	first, second := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")

	d1, err := Image(first, bins, src, mtime)
	if err != nil {
		t.Fatal(err)
	}

	d2, err := Image(second, bins, src, mtime)
	if err != nil {
		t.Fatal(err)
	}

	a, _ := os.ReadFile(first)
	b, _ := os.ReadFile(second)

	if d1 != d2 || !bytes.Equal(a, b) {
		t.Fatalf("two builds of the same binaries differ: %s vs %s, bytes equal %v", d1, d2, bytes.Equal(a, b))
	}

	unpacked := t.TempDir()
	if out, err := exec.Command("tar", "-xf", first, "-C", unpacked).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}

	top, err := layout.ImageIndexFromPath(unpacked)
	if err != nil {
		t.Fatal(err)
	}

	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v0.3.0" || tm.Manifests[0].Digest != d1 {
		t.Fatalf("index.json: %+v (%v), want the one image index %s named v0.3.0", tm, err, d1)
	}

	idx, err := top.ImageIndex(d1)
	if err != nil {
		t.Fatal(err)
	}

	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 2 {
		t.Fatalf("the image index: %+v (%v), want two platforms", im, err)
	}

	for _, m := range im.Manifests {
		p := m.Platform.OS + "/" + m.Platform.Architecture

		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}

		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}

		if cf.OS+"/"+cf.Architecture != p || cf.Config.User != ImageUser || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != ImageBinary ||
			!cf.Created.Equal(mtime) || cf.Config.Labels["org.opencontainers.image.revision"] != "abc123" {
			t.Fatalf("%s's config: %+v", p, cf)
		}

		if content, mode := layerFile(t, img, ImageBinary[1:]); content != "binary for "+p || mode != 0o755 {
			t.Fatalf("%s's layer holds %q (mode %o) at %s", p, content, mode, ImageBinary)
		}
	}
}

// An image is of linux binaries only: a darwin one is refused, naming it.
func TestImageRefusesAnotherOS(t *testing.T) {
	_, err := Image(filepath.Join(t.TempDir(), "x.tar"), map[string]string{"darwin/arm64": "/dev/null"}, ImageSource{}, time.Unix(0, 0))
	if err == nil || !strings.Contains(err.Error(), `"darwin/arm64" is not a linux platform`) {
		t.Fatalf("got %v", err)
	}
}

func layerFile(t *testing.T, img v1.Image, name string) (string, int64) {
	t.Helper()

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d (%v), want 1", len(layers), err)
	}

	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()

	tr := tar.NewReader(rc)

	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s is not in the layer (%v)", name, err)
		}

		if h.Name == name {
			b, _ := io.ReadAll(tr)

			return string(b), h.Mode
		}
	}
}
