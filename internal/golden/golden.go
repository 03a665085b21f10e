// Package golden compares what a test renders with a file under its package's testdata: the
// one golden-file helper of the project's tests. `go test PKG -update` rewrites the files
// instead; review the diff before committing it.
package golden

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// Updating reports whether the run rewrites golden files (-update).
func Updating() bool { return *update }

// Check compares got with the file at path (relative to the test's package directory), or
// rewrites the file with -update.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()

	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}

		return
	}

	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}

	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (go test -update rewrites it; review the diff):\n--- got\n%s", path, got)
	}
}
