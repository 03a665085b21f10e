package object

import (
	"encoding/json"
	"testing"

	"github.com/ghcrsync/ghcrsync/state"
)

// ParseRecord never panics on what anyone with Node patch rights may write, and what it
// accepts re-encodes to a record it accepts again, identically.
func FuzzParseRecord(f *testing.F) {
	good, _ := json.Marshal(state.Fence{UID: "8c6f0b36-6c39-4e9f-9a4c-2a9b1a0f4d11", WasCordoned: true, InitialTaints: []string{"a=b:NoSchedule"}, DesiredRevision: "abc", ScaleDownGuardOurs: true})
	f.Add(string(good))
	f.Add(`{"uid":""}`)
	f.Add(`{"uid":"x","initial_taints":null}`)
	f.Add(`[]`)
	f.Add(`{"uid":"x","was_cordoned":"yes"}`)

	f.Fuzz(func(t *testing.T, raw string) {
		r, err := ParseRecord(raw)
		if err != nil {
			return
		}

		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}

		again, err := ParseRecord(string(b))
		if err != nil {
			t.Fatalf("re-encoded record %s refused: %v", b, err)
		}

		if b2, _ := json.Marshal(again); string(b2) != string(b) {
			t.Fatalf("record changed on a round trip: %s -> %s", b, b2)
		}
	})
}
