package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ghcrsync/ghcrsync/config/examples"
)

// Parse never panics on any configuration text; it either returns a configuration or a
// *config.Error (diagnostics with file:line), and a configuration it accepts parses the same
// way twice.
func FuzzParse(f *testing.F) {
	example, err := examples.FS.ReadFile("sandbox.hcl")
	if err != nil {
		f.Fatal(err)
	}

	f.Add(example)
	f.Add([]byte(valid))
	f.Add([]byte("nodes {\n"))
	f.Add([]byte("credential \"ghcr\" {\n  endpont = \"x\"\n}\n"))
	f.Add([]byte("cluster { kubeconfig = env(\"GHCRSYNC_FUZZ_UNSET\") }\n"))
	f.Add([]byte("lease { duration = \"-1s\" heartbeat = \"1h\" }\n"))

	dir := f.TempDir()
	for _, name := range []string{"kubeconfig", "talosconfig", "secret.enc.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			f.Fatal(err)
		}
	}

	file := filepath.Join(dir, "ghcrsync.hcl")

	f.Fuzz(func(t *testing.T, src []byte) {
		cfg, err := Parse(src, file)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error is not a *config.Error with diagnostics: %T %v", err, err)
			}

			return
		}

		again, err := Parse(src, file)
		if err != nil || again.Digest != cfg.Digest || !reflect.DeepEqual(again, cfg) {
			t.Fatalf("a configuration parsed differently twice: %v", err)
		}
	})
}
