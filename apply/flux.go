package apply

import (
	"context"
	"errors"
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
	// Reclaimed counts the times someone lifted the run's suspension mid-run (`flux resume`) and
	// the run suspended it again before its next write of what Git also holds (kept).
	Reclaimed int
	// Lost: the run could not keep it suspended (lifted again past reclaimCap, the suspension
	// refused or unreadable): its later writes of what Git also holds were not made.
	Lost    bool
	Message string
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

	ours, err := r.claim(ctx, fp.Namespace, fp.Name)

	switch {
	case errors.Is(err, errLifted):
		// Someone lifted it at once: it is claimed again before the run's first write (kept).
		res.Suspended, res.Message = true, "suspended for the run; someone lifted it at once"

		return res, nil
	case errors.Is(err, errNotTaken):
		res.Suspended, res.Message = true, "suspended, not taken: "+err.Error()

		return res, fmt.Errorf("Flux Kustomization %s: %w; no node or secret was changed, and the suspension is lifted now (or by `ghcrsync release`)", fp.Ref(), err)
	case err != nil:
		// The write may have landed: the record stays until the resume at the end confirms.
		res.Suspended, res.Message = true, "suspension not confirmed: "+redact.Error(err)

		return res, fmt.Errorf("suspend Flux Kustomization %s: %s; no node or secret was changed (its suspension, if it landed, is lifted now, or by `ghcrsync release`)", fp.Ref(), redact.Error(err))
	case !ours:
		st.DropSuspension(fp.Namespace, fp.Name, r.res.Holder)
		_ = store.Write(st)
		res.Message = "suspended meanwhile by someone else: left suspended, not resumed by this run"
		r.log.Warn("Flux Kustomization suspended by someone else since the plan: left as it is", "kustomization", fp.Ref())

		return res, nil
	}

	res.Suspended, res.Message = true, "suspended for the run"
	if r.in.Config.FluxQuiesce > 0 {
		res.Message = "suspended for the run, and taken by kustomize-controller"
	}

	r.log.Info("Flux Kustomization suspended for the run", "kustomization", fp.Ref())
	r.event(ctx, object.LeaseRef(r.in.Config.Lease.Namespace, r.in.Config.Lease.Name), "GhcrsyncFluxSuspended",
		"run "+r.res.Holder+" suspended Flux Kustomization "+fp.Ref()+" for the rotation", false)

	return res, nil
}

// claim suspends the Kustomization for the run and, with flux.quiesce, waits until
// kustomize-controller has taken the suspension (errNotTaken when it does not: a lift meanwhile,
// or no answer within the bound). ours is false when someone else suspended it first.
func (r *run) claim(ctx context.Context, ns, name string) (ours bool, err error) {
	if h := r.o.Hooks.BeforeFlux; h != nil {
		h(ns+"/"+name, phaseSuspending)
	}

	request := ""
	if r.in.Config.FluxQuiesce > 0 {
		request = r.res.Holder + "@" + r.in.Clock.Now().UTC().Format(time.RFC3339Nano)
	}

	if ours, err = r.in.Suspensions.Suspend(ctx, ns, name, r.res.Holder, request); err != nil || !ours || request == "" {
		return ours, err
	}

	return true, r.quiesced(ctx, ns, name, request)
}

// errNotTaken is a suspension kustomize-controller did not take (quiesced).
var errNotTaken = errors.New("kustomize-controller did not take the suspension")

// errLifted is a suspension lifted by someone else before kustomize-controller took it.
var errLifted = errors.New("someone lifted it first")

// quiesced waits, up to flux.quiesce_timeout, until kustomize-controller has taken the
// suspension (it answered request): a reconcile begun before it — applying Git's desired state,
// the old credential with it — has then ended, and none begins while it holds. A suspension
// lifted meanwhile is not waited for (errLifted).
func (r *run) quiesced(ctx context.Context, ns, name, request string) error {
	bound := r.in.Config.FluxQuiesce

	var (
		readErr error
		lifted  bool
	)

	err := clock.Until(ctx, r.in.Clock, bound, quiescePoll, func() (bool, error) {
		k, err := r.in.Suspensions.Kustomization(ctx, ns, name)
		if readErr = err; err != nil {
			return false, nil // an unreadable Kustomization is asked again until the bound
		}

		if lifted = k.Exists && !k.Suspended; lifted {
			return true, nil
		}

		return !k.Exists || k.Handled == request, nil // gone: nothing reconciles it
	})

	switch {
	case err == nil && lifted:
		return fmt.Errorf("%w: %w", errNotTaken, errLifted)
	case err == nil:
		return nil
	case readErr != nil:
		return fmt.Errorf("%w: its answer could not be read within %s (flux.quiesce_timeout): %s", errNotTaken, bound, redact.Error(readErr))
	}

	return fmt.Errorf("%w within %s (flux.quiesce_timeout): a reconcile begun before it may still apply Git's credential; is kustomize-controller running? (flux.quiesce = false where none is)", errNotTaken, bound)
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
	case f.Lost:
		f.Resumed = err == nil
	case err != nil:
		f.Left, f.Message = true, "LEFT SUSPENDED: "+redact.Error(err)+"; `ghcrsync release` resumes it"
	case gone:
		f.Resumed, f.Message = true, "no suspension of this run on it any more (resumed by someone, or deleted)"
	default:
		f.Resumed, f.Message = true, "suspended for the run, resumed: Flux applies Git again"+f.reclaimNote()
		r.log.Info("Flux Kustomization resumed", "kustomization", ref)
	}
}
