package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

// The Lease's rules on client-go's fake clientset and the fake clock (time passes only by
// waiting): it is taken only when absent, free or ours; renewed while it names us; lost for
// good to another holder or a deletion; expired (no mutation starts) when renewals stop, and live
// again when one lands; released by its holder only. The sandbox's tests (apply/lease_test.go)
// race it against the real API server.

const ns, name = "ghcrsync-system", "ghcrsync-run"

var epoch = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func opts(holder string, clk clock.Clock) Options {
	return Options{Namespace: ns, Name: name, Holder: holder, Duration: time.Minute, Heartbeat: 15 * time.Second, Clock: clk}
}

func existing(holder string, renewed time.Time) *coordinationv1.Lease {
	t := metav1.NewMicroTime(renewed)

	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &t, LeaseDurationSeconds: ptr.To(int32(60)), LeaseTransitions: ptr.To(int32(3))}}
}

func read(t *testing.T, kube *fake.Clientset) *coordinationv1.Lease {
	t.Helper()

	l, err := kube.CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return l
}

func TestAcquire(t *testing.T) {
	for _, tc := range []struct {
		name        string
		objects     []runtime.Object
		refused     string // the error class; "" taken
		transitions int32
	}{
		{"absent: created", nil, "", 0},
		{"free: taken, one transition more", []runtime.Object{existing("", epoch.Add(-time.Hour))}, "", 4},
		{"ours: adopted (a lost answer retried)", []runtime.Object{existing("run-1", epoch)}, "", 3},
		{"held by another", []runtime.Object{existing("run-2", epoch)}, HeldByAnother, 3},
		{"held by another, expired long ago: never taken over", []runtime.Object{existing("run-2", epoch.Add(-24*time.Hour))}, HeldByAnother, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(tc.objects...)
			l, err := Acquire(context.Background(), kube, opts("run-1", clock.NewFake(epoch)))

			var le *Error

			switch {
			case tc.refused == "" && err != nil:
				t.Fatal(err)
			case tc.refused != "" && (!errors.As(err, &le) || le.Class != tc.refused || l != nil):
				t.Fatalf("acquired %v, error %v, want refused %s", l, err, tc.refused)
			}

			cur := read(t, kube)
			if want := map[bool]string{true: "run-2", false: "run-1"}[tc.refused != ""]; ptr.Deref(cur.Spec.HolderIdentity, "") != want ||
				ptr.Deref(cur.Spec.LeaseTransitions, 0) != tc.transitions {
				t.Fatalf("the Lease holder %q, transitions %d; want %s, %d", ptr.Deref(cur.Spec.HolderIdentity, ""), ptr.Deref(cur.Spec.LeaseTransitions, 0), want, tc.transitions)
			}

			if l != nil && l.Assert() != nil {
				t.Fatalf("a Lease just taken is not live: %v", l.Assert())
			}
		})
	}
}

// Renewal keeps it live; no renewal for longer than its duration less the margin expires it (no
// mutation starts), and the next renewal that lands makes it live again — nobody may take it
// over meanwhile, so it is still ours.
func TestRenewalAndExpiry(t *testing.T) {
	clk := clock.NewFake(epoch)
	kube := fake.NewClientset()
	ctx := context.Background()

	l, err := Acquire(ctx, kube, opts("run-1", clk))
	if err != nil {
		t.Fatal(err)
	}

	clk.Advance(15 * time.Second)

	if err := l.renew(ctx); err != nil || !read(t, kube).Spec.RenewTime.Time.Equal(clk.Now()) || l.Assert() != nil {
		t.Fatalf("renewal: %v, renewed %v, assert %v", err, read(t, kube).Spec.RenewTime, l.Assert())
	}

	// The API stops answering: renewals fail, the Lease expires for ghcrsync's own writes.
	down := errors.New("connection refused")
	kube.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, down })

	clk.Advance(time.Minute)

	var le *Error
	if err := l.renew(ctx); !errors.As(err, &le) || le.Class != APIUnreachable {
		t.Fatalf("a renewal the API does not answer: %v", err)
	}

	if err := l.Assert(); !errors.As(err, &le) || le.Class != Expired {
		t.Fatalf("unrenewed past its duration less the margin, the Lease asserts %v, want expired", err)
	}

	// The API is back: the Lease still names us, so it is renewed and live again.
	kube.ReactionChain = kube.ReactionChain[1:]

	if err := l.renew(ctx); err != nil || l.Assert() != nil {
		t.Fatalf("after the outage: renew %v, assert %v", err, l.Assert())
	}
}

// Another holder or a deletion loses it for good: the heartbeat stops, Done closes, and every
// later assertion refuses.
func TestLostForGood(t *testing.T) {
	for _, tc := range []struct {
		name string
		take func(kube *fake.Clientset)
	}{
		{"another holder", func(kube *fake.Clientset) {
			cur, _ := kube.CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
			cur.Spec.HolderIdentity = ptr.To("run-2")
			_, _ = kube.CoordinationV1().Leases(ns).Update(context.Background(), cur, metav1.UpdateOptions{})
		}},
		{"deleted", func(kube *fake.Clientset) {
			_ = kube.CoordinationV1().Leases(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(epoch)
			kube := fake.NewClientset()

			l, err := Acquire(context.Background(), kube, opts("run-1", clk))
			if err != nil {
				t.Fatal(err)
			}

			tc.take(kube)
			l.Start(context.Background())
			defer l.Stop()

			select {
			case <-l.Done():
			case <-time.After(30 * time.Second): // a hang detector, not a timing assertion
				t.Fatal("the heartbeat did not see the Lease lost")
			}

			var le *Error
			if err := l.Assert(); !errors.As(err, &le) || le.Class != HeldByAnother {
				t.Fatalf("a lost Lease asserts %v", err)
			}
		})
	}
}

// Release clears the holder only if it is still ours: a Lease another run took is left as it is,
// an already-free one counts as released, a deleted one says so.
func TestReleaseByHolderOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		class   string // the error's class; "" released
		holder  string // the holder left
	}{
		{"ours", []runtime.Object{existing("run-1", epoch)}, "", ""},
		{"another's", []runtime.Object{existing("run-2", epoch)}, HeldByAnother, "run-2"},
		{"already free", []runtime.Object{existing("", epoch)}, "", ""},
		{"deleted", nil, Deleted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(tc.objects...)
			err := ReleaseHolder(context.Background(), clock.NewFake(epoch), kube, ns, name, "run-1")

			var le *Error

			switch {
			case tc.class == "" && err != nil:
				t.Fatal(err)
			case tc.class != "" && (!errors.As(err, &le) || le.Class != tc.class):
				t.Fatalf("release: %v, want %s", err, tc.class)
			}

			if len(tc.objects) == 0 {
				return
			}

			if h := ptr.Deref(read(t, kube).Spec.HolderIdentity, ""); h != tc.holder {
				t.Fatalf("holder after release %q, want %q", h, tc.holder)
			}
		})
	}
}

// A heartbeat between the read and the release's write does not fail it: the release tests the
// holder alone, not the resourceVersion (the predecessor's release lost this race).
func TestReleaseSurvivesAHeartbeat(t *testing.T) {
	kube := fake.NewClientset(existing("run-1", epoch))
	beat := true

	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")

	// The heartbeat lands through the object tracker (the clientset is locked while a reactor runs).
	kube.PrependReactor("patch", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if beat {
			beat = false

			obj, err := kube.Tracker().Get(gvr, ns, name)
			if err != nil {
				return true, nil, err
			}

			cur := obj.(*coordinationv1.Lease).DeepCopy()
			cur.Spec.RenewTime = ptr.To(metav1.NewMicroTime(epoch.Add(time.Second)))
			cur.ResourceVersion = "99"

			if err := kube.Tracker().Update(gvr, cur, ns); err != nil {
				return true, nil, err
			}
		}

		return false, nil, nil
	})

	if err := ReleaseHolder(context.Background(), clock.NewFake(epoch), kube, ns, name, "run-1"); err != nil || ptr.Deref(read(t, kube).Spec.HolderIdentity, "x") != "" {
		t.Fatalf("release after a heartbeat: %v, holder %q", err, ptr.Deref(read(t, kube).Spec.HolderIdentity, "x"))
	}
}
