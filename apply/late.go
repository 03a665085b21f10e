package apply

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// lateRounds bounds the re-listings that find nodes to rotate: a fleet that keeps growing is
// left to the verdict (it says which nodes still use the old credential) and the next run.
const lateRounds = 3

// lateNodes rotates, under the same Lease and failure budget, what the plan could not: nodes
// that joined during the run (a scale-up), and nodes the plan or the run left alone that the
// planner's judgement now lets through (a scale-down candidate whose taint went, a node that is
// Ready again). The fleet is listed again and planned with the plan's own rules until two
// listings in a row agree and find nothing to do, at most lateRounds times with work. The
// listing before the first relist is the last one the run made (the plan's, at first): a fleet
// that has not changed since is confirmed by one relist, not two — each reads every node's
// Talos facts, thousands of calls on a large fleet. A node the cluster is deleting is waited
// for (bounded by ready_timeout): gone is fine.
func (r *run) lateNodes(ctx context.Context) {
	if r.exec == nil {
		return
	}

	ctx = requests.WithStep(ctx, "run: late") // --verbose: the relists' cost (a late node's own steps are its own)

	done := r.actedOn()
	deadline := r.in.Clock.Now().Add(r.in.Config.Nodes.ReadyTimeout)
	worked := 0

	if r.fleet == "" {
		r.fleet = fleetOf(r.p)
	}

	for list := 1; ; list++ {
		if ctx.Err() != nil || r.exec.stopped() || r.exec.budgetSpent() {
			return
		}

		if h := r.o.Hooks.BeforeRelist; h != nil {
			h(list)
		}

		fresh, err := r.replan(ctx)
		if err != nil {
			r.log.Warn("the fleet could not be listed again for late nodes; the verdict reads it once more", "error", err)

			return
		}

		todo := notDone(fresh, done)
		fleet, previous := fleetOf(fresh), r.fleet
		r.fleet = fleet

		switch {
		case len(todo) > 0 && worked < lateRounds:
			worked++
			r.rotateLate(ctx, fresh, todo, worked)
		case len(todo) > 0:
			r.log.Warn("late nodes remain after the last round; the verdict names them", "nodes", names(todo))

			return
		case deleting(fresh) && r.in.Clock.Now().Before(deadline):
			r.log.Info("waiting for nodes the cluster is deleting to go", "nodes", deletingNames(fresh))

			if err := r.exec.sleep(ctx); err != nil {
				return
			}
		case fleet == previous:
			return // two listings in a row agree, with nothing to do
		}
	}
}

// notDone are the nodes fresh acts on that the run has not (done, by name/uid).
func notDone(fresh *plan.Plan, done map[string]bool) []plan.NodePlan {
	var todo []plan.NodePlan

	for _, np := range fresh.Nodes {
		if np.Order > 0 && !done[np.Name+"/"+np.UID] {
			todo = append(todo, np)
		}
	}

	return todo
}

// actedOn are the nodes (name/uid) the run rotated, failed or cancelled, kept across rounds.
func (r *run) actedOn() map[string]bool {
	if r.done == nil {
		r.done = map[string]bool{}

		for _, np := range r.p.Nodes {
			if np.Order > 0 && !deselected(r.res.Nodes, np.Name) {
				r.done[np.Name+"/"+np.UID] = true
			}
		}
	}

	return r.done
}

// rotateLate runs the transactions of one round's late nodes under the same Lease.
func (r *run) rotateLate(ctx context.Context, fresh *plan.Plan, todo []plan.NodePlan, round int) {
	r.log.Warn("late nodes: the fleet changed since the plan; rotating them under the same Lease", "round", round, "nodes", names(todo))

	for _, np := range todo {
		r.done[np.Name+"/"+np.UID] = true
	}

	sub := *fresh
	sub.Nodes = todo
	results := r.exec.run(ctx, &sub)

	for i := range results {
		results[i].Late = true
	}

	r.res.Nodes = append(r.res.Nodes, results...)
}

// replan lists the fleet again and plans it with the plan's own rules: the registry's judgement
// of the credentials in use (an emergency stays one: the late node's drain steers hard, its pods
// never land on a node that cannot pull) and the plan's options (--allow-pending, the proof
// skipped, the probe image).
func (r *run) replan(ctx context.Context) (*plan.Plan, error) {
	snap, in, err := r.in.Fleet.ReadJudged(talos.Reusing(ctx), r.p.ProofSkipped)
	if err != nil {
		return nil, err
	}

	in.AllowPending, in.ProofSkipped, in.Probe = r.p.Steering.AllowPending, r.p.ProofSkipped, r.p.Probe

	return plan.Make(snap, in), nil
}

// deselected reports whether the run's last result for node deselected it (the judgement left it
// alone: it may be judged again).
func deselected(results []NodeResult, node string) bool {
	for i := len(results) - 1; i >= 0; i-- {
		if results[i].Node == node {
			return results[i].Outcome == state.OutcomeDeselected
		}
	}

	return false
}

// fleetOf identifies a listing: every node's name and uid.
func fleetOf(p *plan.Plan) string {
	ids := make([]string, 0, len(p.Nodes))

	for _, n := range p.Nodes {
		if n.UID != "" {
			ids = append(ids, n.Name+"/"+n.UID)
		}
	}

	slices.Sort(ids)

	return strings.Join(ids, ",")
}

// deleting reports whether a node the cluster is deleting still uses the old credential.
func deleting(p *plan.Plan) bool { return len(deletingNames(p)) > 0 }

func deletingNames(p *plan.Plan) []string {
	var out []string

	for _, n := range p.Nodes {
		if n.Action == plan.ActionDeselect && (n.Reason == plan.ReasonDeleting || n.Reason == plan.ReasonAutoscalerDeleting) {
			out = append(out, n.Name)
		}
	}

	return out
}

func names(nodes []plan.NodePlan) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Name)
	}

	return out
}

// settleProvisioning waits, before the fleet's last listing, until no autoscaler node group is
// creating machines (the autoscaler's own status: target against registered), for at most
// ready_timeout: a machine created from the template as the autoscaler read it before its
// rewrite would otherwise join just after the run ends, with the old credential. Once they have
// joined, the late-node pass rotates them; the verdict names any still being created.
func (r *run) settleProvisioning(ctx context.Context) {
	if len(r.in.Config.NodeTemplates) == 0 {
		return
	}

	start, timeout := r.in.Clock.Now(), r.in.Config.Nodes.ReadyTimeout

	for {
		status, err := r.in.Fleet.Provisioning(ctx)
		if err != nil {
			r.log.Warn("the cluster-autoscaler's status could not be read; the verdict reads it once more", "error", redact.Logged(r.log, err))

			return
		}

		groups := status.Provisioning()
		if len(groups) == 0 {
			return
		}

		elapsed := r.in.Clock.Now().Sub(start)
		if elapsed >= timeout {
			return // the verdict names them
		}

		for _, g := range groups {
			r.o.Progress.Emit(progress.WaitingProvisioned{Group: g.Name, Machines: g.Provisioning(), Elapsed: elapsed, Timeout: timeout})
		}

		if clock.Sleep(ctx, r.in.Clock, 5*time.Second) != nil {
			return
		}
	}
}
