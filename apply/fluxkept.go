package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
)

// reclaimCap bounds how many times one run suspends a Kustomization again after someone lifted
// it: a person or a controller that keeps resuming it is not fought, the run stops its writes.
const reclaimCap = 3

// gitWrite is one of the run's writes of what Git also holds (the node templates, the consumer
// pull secrets): kustomize-controller, were it reconciling, would put Git's copy back.
type gitWrite struct {
	what  string
	write func(context.Context)
}

// underSuspension makes one of those writes once every suspension of the run is kept (kept); when
// one was lifted and had to be claimed again, the writes made before it are made again first (a
// reconcile while it was lifted may have put Git's copy back; each write is a no-op where the
// credential is still there). A suspension that cannot be kept skips the write.
func (r *run) underSuspension(ctx context.Context, w gitWrite) {
	if r.held(ctx, w.what) != nil {
		return
	}

	w.write(ctx)
	r.written = append(r.written, w)
}

// held is the one check before a write of what Git also holds (before names it): every
// suspension of the run kept (kept), and when one had to be claimed again, the writes of what Git
// holds made before it made again. The error says which suspension was not kept.
func (r *run) held(ctx context.Context, before string) error {
	reclaimed, err := r.kept(ctx, before)
	if err != nil || !reclaimed {
		return err
	}

	for _, w := range r.written {
		r.log.Info("written again: a Flux suspension was lifted since", "what", w.what)
		w.write(ctx)
	}

	return nil
}

// kept re-reads every Kustomization the run holds suspended, before it writes what Git also holds
// (before): one that someone lifted meanwhile (`flux resume`) is suspended again and, with
// flux.quiesce, waited for as the first time, so a reconcile the lift began has ended before the
// write. reclaimed tells whether one was. A Kustomization that cannot be kept (lifted again after
// reclaimCap claims in this run, its suspension refused or unreadable) is named in the result and
// the error, and the caller makes no such write. One read per Kustomization: a Talos write needs
// none (Flux applies no machine config).
func (r *run) kept(ctx context.Context, before string) (reclaimed bool, err error) {
	ctx = requests.WithStep(ctx, "run: flux")

	for i := range r.res.Flux {
		f := &r.res.Flux[i]
		if !f.Suspended || f.Resumed || f.Left {
			continue // not the run's suspension
		}

		if f.Lost {
			return reclaimed, fmt.Errorf("Flux Kustomization %s is not kept suspended", f.Kustomization)
		}

		n := f.Reclaimed
		if err := r.keep(ctx, f); err != nil {
			f.Lost, f.Message = true, "NOT KEPT SUSPENDED: "+err.Error()+"; the run wrote neither "+before+" nor anything after it that Git also holds"
			r.log.Error("Flux Kustomization not kept suspended: the run's writes of what Git also holds stop", "kustomization", f.Kustomization, "before", before, "error", err)

			return reclaimed, fmt.Errorf("Flux Kustomization %s: %w", f.Kustomization, err)
		}

		reclaimed = reclaimed || f.Reclaimed > n
	}

	return reclaimed, nil
}

// keep reads the Kustomization and, while someone has lifted its suspension, claims it again.
func (r *run) keep(ctx context.Context, f *FluxResult) error {
	ns, name, _ := strings.Cut(f.Kustomization, "/")

	for {
		k, err := r.in.Suspensions.Kustomization(ctx, ns, name)

		switch {
		case err != nil:
			return fmt.Errorf("could not be read again before the write: %s", redact.Error(err))
		case !k.Exists || k.Suspended:
			// Gone, nothing reconciles it; or suspended — by this run, or since by someone else,
			// whose suspension the run's resume leaves alone: either way nothing applies Git.
			return nil
		case f.Reclaimed >= reclaimCap:
			return fmt.Errorf("lifted by someone else again after the run suspended it %d more time(s) (reclaim cap): is someone resuming it (`flux resume`)? Run again once they have stopped", f.Reclaimed)
		}

		f.Reclaimed++
		r.log.Warn("Flux Kustomization lifted by someone else mid-run: suspended again", "kustomization", f.Kustomization, "times", f.Reclaimed)
		r.event(ctx, object.LeaseRef(r.in.Config.Lease.Namespace, r.in.Config.Lease.Name), "GhcrsyncFluxReclaimed",
			"run "+r.res.Holder+" suspended Flux Kustomization "+f.Kustomization+" again: someone lifted its suspension mid-run", true)

		ours, err := r.claim(ctx, ns, name)

		switch {
		case errors.Is(err, errNotTaken) && errors.Is(err, errLifted):
			continue // lifted again at once: read, and claim again while the cap allows
		case err != nil:
			return fmt.Errorf("lifted by someone else mid-run, and suspended again, but %s", redact.Error(err))
		case !ours:
			return nil // someone else suspended it meanwhile: nothing applies Git
		}
	}
}

// reclaimNote is what the result says of a Kustomization claimed again during the run.
func (f FluxResult) reclaimNote() string {
	if f.Reclaimed == 0 {
		return ""
	}

	return fmt.Sprintf(" (someone lifted it mid-run: suspended again %d time(s) before the run's next write of what Git holds)", f.Reclaimed)
}

// keptSecret puts a fan-out result in the run's result, replacing the same target's result from
// an earlier write (made again by held): one line per target.
func (r *run) keptSecret(s secretwrite.Result) {
	for i, x := range r.res.Secrets {
		if x.Namespace == s.Namespace && x.Secret == s.Secret && x.Key == s.Key && x.Role == s.Role {
			if x.Outcome != secretwrite.Written || s.Outcome != secretwrite.Unchanged { // written by this run either way
				r.res.Secrets[i] = s
			}

			return
		}
	}

	r.res.Secrets = append(r.res.Secrets, s)
}
