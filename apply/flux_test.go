package apply_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// kustomization reads the sandbox's Flux Kustomization.
func kustomization(t *testing.T, sb *sandbox.Sandbox) *unstructured.Unstructured {
	t.Helper()

	k, err := fluxClient(t, sb).Get(context.Background(), sandbox.Kustomization, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return k
}

func fluxClient(t *testing.T, sb *sandbox.Sandbox) dynamic.ResourceInterface {
	t.Helper()

	dyn, err := dynamic.NewForConfig(sb.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	return dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace)
}

func suspendedBy(k *unstructured.Unstructured) (bool, string) {
	s, _, _ := unstructured.NestedBool(k.Object, "spec", "suspend")

	return s, k.GetAnnotations()[object.SuspendedByAnnotation]
}

// setSuspend sets spec.suspend as a person would (kubectl patch, no annotation), retrying
// conflicts.
func setSuspend(t *testing.T, sb *sandbox.Sandbox, v bool) {
	t.Helper()

	sandboxtest.Eventually(t, 10*time.Second, "spec.suspend set", func() error {
		k := kustomization(t, sb)
		_ = unstructured.SetNestedField(k.Object, v, "spec", "suspend")
		_, err := fluxClient(t, sb).Update(context.Background(), k, metav1.UpdateOptions{})

		return err
	})
}

// The flux block suspends the sandbox's Kustomization for the run: the plan says so, it is
// suspended (with the run's annotation) while the nodes are rotated, and resumed, its record
// closed, before the Lease is released.
func TestFluxSuspendedForTheRun(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-1"

	r := newRotation(t, sb, nil, name)
	path := r.plan()

	if fp := r.planned.Flux; len(fp) != 1 || fp[0].Action != plan.FluxSuspend || fp[0].Ref() != "flux-system/"+sandbox.Kustomization {
		t.Fatalf("the plan's Flux actions: %+v", fp)
	}

	var (
		mu     sync.Mutex
		during []string
	)

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node != name || phase != state.PhaseClaimed {
			return
		}

		s, by := suspendedBy(kustomization(t, sb))
		mu.Lock()
		defer mu.Unlock()

		if s {
			during = append(during, by)
		}
	}})
	if err != nil || res.Failed() > 0 {
		t.Fatalf("apply: %v %+v", err, res)
	}

	if len(during) != 1 || during[0] != res.Holder {
		t.Fatalf("while the node was claimed the Kustomization was not suspended by the run %s: %v", res.Holder, during)
	}

	if s, by := suspendedBy(kustomization(t, sb)); s || by != "" {
		t.Fatalf("after the run the Kustomization is still suspended (%v) or annotated (%q)", s, by)
	}

	if len(res.Flux) != 1 || !res.Flux[0].Suspended || !res.Flux[0].Resumed {
		t.Fatalf("the run's Flux results: %+v", res.Flux)
	}

	if st := r.readState(); len(st.Suspended) != 0 {
		t.Fatalf("suspension records after the run: %+v", st.Suspended)
	}
}

// Negative control: a Kustomization a person suspended is planned "leave", stays suspended
// through the run and after it, and gets no ghcrsync annotation.
func TestFluxPersonsSuspensionLeftAlone(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-2"

	setSuspend(t, sb, true)
	t.Cleanup(func() { setSuspend(t, sb, false) })

	r := newRotation(t, sb, nil, name)
	path := r.plan()

	if fp := r.planned.Flux; len(fp) != 1 || fp[0].Action != plan.FluxLeave {
		t.Fatalf("a person's suspension is not planned as left alone: %+v", fp)
	}

	res, err := r.apply(path, apply.Hooks{})
	if err != nil || res.Failed() > 0 {
		t.Fatalf("apply: %v %+v", err, res)
	}

	if s, by := suspendedBy(kustomization(t, sb)); !s || by != "" {
		t.Fatalf("a person's suspension was touched: suspend=%v annotation=%q", s, by)
	}

	if len(res.Flux) != 1 || res.Flux[0].Suspended || res.Flux[0].Resumed {
		t.Fatalf("the run's Flux results: %+v", res.Flux)
	}
}

// raceStatus is kustomize-controller at the worst moment: before the first write of the
// Kustomization reaches the server it writes the Kustomization's status (so the write's
// resourceVersion is stale: a conflict), and the answer to the next write is lost after the
// server applied it.
type raceStatus struct {
	next      http.RoundTripper
	write     func() error
	writes    atomic.Int32
	conflicts atomic.Int32
	lost      atomic.Int32
}

func (r *raceStatus) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPatch || !strings.Contains(req.URL.Path, "/kustomizations/") {
		return r.next.RoundTrip(req)
	}

	n := r.writes.Add(1)
	if n == 1 {
		if err := r.write(); err != nil {
			return nil, err
		}
	}

	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}

	if resp.StatusCode == http.StatusConflict {
		r.conflicts.Add(1)
	}

	if n == 2 && resp.StatusCode == http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		r.lost.Add(1)

		return nil, io.ErrUnexpectedEOF
	}

	return resp, nil
}

// Suspend and Resume are compare-and-swaps that survive kustomize-controller's status write
// landing between their read and their write, and a lost answer to the write that landed: the
// status is kept, the suspension lands once and is the run's, and the resume lifts it. Negative
// control: another run's Resume lifts nothing.
func TestFluxSuspendRacesStatusWrites(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	client := fluxClient(t, sb)

	statusWrites := 0
	writeStatus := func() error {
		k, err := client.Get(ctx, sandbox.Kustomization, metav1.GetOptions{})
		if err != nil {
			return err
		}

		statusWrites++
		_ = unstructured.SetNestedField(k.Object, "race-"+time.Now().Format(time.RFC3339Nano), "status", "lastHandledReconcileAt")
		_, err = client.UpdateStatus(ctx, k, metav1.UpdateOptions{})

		return err
	}

	conn, err := cluster.Connect(sb.Path("kubeconfig"), "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	race := &raceStatus{write: writeStatus}
	if err := conn.Wrap(func(rt http.RoundTripper) http.RoundTripper { race.next = rt; return race }); err != nil {
		t.Fatal(err)
	}

	const holder = "race-run"

	ours, err := conn.Suspend(ctx, sandbox.RootNamespace, sandbox.Kustomization, holder, "")
	if err != nil || !ours {
		t.Fatalf("Suspend under a racing status write and a lost answer: ours=%v err=%v", ours, err)
	}

	if race.conflicts.Load() != 1 || race.lost.Load() != 1 || statusWrites != 1 {
		t.Fatalf("the race did not happen as staged: %d conflicts, %d lost answers, %d status writes", race.conflicts.Load(), race.lost.Load(), statusWrites)
	}

	k := kustomization(t, sb)
	if s, by := suspendedBy(k); !s || by != holder {
		t.Fatalf("after Suspend: suspend=%v by=%q", s, by)
	}

	if v, _, _ := unstructured.NestedString(k.Object, "status", "lastHandledReconcileAt"); !strings.HasPrefix(v, "race-") {
		t.Fatalf("the controller's status write was lost: %q", v)
	}

	// Negative control: another run's Resume finds no suspension of its own and lifts nothing.
	if gone, err := conn.Resume(ctx, sandbox.RootNamespace, sandbox.Kustomization, "another-run"); err != nil || !gone {
		t.Fatalf("another run's Resume: gone=%v err=%v", gone, err)
	}

	if s, _ := suspendedBy(kustomization(t, sb)); !s {
		t.Fatal("another run's Resume lifted this run's suspension")
	}

	if gone, err := conn.Resume(ctx, sandbox.RootNamespace, sandbox.Kustomization, holder); err != nil || gone {
		t.Fatalf("Resume: gone=%v err=%v", gone, err)
	}

	if s, by := suspendedBy(kustomization(t, sb)); s || by != "" {
		t.Fatalf("after Resume: suspend=%v by=%q", s, by)
	}
}
