package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadLocal(t *testing.T) {
	dir := t.TempDir()

	s, err := ReadLocal(filepath.Join(dir, "absent.json"))
	if err != nil || s.Lineage != "" || s.Serial != 0 {
		t.Fatalf("missing file: %+v %v", s, err)
	}

	for name, content := range map[string]string{"corrupt": "{not json", "future": `{"format_version":"9"}`,
		"fence_without_uid": `{"format_version":"` + FormatVersion + `","records":[{"node":"w1","phase":"drained","action":"fence"}]}`} {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, []byte(content), 0o600)

		if _, err := ReadLocal(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestLocalWriteAndLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ghcrsync.state.json")
	l := &Local{Path: path}

	s, _ := l.Read()
	s.Put(Record{Node: "a", Fence: Fence{UID: "uid-a"}, Phase: PhaseDrained})

	if err := l.Write(s); err != nil {
		t.Fatal(err)
	}

	lineage := s.Lineage
	s.Put(Record{Node: "a", Fence: Fence{UID: "uid-a"}, Phase: PhaseConfigured})

	if err := l.Write(s); err != nil {
		t.Fatal(err)
	}

	got, err := l.Read()
	if err != nil || got.Lineage != lineage || got.Serial != 2 || got.Record("a").Phase != PhaseConfigured || len(lineage) != 36 {
		t.Fatalf("%+v %v", got, err)
	}

	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}

	if err := l.Lock(); err != nil {
		t.Fatal(err)
	}

	other := &Local{Path: path}
	if err := other.Lock(); err == nil || !strings.Contains(err.Error(), "locked by another") {
		t.Fatalf("second lock: %v", err)
	}

	l.Unlock()

	if err := other.Lock(); err != nil {
		t.Fatal(err)
	}

	other.Unlock()
}

func TestPhaseOrder(t *testing.T) {
	if !PhaseRebooting.AtOrAfter(PhaseConfigured) || PhaseDrained.AtOrAfter(PhaseConfigured) || !PhaseConfigured.AtOrAfter(PhaseConfigured) {
		t.Fatal("order")
	}

	r := Record{Outcome: OutcomeFailed, Phase: PhaseDrained}
	if !r.Holds() || (Record{Outcome: OutcomeDone, Phase: PhaseReleased}).Holds() || !(Record{Phase: PhaseClaimed}).Holds() {
		t.Fatal("holds")
	}
}

// Which records may still hold a fence on the cluster.
func TestRecordHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Record
		want bool
	}{
		{"running", Record{Action: "fence", Phase: PhaseDrained}, true},
		{"killed_before_claim", Record{Action: "fence", Phase: PhaseSelected}, true},
		{"done", Record{Action: "fence", Phase: PhaseReleased, Outcome: OutcomeDone}, false},
		{"failed_after_claim", Record{Action: "fence", Phase: PhaseConfigured, Outcome: OutcomeFailed}, true},
		{"failed_at_selection", Record{Action: "fence", Phase: PhaseSelected, Outcome: OutcomeFailed}, false},
		{"cancelled_after_claim", Record{Action: "fence", Phase: PhaseRebooting, Outcome: OutcomeCancelled}, true},
		{"deselected", Record{Action: "fence", Phase: PhaseClaimed, Outcome: OutcomeDeselected}, false},
		// found by the chaos campaign: a live rotation never claims, so it never holds a fence,
		// even when it failed after its Talos write (release then uncordoned an operator's cordon)
		{"live_failed_after_configure", Record{Action: ActionApplyLive, Phase: PhaseConfigured, Outcome: OutcomeFailed}, false},
		{"live_killed", Record{Action: ActionApplyLive, Phase: PhaseConfigured}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.Holds(); got != tc.want {
				t.Fatalf("Holds() = %t, want %t", got, tc.want)
			}
		})
	}
}
