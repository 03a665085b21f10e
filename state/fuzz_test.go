package state

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Decode never panics on a local state file's bytes, and what it accepts round-trips.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"format_version":"1","lineage":"l","serial":3,"records":[{"node":"n","owner":"o","action":"fence","phase":"claimed","fence":{"uid":"u","was_cordoned":false,"initial_taints":null,"desired_revision":"r","scale_down_guard_ours":true},"started":"2026-11-30T10:00:00Z"}]}`))
	f.Add([]byte(`{"format_version":"1","records":[{"node":""}]}`))
	f.Add([]byte(`{"format_version":"2"}`))
	f.Add([]byte(`{"format_version":"1","run":{"finished":"not a time"}}`))
	f.Add([]byte(`[`))

	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Decode(data)
		if err != nil {
			return
		}

		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}

		again, err := Decode(b)
		if err != nil {
			t.Fatalf("re-encoded state refused: %v\n%s", err, b)
		}

		if b2, _ := json.Marshal(again); !bytes.Equal(b, b2) {
			t.Fatalf("state changed on a round trip:\n%s\n%s", b, b2)
		}
	})
}
