package maintenance

import (
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// kured's own values, as its pkg/daemonsetlock marshals them (time.Time as RFC 3339, the TTL in
// nanoseconds, its metadata a NodeMeta).
const (
	kuredSingle        = `{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-12-07T11:50:00Z","TTL":0}`
	kuredSingleExpired = `{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-12-07T10:00:00Z","TTL":3600000000000}`
	kuredMultiOne      = `{"maxOwners":2,"locks":[{"nodeID":"w1","metadata":{"unschedulable":true},"created":"2026-12-07T11:50:00Z","TTL":0}]}`
	kuredMultiFull     = `{"maxOwners":2,"locks":[{"nodeID":"w1","metadata":{"unschedulable":true},"created":"2026-12-07T11:50:00Z","TTL":0},` +
		`{"nodeID":"w2","metadata":{"unschedulable":false},"created":"2026-12-07T11:55:00Z","TTL":0}]}`
)

func TestKuredLockHolds(t *testing.T) {
	for _, tc := range []struct {
		name, value, node string
		held              bool
	}{
		{"absent", "", "w3", false},
		{"single, held by another node", kuredSingle, "w3", true},
		{"single, held by the same node's kured (not ghcrsync)", kuredSingle, "w1", true},
		{"single, expired TTL", kuredSingleExpired, "w3", false},
		{"single, ghcrsync's own entry", `{"nodeID":"ghcrsync/w3","created":"2026-12-07T11:50:00Z","TTL":0}`, "w3", false},
		{"single, ghcrsync's entry for another node", `{"nodeID":"ghcrsync/w2","created":"2026-12-07T11:50:00Z","TTL":0}`, "w3", true},
		{"multi, a place free", kuredMultiOne, "w3", false},
		{"multi, every place taken", kuredMultiFull, "w3", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseKuredLock(tc.value)
			if err != nil {
				t.Fatal(err)
			}

			h := l.Holds(tc.node, now)
			if (h != nil) != tc.held {
				t.Fatalf("held: %v, want %t", h, tc.held)
			}

			if h != nil && (h.Tool != ToolKured || !strings.Contains(h.Reason, KuredLockAnnotation)) {
				t.Fatalf("hold does not name kured's lock: %+v", h)
			}
		})
	}
}

func TestKuredLockTakeAndDropKeepKuredsForm(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		taken       string // the value after Take ("" when refused)
		dropped     string // after Drop of the taken value
	}{
		{"absent: the single form", "",
			`{"nodeID":"ghcrsync/w3","metadata":{"unschedulable":false,"ghcrsync_holder":"run-1"},"created":"2026-12-07T12:00:00Z","TTL":0}`, ""},
		{"expired single: replaced", kuredSingleExpired,
			`{"nodeID":"ghcrsync/w3","metadata":{"unschedulable":false,"ghcrsync_holder":"run-1"},"created":"2026-12-07T12:00:00Z","TTL":0}`, ""},
		{"held single: refused", kuredSingle, "", ""},
		{"multi with a place: added, others kept as written", kuredMultiOne,
			`{"maxOwners":2,"locks":[{"nodeID":"w1","metadata":{"unschedulable":true},"created":"2026-12-07T11:50:00Z","TTL":0},` +
				`{"nodeID":"ghcrsync/w3","metadata":{"unschedulable":false,"ghcrsync_holder":"run-1"},"created":"2026-12-07T12:00:00Z","TTL":0}]}`,
			kuredMultiOne},
		{"multi full: refused", kuredMultiFull, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseKuredLock(tc.value)
			if err != nil {
				t.Fatal(err)
			}

			v, err := l.Take("w3", "run-1", false, now)
			if err != nil {
				t.Fatal(err)
			}

			if tc.taken == "" {
				if v != nil {
					t.Fatalf("took a held lock: %s", *v)
				}

				return
			}

			if v == nil || *v != tc.taken {
				t.Fatalf("took:\n got %v\nwant %s", deref(v), tc.taken)
			}

			// kured reads what ghcrsync wrote: the holder is not any node's own name.
			var back KuredLock
			if back, err = ParseKuredLock(*v); err != nil || back.Holds("w3", now) != nil || back.Holds("w1", now) == nil && !back.Multi {
				t.Fatalf("kured's reading of the taken lock: %+v %v", back, err)
			}

			if again, _ := back.Take("w3", "run-1", false, now.Add(time.Minute)); again == nil || *again != *v {
				t.Fatalf("taking it again changes it: %v", deref(again))
			}

			d, err := back.Drop("w3")
			if err != nil || d == nil || *d != tc.dropped {
				t.Fatalf("dropped:\n got %v\nwant %q", deref(d), tc.dropped)
			}

			if nothing, _ := back.Drop("w9"); nothing != nil {
				t.Fatalf("dropping an entry it does not have writes %q", *nothing)
			}
		})
	}
}

func TestKuredLockUnreadable(t *testing.T) {
	for _, v := range []string{"{", `{"foo":1}`, `{"locks":"x"}`, `["w1"]`} {
		if _, err := ParseKuredLock(v); err == nil {
			t.Errorf("%s: read", v)
		}
	}
}

func TestKuredIDIsNoNodeName(t *testing.T) {
	// A DNS-1123 node name has no "/": kured on node w3 never takes ghcrsync's entry for its own.
	if id := KuredID("w3"); id == "w3" || !strings.Contains(id, "/") || KuredNode(id) != "w3" || KuredNode("w3") != "" {
		t.Fatalf("KuredID(w3) = %s", id)
	}

	l, err := ParseKuredLock(`{"maxOwners":3,"locks":[{"nodeID":"w1","created":"2026-12-07T11:50:00Z","TTL":0},` +
		`{"nodeID":"ghcrsync/w3","metadata":{"unschedulable":true,"ghcrsync_holder":"run-1"},"created":"2026-12-07T11:55:00Z","TTL":0}]}`)
	if err != nil {
		t.Fatal(err)
	}

	if ours := l.Ours(); len(ours) != 1 || ours[0].Node != "w3" || ours[0].Holder != "run-1" {
		t.Fatalf("ours: %+v", ours)
	}
}

func TestOtherHolds(t *testing.T) {
	plans := []UpgradePlan{{Namespace: "system-upgrade", Name: "talos", Applying: []string{"w1"}}, {Namespace: "system-upgrade", Name: "k8s"}}

	for _, tc := range []struct {
		name string
		hold *Hold
		tool string
	}{
		{"a Plan applying to the node", Upgrading(plans, "w1"), ToolSUC},
		{"a Plan applying elsewhere", Upgrading(plans, "w2"), ""},
		{"upgrading", Staged("upgrading"), ToolTalos},
		{"rebooting", Staged("rebooting"), ToolTalos},
		{"shutting down", Staged("shutting down"), ToolTalos},
		{"running", Staged("running"), ""},
		{"kured's node mark", KuredRebooting(map[string]string{KuredRebootInProgressAnnotation: "2026-12-07T11:00:00Z"}), ToolKured},
		{"no mark", KuredRebooting(map[string]string{"a": "b"}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch {
			case tc.tool == "" && tc.hold != nil:
				t.Fatalf("held: %+v", tc.hold)
			case tc.tool != "" && (tc.hold == nil || tc.hold.Tool != tc.tool):
				t.Fatalf("hold %+v, want one by %s", tc.hold, tc.tool)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}

	return *s
}
