// Package flux tests the sandbox's real Flux (`--flux real`, issue 59): Flux's own
// source-controller pulls the cluster's root artifact from the private registry with the root
// secret ghcrsync writes (flux-system/ghcr-auth), and kustomize-controller applies it — and, the
// negative control, a root secret the registry refuses leaves the root source not Ready, naming
// the refusal, until a good one is back.
package flux

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 1, Autoscaled: 0, AutoscalerPaused: true, NoWorkloads: true,
		Heartbeat: time.Second, Seed: 59, Flux: sandbox.FluxReal, TalosVersion: "1.14"})
}

// condition is the object's status condition of type typ: its status, reason and message.
func condition(obj *unstructured.Unstructured, typ string) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			msg, _ := m["message"].(string)

			return s, r, msg
		}
	}

	return "", "", ""
}

// ready waits until the object is Ready=True (its last observation being of its generation), and
// returns it.
func ready(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, name string, within time.Duration) *unstructured.Unstructured {
	t.Helper()

	var obj *unstructured.Unstructured

	sandboxtest.Eventually(t, within, gvr.Resource+"/"+name+" Ready", func() error {
		var err error
		if obj, err = dyn.Resource(gvr).Namespace(sandbox.RootNamespace).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}

		if s, r, m := condition(obj, "Ready"); s != "True" {
			return fmt.Errorf("Ready=%q (%s): %s", s, r, m)
		}

		// Ready is written a moment before the rest of the status: the observation is whole once
		// it is of the object's generation.
		gen, _, _ := unstructured.NestedInt64(obj.Object, "metadata", "generation")
		if observed, _, _ := unstructured.NestedInt64(obj.Object, "status", "observedGeneration"); observed != gen {
			return fmt.Errorf("the status observes generation %d, not %d", observed, gen)
		}

		return nil
	})

	return obj
}

// reconcileNow asks Flux to reconcile the object now, as `flux reconcile` does.
func reconcileNow(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, name string) string {
	t.Helper()

	at := time.Now().UTC().Format(time.RFC3339Nano)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, at)

	if _, err := dyn.Resource(gvr).Namespace(sandbox.RootNamespace).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	return at
}

// setRootSecret writes the root secret's credential.
func setRootSecret(t *testing.T, sb *sandbox.Sandbox, cred sandbox.Credential) {
	t.Helper()

	ctx := context.Background()

	s, err := sb.Kube().CoreV1().Secrets(sandbox.RootNamespace).Get(ctx, sandbox.RootSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	s.Data[corev1.DockerConfigJsonKey] = sandbox.DockerConfigJSON(cred)

	if _, err := sb.Kube().CoreV1().Secrets(sandbox.RootNamespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The root, pulled and applied by Flux itself: source-controller pulls the private root artifact
// with the root secret (the registry served its manifest to that credential's user), and
// kustomize-controller applies what it holds (the ConfigMap exists, written by it).
func TestRealFluxPullsTheRootWithTheRootSecret(t *testing.T) {
	sb := sandboxtest.Get(t)
	dyn := sandboxtest.DynamicFrom(t, sb.Path("kubeconfig"))

	repo := ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)

	if digest, _, _ := unstructured.NestedString(repo.Object, "status", "artifact", "digest"); digest == "" {
		t.Fatalf("the root OCIRepository is Ready with no artifact: %v", repo.Object["status"])
	}

	ready(t, dyn, sandbox.KustomizationGVR, sandbox.Kustomization, 2*time.Minute)

	cm, err := sb.Kube().CoreV1().ConfigMaps("apps").Get(context.Background(), sandbox.FluxRootConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kustomize-controller did not apply the root's ConfigMap: %v", err)
	}

	if want := registry.RegistryHost + "/" + sandbox.FluxRootArtifact; cm.Data["source"] != want {
		t.Errorf("the ConfigMap holds %q, want %q (the artifact's)", cm.Data["source"], want)
	}

	user := sb.OldCredential().Username
	if !sb.Registry().ServedManifest(user, "") {
		t.Errorf("the registry served no manifest to the root secret's user %s: %v", user, sb.Registry().AccessLog())
	}
}

// The negative control: a root secret the registry refuses. source-controller cannot pull; the root
// source is not Ready and says why, until the good credential is back.
func TestRealFluxRefusesAWrongRootSecret(t *testing.T) {
	sb := sandboxtest.Get(t)
	dyn := sandboxtest.DynamicFrom(t, sb.Path("kubeconfig"))
	good := sb.OldCredential()

	ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)

	setRootSecret(t, sb, sandbox.Credential{Username: good.Username, Password: "not-" + good.Password})
	t.Cleanup(func() {
		setRootSecret(t, sb, good)
		reconcileNow(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository)
		ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)
	})

	at := reconcileNow(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository)

	sandboxtest.Eventually(t, 2*time.Minute, "the root source refuses the wrong credential", func() error {
		repo, err := dyn.Resource(sandbox.OCIRepositoryGVR).Namespace(sandbox.RootNamespace).Get(context.Background(), sandbox.OCIRepository, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if handled, _, _ := unstructured.NestedString(repo.Object, "status", "lastHandledReconcileAt"); handled != at {
			return fmt.Errorf("the request of %s is not handled yet (last %q)", at, handled)
		}

		s, r, m := condition(repo, "Ready")
		if s != "False" {
			return fmt.Errorf("Ready=%q (%s): %s", s, r, m)
		}

		if !strings.Contains(strings.ToLower(m), "unauthorized") && !strings.Contains(m, "401") {
			return errors.New("not Ready, but not for the credential: " + m)
		}

		return nil
	})
}

// rootRepository is the root artifact's repository (org/name).
var rootRepository, _, _ = strings.Cut(sandbox.FluxRootArtifact, ":")

// apply rotates to a fresh credential (user) with apply --auto-approve --json and returns its
// exit code and output.
func apply(t *testing.T, sb *sandbox.Sandbox) (int, string) {
	t.Helper()

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string { return s })
	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)

	return code, stdout + stderr
}

// apply proves the root by Flux itself: after writing the root secret it asks source-controller to
// reconcile and waits for it to pull the root artifact with the new credential — the registry
// served the artifact's manifest to the new credential's user — before it says safe to revoke.
func TestApplyProvesTheRootByFlux(t *testing.T) {
	sb := sandboxtest.Get(t)
	ready(t, sandboxtest.DynamicFrom(t, sb.Path("kubeconfig")), sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)

	cred, err := sb.RotateSecret("flux-proved")
	if err != nil {
		t.Fatal(err)
	}

	code, out := apply(t, sb)
	if code != 0 {
		t.Fatalf("apply exited %d, want 0 (safe to revoke):\n%s", code, out)
	}

	if !strings.Contains(out, "pulled it with the new credential") {
		t.Errorf("apply did not say Flux pulled the root with the new credential:\n%s", out)
	}

	if !slices.ContainsFunc(sb.Registry().AccessLog(), func(a registry.Access) bool {
		return a.User == cred.Username && a.What == "manifest" && a.Status == 200 && strings.Contains(a.Path, "/"+rootRepository+"/manifests/")
	}) {
		t.Errorf("the registry served the root artifact's manifest to no request of the new credential's user %s", cred.Username)
	}
}

// The negative control: a new credential the registry refuses the root artifact (a package not
// granted to it). The credential's own proof passes (its probe image is granted), the root secret
// is written, and Flux cannot pull with it: apply names that in its verdict and does not say safe
// to revoke (exit 5).
func TestApplyNamesARootFluxCannotPull(t *testing.T) {
	sb := sandboxtest.Get(t)
	dyn := sandboxtest.DynamicFrom(t, sb.Path("kubeconfig"))
	ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)

	cred, err := sb.RotateSecret("flux-denied")
	if err != nil {
		t.Fatal(err)
	}

	sb.Registry().DenyRepository(cred.Username, rootRepository)
	t.Cleanup(func() {
		sb.Registry().AllowRepository(cred.Username, rootRepository)
		reconcileNow(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository)
		ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)
	})

	code, out := apply(t, sb)
	if code != 5 {
		t.Fatalf("apply exited %d, want 5 (not safe to revoke):\n%s", code, out)
	}

	if !strings.Contains(out, "Flux could not pull with the new root credential") {
		t.Errorf("apply's verdict does not name the root Flux could not pull:\n%s", out)
	}
}

// slowKustomization is a Kustomization whose every reconcile stays in flight slowFor: it applies
// a Deployment no node can run and waits for it to be ready (spec.wait), until its timeout.
const (
	slowKustomization = "slow"
	slowFor           = 20 * time.Second
)

// slowSource installs the slow Kustomization's source (an artifact holding that Deployment) and
// the Kustomization, suspended, unless an earlier test did; inFlight starts its reconciles.
func slowSource(t *testing.T, sb *sandbox.Sandbox, dyn dynamic.Interface) {
	t.Helper()

	ctx := context.Background()
	deploy := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: flux-slow
  namespace: apps
spec:
  replicas: 1
  selector:
    matchLabels: {app: flux-slow}
  template:
    metadata:
      labels: {app: flux-slow}
    spec:
      nodeSelector: {flux.test/nowhere: "true"}
      containers:
        - name: app
          image: ` + registry.RegistryHost + "/" + registry.PublicImage + "\n"

	if _, err := sb.Registry().PushFluxArtifact(registry.PrivateOrg+"/slow:v1", "https://github.com/ghcrsync/slow", registry.FluxArtifact{"deploy.yaml": deploy}); err != nil {
		t.Fatal(err)
	}

	objects := []struct {
		gvr schema.GroupVersionResource
		obj map[string]any
	}{
		{sandbox.OCIRepositoryGVR, map[string]any{
			"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
			"metadata": map[string]any{"name": slowKustomization, "namespace": sandbox.RootNamespace},
			"spec": map[string]any{"url": "oci://" + registry.RegistryHost + "/" + registry.PrivateOrg + "/slow", "ref": map[string]any{"tag": "v1"},
				"interval": "10m", "insecure": true, "secretRef": map[string]any{"name": sandbox.RootSecret}},
		}},
		{sandbox.KustomizationGVR, map[string]any{
			"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
			"metadata": map[string]any{"name": slowKustomization, "namespace": sandbox.RootNamespace},
			"spec": map[string]any{"interval": "10m", "path": "./", "prune": true, "wait": true, "timeout": slowFor.String(), "suspend": true,
				"sourceRef": map[string]any{"kind": "OCIRepository", "name": slowKustomization}},
		}},
	}

	for _, o := range objects {
		if _, err := dyn.Resource(o.gvr).Namespace(sandbox.RootNamespace).Create(ctx, &unstructured.Unstructured{Object: o.obj}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	ready(t, dyn, sandbox.OCIRepositoryGVR, slowKustomization, 2*time.Minute)
}

// slowConfig is the sandbox's configuration, the slow Kustomization suspended for the run beside
// the root one, edited further by more.
func slowConfig(t *testing.T, sb *sandbox.Sandbox, more func(string) string) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return more(strings.Replace(s, `suspend = ["flux-system/flux-system"]`, `suspend = ["flux-system/flux-system", "flux-system/`+slowKustomization+`"]`, 1))
	})
}

// inFlight resumes the slow Kustomization (or asks it to reconcile) and waits until a reconcile of
// it is in flight: its Ready condition Unknown, Progressing. It returns when it saw that: the
// reconcile cannot end before slowFor from then, less the poll that saw it.
func inFlight(t *testing.T, dyn dynamic.Interface) time.Time {
	t.Helper()

	patch := fmt.Sprintf(`{"spec":{"suspend":false},"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Patch(context.Background(), slowKustomization, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, time.Minute, "a reconcile of the slow Kustomization in flight", func() error {
		k, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Get(context.Background(), slowKustomization, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if s, r, m := condition(k, "Ready"); s != "Unknown" || r != "Progressing" {
			return fmt.Errorf("Ready=%q (%s): %s", s, r, m)
		}

		return nil
	})

	return time.Now()
}

// firstWriteAndReconcileEnd runs apply and returns when it first wrote a machine's config (the new
// credential in a Talos config) and when the slow Kustomization's reconcile in flight at its start
// ended (its Ready condition left Unknown), both as this test saw them.
func firstWriteAndReconcileEnd(t *testing.T, sb *sandbox.Sandbox, dyn dynamic.Interface, cfg string, want sandbox.Credential) (write, end time.Time, code int, out string) {
	t.Helper()

	done := make(chan struct{})
	seen := make(chan [2]time.Time, 1)

	go func() {
		var w, e, deadline time.Time

		for {
			now := time.Now()

			if w.IsZero() {
				for _, m := range sb.Fleet().Machines() {
					if m.Configured().Username == want.Username {
						w = now
					}
				}
			}

			if e.IsZero() {
				if k, err := dyn.Resource(sandbox.KustomizationGVR).Namespace(sandbox.RootNamespace).Get(context.Background(), slowKustomization, metav1.GetOptions{}); err == nil {
					if s, _, _ := condition(k, "Ready"); s != "Unknown" {
						e = now
					}
				}
			}

			select {
			case <-done:
				if deadline.IsZero() { // apply ended: what it left in flight ends within its timeout
					deadline = now.Add(slowFor + 30*time.Second)
				}
			default:
			}

			// Apply ended and wrote: the end of the reconcile is only told, not waited for.
			if (!w.IsZero() && (!e.IsZero() || !deadline.IsZero())) || (!deadline.IsZero() && now.After(deadline)) {
				seen <- [2]time.Time{w, e}

				return
			}

			time.Sleep(50 * time.Millisecond)
		}
	}()

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)
	close(done)

	ts := <-seen

	return ts[0], ts[1], code, stdout + stderr
}

// The suspension as the predecessor held it: a reconcile of a suspended Kustomization already in
// flight when the run starts (applying Git's desired state, and with it Git's credential) is
// waited out — apply writes no machine's config until kustomize-controller has taken the
// suspension, which it does only after that reconcile ended. The negative control: the same run
// with flux.quiesce = false writes while the reconcile is still in flight.
func TestSuspensionWaitsOutAReconcileInFlight(t *testing.T) {
	sb := sandboxtest.Get(t)
	dyn := sandboxtest.DynamicFrom(t, sb.Path("kubeconfig"))
	ready(t, dyn, sandbox.OCIRepositoryGVR, sandbox.OCIRepository, 2*time.Minute)
	slowSource(t, sb, dyn)

	config := func(quiesce bool) string {
		return slowConfig(t, sb, func(s string) string {
			if !quiesce {
				s = strings.Replace(s, "flux {\n", "flux {\n  quiesce = false\n", 1)
			}

			return s
		})
	}

	for _, tc := range []struct {
		name    string
		quiesce bool
	}{{"quiesced: the first write after the reconcile in flight ended", true}, {"control, not quiesced: a write while it is in flight", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cred, err := sb.RotateSecret("flux-quiesce")
			if err != nil {
				t.Fatal(err)
			}

			cfg := config(tc.quiesce)

			// The reconcile in flight ends no sooner than slowFor after it was seen in flight (its
			// health check's timeout), less the poll that saw it: a write after its end is after
			// seen + slowFor - a margin; apply itself takes a few seconds. The end as seen is
			// told too, but not judged: the resume at the run's end starts the next reconcile
			// within milliseconds of it, too soon for a poll to see every time.
			seen := inFlight(t, dyn)
			ends := seen.Add(slowFor - 5*time.Second)

			write, end, code, out := firstWriteAndReconcileEnd(t, sb, dyn, cfg, cred)
			if code != 0 || write.IsZero() {
				t.Fatalf("apply exited %d; first write at %v:\n%s", code, write, out)
			}

			if tc.quiesce != write.After(ends) {
				t.Errorf("the first Talos write at %s, the reconcile in flight seen at %s (its end no sooner than %s; seen ending at %v): want the write after it %v",
					write.Format(time.StampMilli), seen.Format(time.StampMilli), ends.Format(time.StampMilli), end, tc.quiesce)
			}
		})
	}
}
