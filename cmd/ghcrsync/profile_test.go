package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// GHCRSYNC_RESOURCES: the command's own CPU, its heap's peak and its resident size are written
// when it ends.
func TestMeasureResources(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resources.json")
	t.Setenv(resourcesEnv, path)

	var stderr bytes.Buffer

	stop := measureResources(&stderr)

	held := make([][]byte, 0, 64)
	for range 64 {
		held = append(held, bytes.Repeat([]byte{1}, 1<<20)) // 64 MiB, held a moment
	}

	for i := 0; i < 2e7; i++ { // CPU the command spends
		held[i%64][i%(1<<20)]++
	}

	stop()

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	var r Resources
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", b, err)
	}

	if r.PeakHeapBytes < 64<<20 || r.UserSeconds+r.SystemSeconds <= 0 || r.MaxRSSBytes <= 0 || stderr.Len() > 0 {
		t.Errorf("measured %+v (stderr %q), want a peak heap of at least the 64 MiB held, some CPU and a resident size", r, stderr.String())
	}

}

// Without GHCRSYNC_RESOURCES nothing is measured or written.
func TestMeasureResourcesOff(t *testing.T) {
	t.Setenv(resourcesEnv, "")
	measureResources(os.Stderr)() // nothing to stop, nothing written
}
