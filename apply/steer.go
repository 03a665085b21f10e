package apply

import (
	"context"
	"errors"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/pool"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// steered lists the nodes the run puts its steering taint on: every fenced node (its drain's
// pods, and every pod after, should land on rotated nodes), and, where the taint is NoSchedule,
// the live ones too (until updated they cannot pull either). Under a time budget, only the
// nodes this run expects to rotate (InBudget): a node left to the next run is not tainted by
// this one, so a run killed or stopped leaves no steering beyond what it was rotating.
func steered(p *plan.Plan, budgeted bool) []plan.NodePlan {
	var out []plan.NodePlan

	if p.Steering.Effect == "" { // a plan of a ghcrsync before steering: none
		return nil
	}

	for _, n := range p.Nodes {
		if n.Order > 0 && (n.Action == plan.ActionFence || n.Action.InPlace() && p.Steering.Hard()) && (!budgeted || n.InBudget) {
			out = append(out, n)
		}
	}

	return out
}

// steer puts the run's steering taint on every node it will rotate, before the first drain: the
// state records them all first (one write, before any taint), then each node is tainted by a
// compare-and-swap that leaves every other taint as it is. A node that cannot be tainted is
// logged: the drains' destination check (plan.CheckDestinations) still refuses to evict onto it
// where it cannot pull.
func (e *executor) steer(ctx context.Context, p *plan.Plan) {
	nodes := steered(p, !e.o.Deadline.IsZero())
	if len(nodes) == 0 {
		return
	}

	e.mu.Lock()
	for _, n := range nodes {
		// A dead run's steering left on the node (handed over by the reclaim) is replaced by
		// this run's in the same patch below.
		e.st.TakeSteer(state.Steer{Node: n.Name, UID: n.UID, Owner: e.o.Holder, Effect: p.Steering.Effect, Added: e.clock.Now().UTC()})
	}

	err := e.store.Write(e.st)
	e.mu.Unlock()

	if err != nil {
		e.o.Logger.Warn("the steering taints are not put on: the state could not record them first", "error", err)

		return
	}

	pool.Each(len(nodes), e.o.LiveParallelism, func(i int) {
		n := nodes[i]
		if h := e.o.Hooks.BeforeMutation; h != nil {
			h(n.Name, phaseSteering)
		}

		if err := object.Steer(ctx, e.nodes, n.Name, n.UID, e.o.Holder, p.Steering.Effect); err != nil {
			e.o.Logger.Warn("steering taint not put on", "node", n.Name, "taint", taints.Steering+":"+p.Steering.Effect, "error", redact.Error(err))
		}
	})
}

// phaseSteering is what BeforeMutation is told before a node's steering taint goes on (not a
// phase of its transaction: the node has none yet).
const phaseSteering state.Phase = "steering"

// unsteerAll takes the run's steering taint off every node it is still on and closes their
// state records: at the end of the run, whatever happened, nothing steers pods any more (a node
// the run leaves fenced stays cordoned: no pod lands on it either way).
func (e *executor) unsteerAll(ctx context.Context) {
	e.mu.Lock()
	var todo []state.Steer

	for _, x := range e.st.Steered {
		if x.Owner == e.o.Holder {
			todo = append(todo, x)
		}
	}
	e.mu.Unlock()

	if len(todo) == 0 {
		return
	}

	uctx, cancel := e.clock.WithTimeout(context.WithoutCancel(ctx), e.o.ReadyTimeout)
	defer cancel()

	var (
		mu   sync.Mutex
		done []string
	)

	pool.Each(len(todo), e.o.LiveParallelism, func(i int) {
		x := todo[i]
		if _, err := object.Unsteer(uctx, e.nodes, x.Node, x.UID, e.o.Holder); err != nil {
			e.o.Logger.Warn("steering taint left on: `ghcrsync release` takes it off", "node", x.Node, "error", redact.Error(err))

			return
		}

		mu.Lock()
		done = append(done, x.Node)
		mu.Unlock()
	})

	e.mu.Lock()
	defer e.mu.Unlock()

	e.st.Steered = slices.DeleteFunc(e.st.Steered, func(x state.Steer) bool { return x.Owner == e.o.Holder && slices.Contains(done, x.Node) })

	if err := e.store.Write(e.st); err != nil {
		e.o.Logger.Warn("the steering taints are off, but the state could not record it", "error", err)
	}
}

// withoutSteering adds, to a patch of annotations built from n, the removal of the run's
// steering taint and its annotation (when n carries them): the node is proved, pods may land on
// it.
func (e *executor) withoutSteering(n *corev1.Node, patch map[string]any) map[string]any {
	return object.WithoutSteering(n, e.o.Holder, patch)
}

// destinations returns the drain's check before each eviction (plan.CheckDestinations): every
// node an evicted pod can be scheduled onto can pull. The credentials in use are asked of the
// registry again first (execOptions.Recheck), once per drain: one revoked since the plan makes
// the nodes holding it unable to take a pod.
func (t *txn) destinations(ctx context.Context) drain.Check {
	view := t.p

	if t.e.o.Recheck != nil {
		if fresh := t.e.o.Recheck(ctx); fresh != nil {
			p := *t.p
			p.CredentialsInUse = fresh
			view = &p

			if p.Emergency() && !t.p.Emergency() {
				t.log.Warn("a credential the nodes hold was refused by the registry since the plan: nodes still holding it take no evicted pod",
					"refused", len(p.Refused()))
			}
		}
	}

	return func(ctx context.Context, pods int) error {
		ds, err := t.e.workloads.Destinations(ctx)
		if err != nil {
			return err // asked again
		}

		switch err := view.CheckDestinations(t.np.Name, pods, ds); {
		case errors.Is(err, plan.ErrUncordonLag):
			return err // asked again: the node lifecycle controller is about to let pods onto it
		case err != nil:
			return &drain.Refused{Why: err}
		}

		return nil
	}
}
