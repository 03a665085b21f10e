package planning

import (
	"context"
	"fmt"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Others are the other maintenance tools as plan reads them (cluster.Others): kured's lock and
// the system-upgrade-controller's Plans.
type Others interface {
	KuredLock(ctx context.Context) (lock maintenance.KuredLock, exists bool, err error)
	UpgradePlans(ctx context.Context) ([]maintenance.UpgradePlan, error)
}

// othersWarnings say which nodes the plan fences another tool holds now: apply checks again
// before each claim (and reads each machine's Talos stage then) and defers the node it holds.
func (pl *Planner) othersWarnings(ctx context.Context, p *plan.Plan) []string {
	if pl.Others == nil {
		return nil
	}

	var fenced []string

	for _, n := range p.Nodes {
		if n.Action == plan.ActionFence {
			fenced = append(fenced, n.Name)
		}
	}

	if len(fenced) == 0 {
		return nil
	}

	var out []string

	lock, _, err := pl.Others.KuredLock(ctx)
	if err != nil {
		out = append(out, "kured's lock could not be read ("+redact.Error(err)+"): apply asks again before each node and does not fence a node it cannot tell is free.")
	} else if h := lock.Holds(fenced[0], pl.Clock.Now()); h != nil {
		out = append(out, fmt.Sprintf("%s. Apply defers each node it would fence (%d) while kured holds it: exit 6, and the next run goes on.", upper(h.Reason), len(fenced)))
	}

	plans, err := pl.Others.UpgradePlans(ctx)
	if err != nil {
		out = append(out, "The system-upgrade-controller's Plans could not be read ("+redact.Error(err)+"): apply asks again before each node.")
	}

	for _, node := range fenced {
		if h := maintenance.Upgrading(plans, node); h != nil {
			out = append(out, fmt.Sprintf("%s: %s; apply defers it while the Plan applies.", node, h.Reason))
		}
	}

	return out
}

func upper(s string) string { return strings.ToUpper(s[:1]) + s[1:] }
