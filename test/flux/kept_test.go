package flux

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

const requestedAt = "reconcile.fluxcd.io/requestedAt"

// resumeAsFlux lifts a suspension as `flux resume` does: spec.suspend false and a reconcile
// request, nothing else (the run's annotation stays).
func resumeAsFlux(ctx context.Context, dyn dynamic.Interface, name string) error {
	patch := fmt.Sprintf(`{"spec":{"suspend":false},"metadata":{"annotations":{%q:%q}}}`, requestedAt, time.Now().UTC().Format(time.RFC3339Nano))
	_, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})

	return err
}

// runSuspension is a Kustomization as a run's suspension sees it: suspended by a run, and
// whether kustomize-controller has taken that suspension (it answered the request written with it).
func runSuspension(k *unstructured.Unstructured) (byRun, taken bool) {
	suspended, _, _ := unstructured.NestedBool(k.Object, "spec", "suspend")
	handled, _, _ := unstructured.NestedString(k.Object, "status", "lastHandledReconcileAt")
	ann := k.GetAnnotations()

	return suspended && ann[object.SuspendedByAnnotation] != "", handled != "" && handled == ann[requestedAt]
}

// lifter resumes the Kustomization name as `flux resume` does whenever a run holds it suspended
// (once kustomize-controller has taken it, when afterTaken), at most times times, until ctx ends.
// It counts its lifts.
type lifter struct {
	mu    sync.Mutex
	lifts []time.Time
}

func (l *lifter) run(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string, times int, afterTaken bool) {
	for ctx.Err() == nil && l.count() < times {
		k, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if byRun, taken := runSuspension(k); byRun && (taken || !afterTaken) {
				if err := resumeAsFlux(ctx, dyn, name); err == nil {
					l.mu.Lock()
					l.lifts = append(l.lifts, time.Now())
					l.mu.Unlock()
					t.Logf("someone lifts the run's suspension of %s (flux resume)", name)
				}
			}
		}

		time.Sleep(20 * time.Millisecond)
	}
}

func (l *lifter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()

	return len(l.lifts)
}

// rootWritten polls the root secret until it holds user's credential and returns when it saw
// that (zero if ctx ended first).
func rootWritten(ctx context.Context, sb *sandbox.Sandbox, user string) <-chan time.Time {
	seen := make(chan time.Time, 1)

	go func() {
		defer close(seen)

		for ctx.Err() == nil {
			s, err := sb.Kube().CoreV1().Secrets(sandbox.RootNamespace).Get(ctx, sandbox.RootSecret, metav1.GetOptions{})
			if err == nil && bytes.Contains(s.Data[".dockerconfigjson"], []byte(`"`+user+`"`)) {
				seen <- time.Now()

				return
			}

			time.Sleep(50 * time.Millisecond)
		}
	}()

	return seen
}

// applyFlux is apply's --json result's Flux entries.
type applyFlux struct {
	Kustomization string `json:"kustomization"`
	Reclaimed     int    `json:"reclaimed"`
	Lost          bool   `json:"lost"`
	Message       string `json:"message"`
}

func fluxOf(t *testing.T, out string) map[string]applyFlux {
	t.Helper()

	got := map[string]applyFlux{}

	for _, line := range strings.Split(out, "\n") {
		var r struct {
			Flux []applyFlux `json:"flux"`
		}

		if json.Unmarshal([]byte(line), &r) == nil {
			for _, f := range r.Flux {
				got[f.Kustomization] = f
			}
		}
	}

	return got
}

// M1/M3: someone resumes the run's suspension mid-run (`flux resume` of the slow Kustomization,
// whose every reconcile stays in flight 20 s): the run notices before its next write of what Git
// holds, suspends it again, and waits until kustomize-controller has taken that — the reconcile
// the resume began has ended — before it writes the root. The negative control: someone who
// keeps resuming it; the run claims it again up to its cap, then stops: the root is not written,
// and the run names the Kustomization it could not keep (exit 5). (On the code before this
// test, the resume went unnoticed: the root was written within seconds, during the reconcile.)
func TestSuspensionLiftedMidRunIsClaimedAgain(t *testing.T) {
	sb := sandboxtest.Get(t)
	dyn := sandboxtest.DynamicFrom(t, sb.Path("kubeconfig"))
	ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)
	slowSource(t, sb, dyn)

	cfg := slowConfig(t, sb, func(s string) string { return s })
	slow := sandbox.RootNamespace + "/" + slowKustomization

	// The run suspends it: no one else's suspension on it (the run's resume at the end of each
	// subtest leaves it so); afterwards it is a person's suspension again, as slowSource makes it.
	if err := resumeAsFlux(context.Background(), dyn, slowKustomization); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { suspendedAgain(t, dyn) })

	t.Run("resumed once: suspended again, and the root written after the reconcile it began", func(t *testing.T) {
		cred, err := sb.RotateSecret("flux-lifted")
		if err != nil {
			t.Fatal(err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()

		var l lifter
		go l.run(ctx, t, dyn, slowKustomization, 1, true)
		root := rootWritten(ctx, sb, cred.Username)

		code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)
		if code != 0 || l.count() != 1 {
			t.Fatalf("apply exited %d after %d lift(s), want 0 after 1:\n%s\n%s", code, l.count(), stdout, stderr)
		}

		written := <-root
		lifted := l.lifts[0]

		// The reconcile the resume began stays in flight slowFor; the root is written only once
		// kustomize-controller took the suspension again, after it ended.
		if written.Before(lifted.Add(slowFor - 2*time.Second)) {
			t.Errorf("the root was written at %s, %s after someone resumed %s: before the reconcile that began (%s in flight) could end",
				written.Format(time.StampMilli), written.Sub(lifted).Round(time.Millisecond), slow, slowFor)
		}

		if f := fluxOf(t, stdout)[slow]; f.Reclaimed != 1 || f.Lost {
			t.Errorf("apply's result for %s: %+v, want suspended again once and kept", slow, f)
		}
	})

	t.Run("control: resumed again and again, the run stops before the root", func(t *testing.T) {
		cred, err := sb.RotateSecret("flux-fought")
		if err != nil {
			t.Fatal(err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()

		var l lifter
		go l.run(ctx, t, dyn, slowKustomization, 100, false)
		root := rootWritten(ctx, sb, cred.Username)

		code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)
		cancel()

		if code != 5 {
			t.Fatalf("apply exited %d, want 5 (the suspension not kept):\n%s\n%s", code, stdout, stderr)
		}

		if at, ok := <-root; ok {
			t.Errorf("the root was written (%s) though the run could not keep %s suspended", at.Format(time.StampMilli), slow)
		}

		if f := fluxOf(t, stdout)[slow]; !f.Lost || !strings.Contains(f.Message, "NOT KEPT SUSPENDED") {
			t.Errorf("apply's result for %s: %+v, want not kept, named", slow, f)
		}
	})
}

// suspendedAgain puts the slow Kustomization back as slowSource makes it (a person's suspension),
// and waits until no reconcile of it is in flight.
func suspendedAgain(t *testing.T, dyn dynamic.Interface) {
	t.Helper()

	patch := fmt.Sprintf(`{"spec":{"suspend":true},"metadata":{"annotations":{%q:null}}}`, object.SuspendedByAnnotation)
	if _, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Patch(context.Background(), slowKustomization, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, slowFor+30*time.Second, "no reconcile of the slow Kustomization in flight", func() error {
		k, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Get(context.Background(), slowKustomization, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if s, r, _ := condition(k, "Ready"); s == "Unknown" && r == "Progressing" {
			return fmt.Errorf("Ready=%q (%s)", s, r)
		}

		return nil
	})
}

// A run killed (SIGKILL) while it holds the root Kustomization suspended leaves it suspended,
// recorded in its state; `ghcrsync release` resumes it, and kustomize-controller applies Git
// again (Ready for its generation). The negative control: a person's suspension of another
// Kustomization (no run's annotation) is left as it is.
func TestReleaseResumesTheSuspensionOfAKilledRun(t *testing.T) {
	sb := sandboxtest.Get(t)
	dyn := sandboxtest.DynamicFrom(t, sb.Path("kubeconfig"))
	ready(t, dyn, sandbox.KustomizationGVR, sandbox.Kustomization, 2*time.Minute)
	slowSource(t, sb, dyn)
	suspendedAgain(t, dyn) // a person's suspension: the control

	if _, err := sb.RotateSecret("flux-killed"); err != nil {
		t.Fatal(err)
	}

	cfg := slowConfig(t, sb, func(s string) string { return s })

	get := func(name string) *unstructured.Unstructured {
		k, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}

		return k
	}

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
	sandboxtest.KillWhen(t, cmd, "Flux Kustomization suspended for the run")

	if byRun, _ := runSuspension(get(sandbox.Kustomization)); !byRun {
		t.Fatalf("the killed run left %s not suspended: the test proves nothing", sandbox.Kustomization)
	}

	if code, stdout, stderr := sandboxtest.Run(t, sb, "release", "--config", cfg); code != 0 {
		t.Fatalf("release after the kill: exit %d\n%s\n%s", code, stdout, stderr)
	}

	k := get(sandbox.Kustomization)
	if suspended, _, _ := unstructured.NestedBool(k.Object, "spec", "suspend"); suspended || k.GetAnnotations()[object.SuspendedByAnnotation] != "" {
		t.Fatalf("release left %s suspended (suspend=%v, %s=%q)", sandbox.Kustomization, suspended, object.SuspendedByAnnotation, k.GetAnnotations()[object.SuspendedByAnnotation])
	}

	ready(t, dyn, sandbox.KustomizationGVR, sandbox.Kustomization, 2*time.Minute)

	if suspended, _, _ := unstructured.NestedBool(get(slowKustomization).Object, "spec", "suspend"); !suspended {
		t.Errorf("release resumed %s, a person's suspension", slowKustomization)
	}
}
