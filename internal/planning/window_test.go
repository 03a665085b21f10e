package planning

import (
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/window"
	"github.com/ghcrsync/ghcrsync/plan"
)

// What the plan says of the maintenance window, if apply ran at its time: closed, every node to
// fence waits for its opening; open, those expected to end after it closes wait for the next;
// an emergency reboots them anyway; nothing when all fit or none is fenced.
func TestWindowWarning(t *testing.T) {
	w, err := window.Parse("Mon-Fri 22:00-06:00 UTC")
	if err != nil {
		t.Fatal(err)
	}

	fenced := func(ends ...time.Duration) *plan.Plan {
		p := &plan.Plan{}
		for i, e := range ends {
			p.Nodes = append(p.Nodes, plan.NodePlan{Name: "n", Order: i + 1, Action: plan.ActionFence, Ends: e})
		}

		p.Nodes = append(p.Nodes, plan.NodePlan{Name: "live", Order: len(ends) + 1, Action: plan.ActionApplyLive, Ends: 100 * time.Hour})

		return p
	}
	emergency := fenced(time.Hour)
	emergency.CredentialsInUse = []plan.CredentialInUse{{State: plan.CredentialRefused}}

	monday2300 := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	monday1200 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

	for _, tc := range []struct {
		name string
		p    *plan.Plan
		now  time.Time
		want string // "" for no warning
	}{
		{"open, all fit (the live update never counts)", fenced(time.Hour, 2*time.Hour), monday2300, ""},
		{"open, one ends after it closes", fenced(time.Hour, 8*time.Hour), monday2300,
			"closes at 2026-12-08T06:00:00Z: about 1 of the 2 nodes to fence are expected to end before it; apply defers the rest to the next window (2026-12-08T22:00:00Z)"},
		{"closed", fenced(time.Hour), monday1200, "is closed now: apply writes what restarts nothing and defers the 1 node to fence until it opens (2026-12-07T22:00:00Z)"},
		{"closed, in an emergency", emergency, monday1200, "an emergency), and apply reboots the 1 node to fence at once"},
		{"closed, nothing to fence", fenced(), monday1200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := WindowWarning(w, tc.p, tc.now)

			switch {
			case tc.want == "" && len(got) != 0:
				t.Fatalf("got %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}

	if got := WindowWarning(nil, fenced(time.Hour), monday1200); got != nil {
		t.Fatalf("no window: %q", got)
	}
}
