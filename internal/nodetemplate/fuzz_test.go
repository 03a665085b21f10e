package nodetemplate_test

import (
	"encoding/base64"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
)

// FuzzRead: a template value from a Secret anyone with write access to it controls. Reading and
// rewriting never panic; a value Read accepts is rewritten into one that reads back with the new
// credential in every pool it had.
func FuzzRead(f *testing.F) {
	doc := []byte("version: v1alpha1\nmachine:\n  type: worker\n  token: t\ncluster:\n  controlPlane:\n    endpoint: https://10.0.0.2:6443\n")
	for _, seed := range [][]byte{
		doc, []byte("null"), []byte("{}"), []byte(`{"nodeConfigs":{"a":{"cloudInit":""}}}`), []byte("---\n---\n"),
		[]byte(base64.StdEncoding.EncodeToString([]byte(`{"nodeConfigs":{"a":{"cloudInit":"version: v1alpha1\n"}}}`))),
		[]byte(base64.StdEncoding.EncodeToString(doc)),
	} {
		for _, format := range nodetemplate.Formats {
			f.Add(format, seed)
		}
	}

	f.Fuzz(func(t *testing.T, format string, value []byte) {
		pools, err := nodetemplate.Read(format, value, nil, "ghcr.io")
		if err != nil {
			return
		}

		next, err := nodetemplate.Rewrite(format, value, nil, "ghcr.io", "u", "p")
		if err != nil {
			return // a config the loader accepts but a rewrite cannot keep equal is refused, not written
		}

		after, err := nodetemplate.Read(format, next, nil, "ghcr.io")
		if err != nil || len(after) != len(pools) {
			t.Fatalf("the rewrite does not read back: %v (%d pools, was %d)", err, len(after), len(pools))
		}

		for _, p := range after {
			if p.Digest == "" {
				t.Fatalf("pool %q lost the credential", p.Name)
			}
		}
	})
}
