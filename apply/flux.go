package apply

import (
	"context"
	"fmt"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// What BeforeFlux is told before a Flux Kustomization is suspended or resumed (not phases of a
// node's transaction).
const (
	phaseSuspending state.Phase = "suspending"
	phaseResuming   state.Phase = "resuming"
)

// FluxResult is what the run did with one Kustomization of the flux block.
type FluxResult struct {
	Kustomization string // namespace/name
	// Suspended: the run suspended it; Resumed: and lifted its suspension at the end; Left: the
	// run ended with its suspension on (`ghcrsync release` lifts it).
	Suspended, Resumed, Left bool
	Message                  string
}

// Held reports whether the run left its suspension on (not while the run goes on: the
// suspension is then what was asked for).
func (f FluxResult) Held() bool { return f.Left }

// resumeBound is how long the end of a run tries to resume its Kustomizations once the run's
// context is done.
const resumeBound = time.Minute

// suspend suspends, for the run, every Kustomization the plan suspends: each is recorded in the
// state before its write (a run killed in between leaves the record, and `release` resumes it),
// and one someone else suspended meanwhile is left as it is (never resumed by this run). A
// Kustomization that cannot be suspended stops the run before any node or secret is touched: the
// controller it holds would switch the credential from Git mid-run.
func (r *run) suspend(ctx context.Context) error {
	for _, fp := range r.p.Flux {
		if fp.Action != plan.FluxSuspend {
			r.res.Flux = append(r.res.Flux, FluxResult{Kustomization: fp.Ref(), Message: fp.Reason})

			continue
		}

		res, err := r.suspendOne(ctx, fp)
		r.res.Flux = append(r.res.Flux, res)

		if err != nil {
			return err
		}
	}

	return nil
}

func (r *run) suspendOne(ctx context.Context, fp plan.FluxPlan) (FluxResult, error) {
	res := FluxResult{Kustomization: fp.Ref()}
	st, store := r.in.State, r.in.Store

	st.PutSuspension(state.Suspension{Namespace: fp.Namespace, Name: fp.Name, UID: fp.UID, Owner: r.res.Holder, Added: r.in.Clock.Now().UTC()})

	if err := store.Write(st); err != nil {
		st.DropSuspension(fp.Namespace, fp.Name, r.res.Holder)
		res.Message = "not suspended: the state could not record it first"

		return res, fmt.Errorf("Kustomization %s is not suspended: write state (%s) first: %w; no node or secret was changed", fp.Ref(), store.Describe(), err)
	}

	if h := r.o.Hooks.BeforeFlux; h != nil {
		h(fp.Ref(), phaseSuspending)
	}

	request := ""
	if r.in.Config.FluxQuiesce > 0 {
		request = r.res.Holder + "@" + r.in.Clock.Now().UTC().Format(time.RFC3339Nano)
	}

	ours, err := r.in.Suspensions.Suspend(ctx, fp.Namespace, fp.Name, r.res.Holder, request)
	if err != nil {
		// The write may have landed: the record stays until the resume at the end confirms.
		res.Suspended, res.Message = true, "suspension not confirmed: "+redact.Error(err)

		return res, fmt.Errorf("suspend Flux Kustomization %s: %s; no node or secret was changed (its suspension, if it landed, is lifted now, or by `ghcrsync release`)", fp.Ref(), redact.Error(err))
	}

	if !ours {
		st.DropSuspension(fp.Namespace, fp.Name, r.res.Holder)
		_ = store.Write(st)
		res.Message = "suspended meanwhile by someone else: left suspended, not resumed by this run"
		r.log.Warn("Flux Kustomization suspended by someone else since the plan: left as it is", "kustomization", fp.Ref())

		return res, nil
	}

	res.Suspended, res.Message = true, "suspended for the run"

	if request != "" {
		if err := r.quiesced(ctx, fp, request); err != nil {
			res.Message = "suspended, not taken: " + err.Error()

			return res, fmt.Errorf("Flux Kustomization %s: %w; no node or secret was changed, and the suspension is lifted now (or by `ghcrsync release`)", fp.Ref(), err)
		}

		res.Message = "suspended for the run, and taken by kustomize-controller"
	}

	r.log.Info("Flux Kustomization suspended for the run", "kustomization", fp.Ref())
	r.event(ctx, object.LeaseRef(r.in.Config.Lease.Namespace, r.in.Config.Lease.Name), "GhcrsyncFluxSuspended",
		"run "+r.res.Holder+" suspended Flux Kustomization "+fp.Ref()+" for the rotation", false)

	return res, nil
}

// quiesced waits, up to flux.quiesce_timeout, until kustomize-controller has taken the
// suspension (it answered request): a reconcile begun before it — applying Git's desired state,
// the old credential with it — has then ended, and none begins while it holds.
func (r *run) quiesced(ctx context.Context, fp plan.FluxPlan, request string) error {
	bound := r.in.Config.FluxQuiesce

	var readErr error

	err := clock.Until(ctx, r.in.Clock, bound, quiescePoll, func() (bool, error) {
		taken, err := r.in.Suspensions.Taken(ctx, fp.Namespace, fp.Name, request)
		readErr = err

		return err == nil && taken, nil // an unreadable Kustomization is asked again until the bound
	})

	switch {
	case err == nil:
		return nil
	case readErr != nil:
		return fmt.Errorf("kustomize-controller's answer could not be read within %s (flux.quiesce_timeout): %s", bound, redact.Error(readErr))
	}

	return fmt.Errorf("kustomize-controller did not take the suspension within %s (flux.quiesce_timeout): a reconcile begun before it may still apply Git's credential; is kustomize-controller running? (flux.quiesce = false where none is)", bound)
}

// quiescePoll is how often a suspension's answer is looked for.
const quiescePoll = 500 * time.Millisecond

// resume lifts every suspension the state says the run may hold, even when the run's context is
// done: a Kustomization is never left suspended by a finished run. Each record is dropped only
// once the resume is confirmed (or the Kustomization carries no suspension of this run).
func (r *run) resume(ctx context.Context) {
	rctx, cancel := r.in.Clock.WithTimeout(context.WithoutCancel(ctx), resumeBound)
	defer cancel()

	st, store := r.in.State, r.in.Store

	for _, x := range append([]state.Suspension(nil), st.Suspended...) {
		if x.Owner != r.res.Holder {
			continue
		}

		ref := x.Namespace + "/" + x.Name

		if h := r.o.Hooks.BeforeFlux; h != nil {
			h(ref, phaseResuming)
		}

		gone, err := r.in.Suspensions.Resume(rctx, x.Namespace, x.Name, r.res.Holder)
		r.noteResumed(ref, gone, err)

		if err != nil {
			r.log.Error("Flux Kustomization left suspended: run `ghcrsync release` to resume it", "kustomization", ref, "error", redact.Error(err))

			continue
		}

		st.DropSuspension(x.Namespace, x.Name, x.Owner)

		if err := store.Write(st); err != nil {
			r.log.Warn("Flux Kustomization resumed, but the state could not record it", "kustomization", ref, "error", err)
		}
	}
}

// noteResumed records a resume's outcome on the Kustomization's result.
func (r *run) noteResumed(ref string, gone bool, err error) {
	i := -1

	for j := range r.res.Flux {
		if r.res.Flux[j].Kustomization == ref {
			i = j
		}
	}

	if i < 0 {
		r.res.Flux = append(r.res.Flux, FluxResult{Kustomization: ref, Suspended: true})
		i = len(r.res.Flux) - 1
	}

	f := &r.res.Flux[i]

	switch {
	case err != nil:
		f.Left, f.Message = true, "LEFT SUSPENDED: "+redact.Error(err)+"; `ghcrsync release` resumes it"
	case gone:
		f.Resumed, f.Message = true, "no suspension of this run on it any more (resumed by someone, or deleted)"
	default:
		f.Resumed, f.Message = true, "suspended for the run, resumed: Flux applies Git again"
		r.log.Info("Flux Kustomization resumed", "kustomization", ref)
	}
}
