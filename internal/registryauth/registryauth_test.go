package registryauth

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
)

// The credential inside a machine config, in each form Talos merges: read, replaced, taken out.
func TestRules(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		held       string // the digest it gives ghcr.io before
	}{
		{"the legacy machine.registries form", "legacy.yaml", authdigest.Of("fleet-old", "ghp_old")},
		{"a RegistryAuthConfig document", "document.yaml", ""},
		{"no credential", "none.yaml", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}

			before, err := configloader.NewFromBytes(raw)
			if err != nil {
				t.Fatal(err)
			}

			if tc.held != "" && Digest(before, "ghcr.io") != tc.held {
				t.Fatalf("Digest = %s, want %s", Digest(before, "ghcr.io"), tc.held)
			}

			if (Digest(before, "ghcr.io") == "") != (Credential(before, "ghcr.io") == nil) {
				t.Fatal("Digest and Credential disagree on whether there is a credential")
			}

			next, err := With(before, "ghcr.io", "fleet-new", "ghp_new")
			if err != nil {
				t.Fatal(err)
			}

			after, err := configloader.NewFromBytes(next)
			if err != nil {
				t.Fatal(err)
			}

			if got, want := Digest(after, "ghcr.io"), authdigest.Of("fleet-new", "ghp_new"); got != want {
				t.Fatalf("after With: %s, want %s (the document wins over the legacy form)", got, want)
			}

			if c := Credential(after, "ghcr.io"); c == nil || c.Username != "fleet-new" {
				t.Fatalf("after With: credential %v", c)
			}

			if Digest(after, "quay.io") != Digest(before, "quay.io") {
				t.Fatal("With changed another registry's credential")
			}

			// Without the credential (either form), before and after are the same config but for the
			// legacy form's auth, which With leaves (the document overrides it).
			a, _ := WithoutCredential(before, "ghcr.io")
			b, _ := WithoutCredential(after, "ghcr.io")

			if !bytes.Equal(a, b) {
				t.Fatalf("WithoutCredential differs before and after With:\n%s\n---\n%s", a, b)
			}

			// Without the document only, the legacy form's credential remains.
			d, _ := WithoutDocument(after, "ghcr.io")

			only, err := configloader.NewFromBytes(d)
			if err != nil {
				t.Fatal(err)
			}

			if got := Digest(only, "ghcr.io"); got != Digest(before, "ghcr.io") && tc.file != "document.yaml" {
				t.Fatalf("WithoutDocument: %s, want the legacy form's %s", got, Digest(before, "ghcr.io"))
			}
		})
	}
}
