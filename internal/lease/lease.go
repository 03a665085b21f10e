// Package lease holds ghcrsync's run Lease (coordination.k8s.io/v1): it acquires it only when
// it is absent, free or already ours — never by taking over a holder on expiry, since a Talos
// write cannot be fenced by a token — renews it in the background, lets every mutation assert
// it still holds it, and releases it with a compare-and-swap on the holder alone.
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/human"
)

// Failure classes of a renewal.
const (
	APIUnreachable = "api-unreachable"
	HeldByAnother  = "held-by-another"
	Expired        = "expired"
	// Deleted: the Lease was gone when its holder came to release it. Nothing is held, but while
	// it was absent another run could have acquired it: mutual exclusion is not known to have
	// held to the end.
	Deleted = "deleted"
)

// IsDeleted reports whether err is a release that found the Lease deleted.
func IsDeleted(err error) bool {
	var le *Error

	return errors.As(err, &le) && le.Class == Deleted
}

// Error is a lost or refused Lease, with the evidence.
type Error struct {
	Class       string
	Ours        string
	Holder      string
	Transitions int32
	RenewTime   *time.Time
	Seen        time.Time // when RenewTime was read: its age is told against it
	Duration    time.Duration
	Err         error
}

func (e *Error) Error() string {
	renew := "never"
	if e.RenewTime != nil {
		renew = e.RenewTime.UTC().Format(time.RFC3339) + " (" + human.Renewed(e.RenewTime, e.Seen) + ")"
	}

	msg := fmt.Sprintf("lease %s: ours=%s holder=%s same_holder=%t transitions=%d renewTime=%s duration=%s",
		e.Class, e.Ours, e.Holder, e.Ours == e.Holder, e.Transitions, renew, e.Duration)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}

	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Lease is a held run Lease.
type Lease struct {
	kube      kubernetes.Interface
	namespace string
	name      string
	holder    string
	duration  time.Duration
	heartbeat time.Duration
	logf      func(format string, args ...any)
	clock     clock.Clock

	mu        sync.Mutex
	lastRenew time.Time
	lost      error
	apiDown   bool
	lostCh    chan struct{} // closed when the Lease is lost for good

	cancel context.CancelFunc
	done   chan struct{}
}

// Done is closed when the Lease is lost for good (another holder took it, or it was deleted):
// mutations in flight should stop.
func (l *Lease) Done() <-chan struct{} { return l.lostCh }

func (l *Lease) setLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if l.lost == nil {
		l.lost = err
		close(l.lostCh)
	}
}

// Options configure Acquire.
type Options struct {
	Namespace, Name     string
	Holder              string
	Duration, Heartbeat time.Duration
	Logf                func(format string, args ...any)
	Clock               clock.Clock // nil: clock.System
}

// Acquire takes the Lease if it is absent, has no holder, or is already ours. A Lease held by
// anyone else is refused, whether or not it has expired.
func Acquire(ctx context.Context, kube kubernetes.Interface, o Options) (*Lease, error) {
	l := &Lease{
		kube: kube, namespace: o.Namespace, name: o.Name, holder: o.Holder,
		duration: o.Duration, heartbeat: o.Heartbeat, logf: o.Logf, clock: clock.Or(o.Clock), lostCh: make(chan struct{}),
	}
	if l.logf == nil {
		l.logf = func(string, ...any) {}
	}

	for attempt := 0; attempt < 5; attempt++ {
		taken, err := l.take(ctx, o)
		if err != nil {
			return nil, err
		}

		if taken {
			return l, nil
		}
	}

	return nil, fmt.Errorf("acquire lease %s/%s: it kept changing under us; try again", o.Namespace, o.Name)
}

// take is one attempt at the Lease: create it, or take it when it has no holder or is ours.
// taken is false when the attempt must be made again from a fresh read (taken meanwhile, a
// conflict, or a lost answer: the next read tells, and ours is adopted as ours).
func (l *Lease) take(ctx context.Context, o Options) (taken bool, err error) {
	leases := l.kube.CoordinationV1().Leases(o.Namespace)
	now := metav1.NewMicroTime(l.clock.Now())

	cur, err := leases.Get(ctx, o.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(o.Holder), LeaseDurationSeconds: ptr.To(int32(o.Duration.Seconds())),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To(int32(0)),
			},
		}, metav1.CreateOptions{})

		switch {
		case apierrors.IsAlreadyExists(err) || answer.Lost(err):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("create lease %s/%s: %w", o.Namespace, o.Name, err)
		}

		l.lastRenew = now.Time

		return true, nil
	}

	if err != nil {
		return false, fmt.Errorf("read lease %s/%s: %w", o.Namespace, o.Name, err)
	}

	holder := ptr.Deref(cur.Spec.HolderIdentity, "")
	if holder != "" && holder != o.Holder {
		return false, l.errorFrom(HeldByAnother, cur, errors.New("ghcrsync never takes over a held Lease, even an expired one; inspect it with `ghcrsync fences`"))
	}

	if holder == "" {
		cur.Spec.LeaseTransitions = ptr.To(ptr.Deref(cur.Spec.LeaseTransitions, 0) + 1)
		cur.Spec.AcquireTime = &now
	}

	cur.Spec.HolderIdentity = ptr.To(o.Holder)
	cur.Spec.RenewTime = &now
	cur.Spec.LeaseDurationSeconds = ptr.To(int32(o.Duration.Seconds()))

	_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})

	switch {
	case apierrors.IsConflict(err) || answer.Lost(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("acquire lease %s/%s: %w", o.Namespace, o.Name, err)
	}

	l.lastRenew = now.Time

	return true, nil
}

func (l *Lease) errorFrom(class string, cur *coordinationv1.Lease, err error) *Error {
	e := &Error{Class: class, Ours: l.holder, Duration: l.duration, Err: err}
	if cur != nil {
		e.Holder = ptr.Deref(cur.Spec.HolderIdentity, "")
		e.Transitions = ptr.Deref(cur.Spec.LeaseTransitions, 0)

		if cur.Spec.RenewTime != nil {
			t := cur.Spec.RenewTime.Time
			e.RenewTime, e.Seen = &t, l.clock.Now()
		}

		if cur.Spec.LeaseDurationSeconds != nil {
			e.Duration = time.Duration(*cur.Spec.LeaseDurationSeconds) * time.Second
		}
	}

	return e
}

// Holder is our identity.
func (l *Lease) Holder() string { return l.holder }

// Start begins renewing in the background, each renewal scheduled from the last successful
// one (so API latency does not drift the schedule).
func (l *Lease) Start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	l.cancel, l.done = cancel, make(chan struct{})

	go func() {
		defer close(l.done)

		for {
			l.mu.Lock()
			next := l.lastRenew.Add(l.heartbeat)
			if l.apiDown {
				next = l.clock.Now().Add(min(l.heartbeat, time.Second)) // retry an outage promptly
			}
			l.mu.Unlock()

			if clock.Sleep(ctx, l.clock, next.Sub(l.clock.Now())) != nil {
				return
			}

			if err := l.renew(ctx); err != nil {
				var le *Error
				if errors.As(err, &le) && le.Class == HeldByAnother {
					l.setLost(err)
					l.logf("%v", err)

					return
				}
			}
		}
	}()
}

// renew renews once: a compare-and-swap that requires the Lease to still name us. An unreachable
// API is retried for as long as it takes: past the Lease's duration it counts as expired (no
// mutation starts), and once the API is back a Lease that still names us is renewed and live
// again — nobody else may take it over on expiry, so it is still ours. Only another holder (or
// its deletion) loses it for good.
func (l *Lease) renew(ctx context.Context) error {
	leases := l.kube.CoordinationV1().Leases(l.namespace)

	// A renewal that hangs must not outlast the margin: it is cut off and tried again, long
	// before the Lease could expire under it.
	ctx, cancel := l.clock.WithTimeout(ctx, l.margin()/2)
	defer cancel()

	cur, err := leases.Get(ctx, l.name, metav1.GetOptions{})
	if e := l.notOurs(cur, err); e != nil {
		return e
	}

	if err == nil {
		now := metav1.NewMicroTime(l.clock.Now())
		cur.Spec.RenewTime = &now

		if _, err = leases.Update(ctx, cur, metav1.UpdateOptions{}); err == nil {
			l.mu.Lock()
			if l.apiDown {
				l.logf("lease %s/%s: the API is back and the Lease still names us; renewed (outage %s)",
					l.namespace, l.name, clock.Since(l.clock, l.lastRenew).Round(time.Second))
			}
			l.lastRenew, l.apiDown = now.Time, false
			l.mu.Unlock()

			return nil
		}
	}

	if ctx.Err() != nil {
		return nil // cancelled by Stop: not a failure
	}

	if apierrors.IsConflict(err) {
		return nil // a write in between: the next renewal re-reads
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	if !l.apiDown {
		l.logf("lease %s/%s: renewal failed (%s); no mutation starts once it would expire at %s, and it is renewed as soon as the API answers and the Lease still names this run: %v",
			l.namespace, l.name, APIUnreachable, l.lastRenew.Add(l.duration).UTC().Format(time.RFC3339), err)
	}

	l.apiDown = true

	return &Error{Class: APIUnreachable, Ours: l.holder, Duration: l.duration, Err: err}
}

// notOurs is the Lease, as read (cur, err), lost for good: deleted, or naming another holder;
// nil while it may still be ours (read and ours, or not read at all).
func (l *Lease) notOurs(cur *coordinationv1.Lease, err error) *Error {
	switch {
	case apierrors.IsNotFound(err):
		return l.errorFrom(HeldByAnother, nil, errors.New("the Lease was deleted"))
	case err == nil && ptr.Deref(cur.Spec.HolderIdentity, "") != l.holder:
		return l.errorFrom(HeldByAnother, cur, nil)
	}

	return nil
}

// margin is how close to expiry ghcrsync stops starting mutations.
func (l *Lease) margin() time.Duration { return l.duration / 5 }

// Assert reports an error unless the Lease is held and live: call it before every mutation.
func (l *Lease) Assert() error {
	l.mu.Lock()
	defer l.mu.Unlock()

	if l.lost != nil {
		return l.lost
	}

	if age := clock.Since(l.clock, l.lastRenew); age > l.duration-l.margin() {
		return &Error{Class: Expired, Ours: l.holder, Holder: l.holder, Duration: l.duration,
			Err: fmt.Errorf("last renewed %s ago: not starting a mutation so close to expiry", age.Round(time.Second))}
	}

	return nil
}

// Verify asserts the Lease (Assert), then reads it: it must still name this run. It is for the
// writes the heartbeat's last look cannot vouch for (a pull secret, the root Flux secret, a node
// template): a Lease taken or deleted since the last renewal is seen now, and lost for good.
// An API that does not answer is tried three times, then refuses the write.
func (l *Lease) Verify(ctx context.Context) error {
	if err := l.Assert(); err != nil {
		return err
	}

	var err error

	for attempt := range 3 {
		var cur *coordinationv1.Lease

		cur, err = l.kube.CoordinationV1().Leases(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
		if e := l.notOurs(cur, err); e != nil {
			l.setLost(e)

			return e
		}

		if err == nil {
			return nil
		}

		if err := clock.Sleep(ctx, l.clock, time.Duration(attempt+1)*200*time.Millisecond); err != nil {
			return err
		}
	}

	return &Error{Class: APIUnreachable, Ours: l.holder, Duration: l.duration, Err: fmt.Errorf("the Lease could not be read to verify it before a write: %w", err)}
}

// WaitLive waits (bounded by ctx) until the Lease is live again, e.g. after an API outage.
// It returns at once if the Lease was lost.
func (l *Lease) WaitLive(ctx context.Context) error {
	for {
		l.mu.Lock()
		lost := l.lost
		l.mu.Unlock()

		if lost != nil {
			return lost
		}

		if l.Assert() == nil {
			return nil
		}

		if clock.Sleep(ctx, l.clock, 200*time.Millisecond) != nil {
			return l.Assert()
		}
	}
}

// Stop stops the heartbeat and waits until no renewal is in flight.
func (l *Lease) Stop() {
	if l.cancel != nil {
		l.cancel()
		<-l.done
		l.cancel = nil
	}
}

// Release stops the heartbeat, then clears the holder (ReleaseHolder).
func (l *Lease) Release(ctx context.Context) error {
	l.Stop()

	return ReleaseHolder(ctx, l.clock, l.kube, l.namespace, l.name, l.holder)
}

// ReleaseHolder clears the Lease's holder if, and only if, it is holder: a JSON-patch test of the
// holder alone (no resourceVersion, so no other write — a heartbeat included — can make it fail),
// re-reading on failure. An already-free Lease counts as released (a release whose answer was
// lost, retried); an absent one is a Deleted error: nothing is held, and the caller says so.
func ReleaseHolder(ctx context.Context, clk clock.Clock, kube kubernetes.Interface, namespace, name, holder string) error {
	leases := kube.CoordinationV1().Leases(namespace)
	patch, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": "/spec/holderIdentity", "value": holder},
		{"op": "replace", "path": "/spec/holderIdentity", "value": ""},
	})
	deleted := &Error{Class: Deleted, Ours: holder, Err: fmt.Errorf("lease %s/%s was deleted outside ghcrsync before %s released it: "+
		"nothing is held, but while it was absent another run could have acquired it; check `ghcrsync fences` for fences of other runs", namespace, name, holder)}

	var lastErr error

	for attempt := 0; attempt < 5; attempt++ {
		_, err := leases.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})

		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err):
			return deleted
		}

		lastErr = err

		cur, gerr := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return deleted
		}

		if gerr == nil {
			switch h := ptr.Deref(cur.Spec.HolderIdentity, ""); {
			case h == "":
				return nil
			case h != holder:
				e := &Error{Class: HeldByAnother, Ours: holder, Holder: h, Transitions: ptr.Deref(cur.Spec.LeaseTransitions, 0),
					Err: errors.New("the Lease was taken by another holder before it was released")}
				if cur.Spec.RenewTime != nil {
					t := cur.Spec.RenewTime.Time
					e.RenewTime, e.Seen = &t, clk.Now()
				}

				return e
			}
		}

		if err := clock.Sleep(ctx, clk, time.Duration(attempt+1)*200*time.Millisecond); err != nil {
			return err
		}
	}

	return fmt.Errorf("release lease %s/%s as %s: %w (release it with `ghcrsync release`)", namespace, name, holder, lastErr)
}
