package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// A fleet on the old credential plans a fence for every node (Talos 1.13), workers first and
// the API endpoint's node last; the saved plan renders identically with show; and plan makes
// no write: the apiserver's audit log has no write by its identity, and Talos counted none.
func TestPlanRotationIsReadOnly(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)
	sandboxtest.QuietAutoscaler(t)

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")

	if err := sb.WriteKubeconfig(kubeconfig, "ghcrsync-plan-test", "system:masters"); err != nil {
		t.Fatal(err)
	}

	cfg := copyConfig(t, sb, dir, func(s string) string { return strings.Replace(s, sb.Path("kubeconfig"), kubeconfig, 1) })
	out := filepath.Join(dir, "plan.out")
	talosBefore := sb.Fleet().Stats().TalosWrites

	r := ghcrsync(t, "plan", "--config", cfg, "--out", out, "--detailed-exitcode")
	if r.code != 2 {
		t.Fatalf("plan exit %d, want 2 (changes):\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if !strings.Contains(r.stdout, "Plan: 8 to fence, 0 to apply live, 0 unchanged, 0 deselected.") {
		t.Fatalf("summary:\n%s", r.stdout)
	}

	jr := ghcrsync(t, "plan", "--config", cfg, "--json")
	p := planJSON(t, jr)

	if p.FormatVersion != view.PlanJSONFormatVersion || p.Verdict == nil || p.Verdict.SafeToRevoke || p.EndpointNode != "prod-control-plane-1" || len(p.CredentialRevision) != 64 {
		t.Fatalf("json plan header: %+v", p)
	}

	last := p.Nodes[len(p.Nodes)-1]
	if last.Name != "prod-control-plane-1" || last.Order != 8 || !last.APIEndpoint {
		t.Fatalf("the endpoint node is not last: %+v", last)
	}

	for _, n := range p.Nodes[:5] {
		if n.Role != "worker" {
			t.Fatalf("a control plane is ordered before a worker: %+v", p.Nodes)
		}
	}

	for _, n := range p.Nodes {
		if n.Action != "fence" || n.ReasonCode != "config-outdated" {
			t.Fatalf("%s: %s/%s", n.Name, n.Action, n.ReasonCode)
		}
	}

	// show renders the saved plan identically.
	show := ghcrsync(t, "show", out)
	if show.code != 0 {
		t.Fatalf("show: %s", show.stderr)
	}

	if planned := r.stdout[:strings.Index(r.stdout, "\nSaved the plan to:")]; show.stdout != planned {
		t.Fatalf("show differs from plan:\n--- plan\n%s\n--- show\n%s", planned, show.stdout)
	}

	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
		t.Fatalf("plan file mode %v", fi.Mode().Perm())
	}

	// Zero writes: Kubernetes (audit log, by identity) and Talos (counter).
	time.Sleep(time.Second) // the audit backend is blocking, but give the file a moment

	writes, err := sb.AuditedWrites("ghcrsync-plan-test")
	if err != nil {
		t.Fatal(err)
	}

	if len(writes) != 0 {
		t.Fatalf("plan wrote to the cluster: %+v", writes)
	}

	if after := sb.Fleet().Stats().TalosWrites; fmt.Sprint(after) != fmt.Sprint(talosBefore) {
		t.Fatalf("plan wrote through the Talos API: %v -> %v", talosBefore, after)
	}

	// A modified plan file is refused by show.
	data, _ := os.ReadFile(out)
	_ = os.WriteFile(out, []byte(strings.Replace(string(data), `"action": "fence"`, `"action": "no-op"`, 1)), 0o600)

	if bad := ghcrsync(t, "show", out); bad.code != 3 || !strings.Contains(bad.stderr, "the plan file is corrupt or was edited") {
		t.Fatalf("edited plan: exit %d: %s", bad.code, bad.stderr)
	}
}

// Nodes prepared with each deselection cause appear with the right reason code.
func TestPlanDeselectionReasons(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)
	kube := sb.Kube()
	sandboxtest.QuietAutoscaler(t)

	patch := func(name string, v map[string]any) {
		t.Helper()

		b, _ := json.Marshal(v)
		if _, err := kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// withTaint adds taint to the Node, and takes it off at the end, each read and updated again
	// when a kubelet heartbeat lands in between.
	withTaint := func(name string, taint corev1.Taint) {
		t.Helper()

		edit := func(change func(*corev1.Node)) error { return sandboxtest.EditNode(ctx, kube, name, change) }

		if err := edit(func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taint) }); err != nil {
			t.Fatal(err)
		}

		t.Cleanup(func() {
			if err := edit(func(n *corev1.Node) {
				n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taint.Key })
			}); err != nil {
				t.Error(err)
			}
		})
	}

	now := fmt.Sprint(time.Now().Unix())
	withTaint("prod-worker-1", corev1.Taint{Key: "DeletionCandidateOfClusterAutoscaler", Value: now, Effect: corev1.TaintEffectPreferNoSchedule})
	withTaint("prod-worker-2", corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: now, Effect: corev1.TaintEffectNoSchedule})

	patch("prod-worker-3", map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "other-run-1234", object.PhaseAnnotation: "drained"}}})
	t.Cleanup(func() {
		patch("prod-worker-3", map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil, object.PhaseAnnotation: nil}}})
	})

	// A node held in deletion by a finalizer: a fresh autoscaled node, so the fleet keeps its size.
	up, err := sb.Do(ctx, "scale-up", sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}

	doomed := up.(map[string]string)["added"]
	patch(doomed, map[string]any{"metadata": map[string]any{"finalizers": []string{"ghcrsync.dev/test-hold"}}})

	if err := kube.CoreV1().Nodes().Delete(ctx, doomed, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		patch(doomed, map[string]any{"metadata": map[string]any{"finalizers": nil}})
		_, _ = sb.Do(ctx, "delete-node", sandbox.Request{Node: doomed})
	})

	cfg := copyConfig(t, sb, t.TempDir(), func(s string) string {
		s = strings.Replace(s, `autoscaler_candidates = "include"`, `autoscaler_candidates = "deselect"`, 1)

		return strings.Replace(s, "nodes {", "nodes {\n  exclude = [\"prod-control-plane-2\"]", 1)
	})

	r := ghcrsync(t, "plan", "--config", cfg, "--json")
	if r.code != 0 {
		t.Fatalf("plan: %d %s", r.code, r.stderr)
	}

	p := planJSON(t, r)

	for name, want := range map[string]string{
		"prod-worker-1":        "autoscaler-candidate",
		"prod-worker-2":        "autoscaler-deleting",
		"prod-worker-3":        "fenced-by-other",
		doomed:                 "deleting",
		"prod-control-plane-2": "excluded",
		"prod-control-plane-3": "config-outdated",
	} {
		n, ok := nodeByName(p, name)
		if !ok {
			t.Fatalf("%s missing from the plan", name)
		}

		if n.ReasonCode != want {
			t.Errorf("%s: reason %s (%s), want %s", name, n.ReasonCode, n.Reason, want)
		}

		if want != "config-outdated" && n.Action != "deselect" {
			t.Errorf("%s: action %s, want deselect", name, n.Action)
		}
	}

	if n, _ := nodeByName(p, "prod-worker-1"); !strings.Contains(n.Reason, "scale-down candidate of the cluster autoscaler (taint since") {
		t.Errorf("candidate sentence: %s", n.Reason)
	}
}

// A fleet already on the desired credential plans "No changes" (exit 0 with
// --detailed-exitcode); on Talos 1.14 a changed credential plans live applies, not fences.
func TestPlanInSyncThenLiveOnTalos114(t *testing.T) {
	dir := t.TempDir()

	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: dir, ControlPlanes: 1, Workers: 2, InSync: true, TalosVersion: "1.14", NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})

	cfg := sandboxEnv(t, sb)

	r := ghcrsync(t, "plan", "--config", cfg, "--detailed-exitcode")
	if r.code != 0 || !strings.Contains(r.stdout, "No changes. The fleet already uses credential revision") {
		t.Fatalf("in-sync fleet: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// A new credential in the SOPS file (accepted by the registry): every node is applied live.
	rotated := sandbox.Credential{Username: "fleet-next", Password: "ghp_next_" + fmt.Sprint(time.Now().UnixNano())}
	sb.Registry().AddCredential(rotated.Username, rotated.Password)
	writeSecretFile(t, sb, rotated)

	r = ghcrsync(t, "plan", "--config", cfg, "--json", "--detailed-exitcode")
	if r.code != 2 {
		t.Fatalf("rotated credential: exit %d: %s", r.code, r.stderr)
	}

	p := planJSON(t, r)
	if p.Summary.ApplyLive != 3 || p.Summary.Fence != 0 {
		t.Fatalf("Talos 1.14: want 3 live applies and no fence: %+v", p.Summary)
	}
}

// writeSecretFile re-encrypts the sandbox's secret file for its own age key with cred.
func writeSecretFile(t *testing.T, sb *sandbox.Sandbox, cred sandbox.Credential) {
	t.Helper()

	enc, err := sb.EncryptSecret(sandbox.DockerConfigJSON(cred))
	if err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(sb.Path(sandbox.SecretFile), enc, 0o600); err != nil {
		t.Fatal(err)
	}
}
