package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var fuzzKey = []byte("fuzz plan key")

// Decode never panics on a plan file's bytes, refuses anything not made by Save, and a plan it
// accepts saves and loads back to the same plan.
func FuzzDecode(f *testing.F) {
	var p Plan

	b, err := os.ReadFile(filepath.Join("testdata", "rotation", "plan.json"))
	if err != nil {
		f.Fatal(err)
	}

	if err := json.Unmarshal(b, &p); err != nil {
		f.Fatal(err)
	}

	dir := f.TempDir()
	saved := filepath.Join(dir, "seed.plan")

	if err := Save(saved, &p, fuzzKey); err != nil {
		f.Fatal(err)
	}

	good, _ := os.ReadFile(saved)
	f.Add(good)
	f.Add(bytes.Replace(good, []byte(`"fence"`), []byte(`"no-op"`), 1)) // edited: checksum fails
	f.Add(good[:len(good)/2])                                           // truncated
	f.Add([]byte(`{"format":"ghcrsync-plan","checksum":"sha256:00","plan":{}}`))
	f.Add([]byte(`{"format":"ghcrsync-plan","plan":"x"}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Decode(data, "fuzz.plan")
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.plan") {
				t.Fatalf("error does not name the file: %v", err)
			}

			return
		}

		data, err = Encode(p, fuzzKey)
		if err != nil {
			t.Fatal(err)
		}

		again, err := Decode(data, "again.plan")
		if err != nil {
			t.Fatalf("an accepted plan, encoded again, does not decode: %v", err)
		}

		if !again.Authentic(fuzzKey) || again.Authentic([]byte("another key")) {
			t.Fatal("a plan sealed with a key is authentic with that key only")
		}

		a, _ := json.Marshal(p)
		b, _ := json.Marshal(again)

		if !bytes.Equal(a, b) {
			t.Fatalf("plan changed on a round trip")
		}
	})
}
