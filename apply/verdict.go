package apply

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
)

// inventory reads the cluster as it is now and judges who uses which credential.
func (r *run) inventory(ctx context.Context) (plan.Revocation, error) {
	snap, in, err := r.in.Fleet.Read(ctx)
	if err != nil {
		return plan.Revocation{}, err
	}

	return plan.Inventory(snap, in), nil
}

// rootInventory is the inventory the root is judged on. A node template whose one objection is
// its reader still rolling out (the last drain evicted the autoscaler's pod; a restart under way)
// is waited for, the cluster read again every readersPoll, for up to nodes.ready_timeout — only
// while such rollouts are all that keeps the old credential in use; then the inventory stands
// as it is (a rollout that never ends holds the root back). Under a time budget the wait never
// runs past its end.
func (r *run) rootInventory(ctx context.Context) (plan.Revocation, error) {
	bound := r.in.Config.Nodes.ReadyTimeout
	start := r.in.Clock.Now()

	if !r.res.Deadline.IsZero() {
		bound = max(0, min(bound, r.res.Deadline.Sub(start)))
	}

	var (
		v       plan.Revocation
		readErr error
	)

	// Until's own answer (timed out, cancelled) leaves the last inventory standing.
	_ = clock.Until(ctx, r.in.Clock, bound, readersPoll, func() (bool, error) {
		snap, in, err := r.in.Fleet.Read(talos.Reusing(ctx)) // the machines unchanged since the last relist are not asked again
		if err != nil {
			readErr = err

			return true, nil
		}

		v = plan.Inventory(snap, in)
		rolling := snap.ReadersRollingOut(in.AuthDigest)

		if !onlyRollouts(v.Except(plan.UseRoot), rolling) {
			return true, nil
		}

		names := make([]string, 0, len(rolling))
		for _, t := range rolling {
			names = append(names, t.Restart)
		}

		r.log.Info("the root waits for node template readers to roll out", "deployments", names,
			"waited", clock.Since(r.in.Clock, start).Round(time.Second), "bound", bound)

		return false, nil
	})

	if readErr != nil {
		return plan.Revocation{}, readErr
	}

	return v, nil
}

// readersPoll is how often the root's wait for rolling readers reads the cluster again.
const readersPoll = 2 * time.Second

// onlyRollouts reports whether v keeps the old credential only through templates whose readers
// are rolling out (waiting may end it); false when v is safe, or anything else holds it.
func onlyRollouts(v plan.Revocation, rolling []plan.TemplateObs) bool {
	still := v.Still() // none when v is safe
	if len(still) == 0 {
		return false
	}

	for _, u := range still {
		if u.Kind != plan.UseTemplate || !slices.ContainsFunc(rolling, func(t plan.TemplateObs) bool { return t.Where() == u.Name }) {
			return false
		}
	}

	return true
}

// verdict is the run's last word, from the cluster at the end: is the old credential still used?
func (r *run) verdict(ctx context.Context) {
	vctx, cancel := r.in.Clock.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute) // read-only, even after a cancel
	defer cancel()

	v, err := r.inventory(vctx)
	if err != nil {
		r.res.VerdictErr = fmt.Errorf("the cluster could not be read to judge whether the old credential is still used: %s", redact.Logged(r.log, err))
		r.log.Error("no verdict", "error", r.res.VerdictErr)

		return
	}

	// The root written this run and not proved by Flux: revoking the old credential is not safe
	// while deploys cannot pull with the new one (flux_root.prove).
	for _, s := range r.res.Secrets {
		if s.Role == plan.RoleRoot && s.NotProved != "" {
			v = v.RootNotProved(s.Namespace+"/"+r.in.Config.FluxRoot.OCIRepository, s.NotProved)
		}
	}

	r.res.Verdict = &v

	if v.Clean() {
		r.log.Info(v.Sentence())
	} else {
		r.log.Warn(v.Sentence())
	}
}

// events is where the run records its Events: the cluster, and Options.Observe.
func (r *run) events() Recorder {
	return recorder{kube: r.in.Events, observe: r.o.Observe, clock: r.in.Clock}
}

// event records an Event on the run's objects (the Lease, the pull secrets); best effort.
func (r *run) event(ctx context.Context, ref object.Ref, reason, msg string, warning bool) {
	if err := r.events().Record(context.WithoutCancel(ctx), ref, reason, msg, warning); err != nil {
		r.log.Debug("event not written", "error", err)
	}
}

// record writes the run's outcome into the state.
func (r *run) record() {
	st := r.in.State
	finished := r.in.Clock.Now().UTC()
	st.Run.Finished = &finished

	switch {
	case r.res.Cancelled:
		st.Run.Outcome = "cancelled"
	case r.res.Failed() > 0:
		st.Run.Outcome = "failed"
	case r.res.Progressed():
		st.Run.Outcome = "progressed"
	default:
		st.Run.Outcome = "succeeded"
	}

	if rot := st.Rotation; rot != nil && rot.Finished == nil && r.res.Verdict != nil && r.res.Verdict.Clean() {
		rot.Finished = &finished
	}

	if err := r.in.Store.Write(st); err != nil {
		r.log.Error("write final state", "error", err)
	}
}

// releaseLease releases the Lease, bounded, even when the run's context is done.
func (r *run) releaseLease(ctx context.Context) {
	rctx, cancel := r.in.Clock.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()

	r.res.ReleaseErr = r.lease.Release(rctx)
	if r.res.ReleaseErr == nil {
		cfg := r.in.Config
		r.event(rctx, object.LeaseRef(cfg.Lease.Namespace, cfg.Lease.Name), "GhcrsyncLeaseReleased",
			"run "+r.res.Holder+" released the Lease"+r.rotatedLive(), false)
	}
}
