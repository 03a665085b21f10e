package verdict

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The handover of a pull secret from Flux, as docs/fanout.md ("Handing a Secret over to
// ghcrsync") describes it: a consumer pull secret kustomize-controller applied (its labels, its
// field manager) is skipped by plan, naming Flux — two writers would fight; once it is out of
// Flux's manifests (prune disabled) and its Flux labels are stripped, the next rotation writes
// it, and the verdict is clean. The negative control is the first plan: while the labels stay,
// ghcrsync leaves the Secret alone.
func TestAFluxPullSecretHandedOverIsRotated(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	ns, name := sandbox.ConsumerNamespaces[0], sandbox.ConsumerSecret
	secrets := kube.CoreV1().Secrets(ns)

	// Flux applied it: server-side apply as kustomize-controller, with its labels and the prune
	// annotation the handover starts with (docs/fanout.md, step 1).
	applied := map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": name, "namespace": ns,
			"labels":      map[string]any{"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"},
			"annotations": map[string]any{"kustomize.toolkit.fluxcd.io/prune": "disabled"}},
		"type": string(corev1.SecretTypeDockerConfigJson),
		// The credential the fleet holds now (valid: no emergency here).
		"data": map[string]any{corev1.DockerConfigJsonKey: sandbox.DockerConfigJSON(sb.NewCredential())},
	}

	body, err := json.Marshal(applied)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := secrets.Patch(ctx, name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "kustomize-controller", Force: ptr.To(true)}); err != nil {
		t.Fatal(err)
	}

	c := rotate(t, sb, "handover")
	cfg := config(t, sb, nil)

	// While Flux's labels stay, plan skips it and says why.
	if got := consumerPlan(t, sb, cfg, ns, name); got.Action != "skip" || !strings.Contains(got.Reason, "Flux (kustomize.toolkit.fluxcd.io/name=apps)") {
		t.Fatalf("a Flux-labelled pull secret: %+v, want skip naming Flux", got)
	}

	// The handover (step 3): Flux's labels stripped, as
	//   kubectl -n NS label secret NAME kustomize.toolkit.fluxcd.io/name- kustomize.toolkit.fluxcd.io/namespace-
	strip := []byte(`{"metadata":{"labels":{"kustomize.toolkit.fluxcd.io/name":null,"kustomize.toolkit.fluxcd.io/namespace":null}}}`)
	if _, err := secrets.Patch(ctx, name, types.MergePatchType, strip, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	if got := consumerPlan(t, sb, cfg, ns, name); got.Action != "update" {
		t.Fatalf("the handed-over pull secret: %+v, want update", got)
	}

	if r := apply(t, sb, cfg); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("the rotation after the handover: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if !strings.Contains(string(s.Data[corev1.DockerConfigJsonKey]), `"`+c.Username+`"`) {
		t.Fatalf("the handed-over pull secret does not hold the new credential")
	}

	if got := consumerPlan(t, sb, cfg, ns, name); got.Action != "no-op" {
		t.Fatalf("after the rotation the handed-over pull secret is %+v, want no-op", got)
	}
}

// consumerPlan is plan --json's entry for the pull secret ns/name.
func consumerPlan(t *testing.T, sb *sandbox.Sandbox, cfg, ns, name string) struct{ Action, Reason string } {
	t.Helper()

	r := ghcrsync(t, sb, "plan", "--json", "--config", cfg)
	if r.code != 0 && r.code != 2 {
		t.Fatalf("plan: exit %d\n%s", r.code, r.stderr)
	}

	var p struct {
		Consumers []struct{ Namespace, Secret, Action, Reason string }
	}

	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, r.stdout)
	}

	for _, s := range p.Consumers {
		if s.Namespace == ns && s.Secret == name {
			return struct{ Action, Reason string }{s.Action, s.Reason}
		}
	}

	t.Fatalf("plan --json names no pull secret %s/%s", ns, name)

	return struct{ Action, Reason string }{}
}
