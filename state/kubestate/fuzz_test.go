package kubestate

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/state"
)

// A gzip bomb (a small Secret that inflates past the ceiling) is refused without inflating it.
func TestDecodeRefusesAGzipBomb(t *testing.T) {
	var gz bytes.Buffer

	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	zeros := make([]byte, 1<<20)

	for range (maxStateSize >> 20) + 8 {
		_, _ = zw.Write(zeros)
	}

	_ = zw.Close()

	if gz.Len() > 1<<20 {
		t.Fatalf("the bomb is %d bytes: it should fit one Secret", gz.Len())
	}

	_, err := Decode(map[string][]byte{"chunks": []byte("1"), "state.json.gz.0": gz.Bytes()})
	if err == nil || !strings.Contains(err.Error(), "is larger than 32 MiB") {
		t.Fatalf("gzip bomb: %v", err)
	}
}

// Decode never panics on a Secret's data (chunk count, chunks, gzip, JSON), inflates at most
// maxStateSize, and what it accepts encodes back to the same state.
func FuzzDecode(f *testing.F) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	real := &state.State{FormatVersion: state.FormatVersion, Lineage: "2b0f", Serial: 7,
		Run:     &state.Run{Holder: "abc-local-host-1-ff", CredentialRevision: "abc", Started: now, Outcome: "succeeded"},
		Records: []state.Record{{Node: "prod-worker-1", Owner: "abc-local-host-1-ff", Phase: state.PhaseReleased, Outcome: state.OutcomeDone, Started: now}}}

	for _, st := range []*state.State{real, {FormatVersion: state.FormatVersion}, {FormatVersion: "9"}} {
		d, err := encode(st)
		if err != nil {
			f.Fatal(err)
		}

		f.Add(d["chunks"], d["state.json.gz.0"], []byte(nil))
	}

	f.Add([]byte("2"), []byte{0x1f, 0x8b}, []byte("rest"))
	f.Add([]byte("64"), []byte(nil), []byte(nil))

	f.Fuzz(func(t *testing.T, chunks, c0, c1 []byte) {
		st, err := Decode(map[string][]byte{"chunks": chunks, "state.json.gz.0": c0, "state.json.gz.1": c1})
		if err != nil {
			return
		}

		d, err := encode(st)
		if err != nil {
			t.Fatal(err)
		}

		again, err := Decode(d)
		if err != nil {
			t.Fatalf("re-encoded state refused: %v", err)
		}

		a, _ := json.Marshal(st)
		b, _ := json.Marshal(again)

		if !bytes.Equal(a, b) {
			t.Fatalf("state changed on a round trip:\n%s\n%s", a, b)
		}
	})
}
