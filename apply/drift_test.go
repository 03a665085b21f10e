package apply_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// A node ghcrsync rotated whose machine config an operator then re-applies with the real
// talosctl, without the RegistryAuthConfig document, is reported as drift by the next plan,
// and rotated again. Negative control: the same node, rotated and untouched, is not.
func TestPlanReportsConfigDrift(t *testing.T) {
	sb := sandboxtest.Get(t)
	operator := sandboxtest.NewTalosctl(t, sb.Path(sandbox.TalosconfigOperatorFile))
	const name = "prod-worker-3"

	r := newRotation(t, sb, nil, name)

	if res, err := r.apply(r.plan(), apply.Hooks{}); err != nil || res.Failed() > 0 {
		t.Fatalf("apply: %v %+v", err, res)
	}

	before, err := planCfg(context.Background(), r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if len(before.Plan.Drifted) != 0 {
		t.Fatalf("a rotated, untouched node is reported as drift: %v %v", before.Plan.Drifted, before.Plan.Warnings)
	}

	m, ok := sb.Fleet().Machine(name)
	if !ok {
		t.Fatal("no machine " + name)
	}

	// The operator's source of truth knows nothing of the credential: its config, re-applied.
	current := operator.Must("-n", m.IP, "get", "mc", "v1alpha1", "-o", "jsonpath={.spec}")
	docs := slices.DeleteFunc(strings.Split(current, "\n---\n"), func(d string) bool { return strings.Contains(d, "kind: RegistryAuthConfig") })

	if len(docs) == len(strings.Split(current, "\n---\n")) {
		t.Fatal("the rotated node's config carries no RegistryAuthConfig document")
	}

	file := filepath.Join(t.TempDir(), "operator.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}

	// Staged, then the machine restarts out of band (a maintenance reboot): the sandbox's safety
	// witness judges only reboots asked through the Talos API, and this one is nobody's drain.
	operator.Must("-n", m.IP, "apply-config", "--file", file, "--mode=staged")

	if _, err := sb.Do(context.Background(), "reboot", sandbox.Request{Node: name}); err != nil {
		t.Fatal(err)
	}

	waitReady(t, sb, name)

	sandboxtest.Eventually(t, 60*time.Second, "plan reports the drift", func() error {
		after, err := planCfg(context.Background(), r.cfg)
		if err != nil {
			return err
		}

		if !slices.Equal(after.Plan.Drifted, []string{name}) {
			return fmt.Errorf("drifted %v, warnings %v", after.Plan.Drifted, after.Plan.Warnings)
		}

		n, _ := after.Plan.Node(name)
		if !strings.Contains(strings.Join(after.Plan.Warnings, "\n"), name+"'s machine config drifted") || n.Order == 0 {
			return fmt.Errorf("the drift is not warned of, or the node not rotated again: %+v %v", n, after.Plan.Warnings)
		}

		return nil
	})

	// Rotated again: the node pulls with the credential once more, and leaves the sandbox as it
	// found it (its pods, the web Deployment's among them, pull again: the next tests' drains are
	// not held by a budget whose pod here cannot start).
	res, err := r.apply(r.plan(), apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeDone {
		t.Fatalf("the drifted node rotated again: %s %s", x.Outcome, x.Message)
	}
}

// J1: an unrelated change of a rotated node's machine config — an operator's `talosctl patch mc
// --mode=no-reboot` of a sysctl — moves the config's change time past its runtime's start, which
// then no longer proves the credential; the runtime proof ghcrsync wrote after the rotation (the
// verified marker, of this boot) still stands: the next plan leaves the node alone, no redundant
// reboot. The negative control: the same marker without its boot id says nothing of the boot
// running now, and the node is fenced again.
func TestUnrelatedConfigChangeKeepsTheRuntimeProof(t *testing.T) {
	sb := sandboxtest.Get(t)
	operator := sandboxtest.NewTalosctl(t, sb.Path(sandbox.TalosconfigOperatorFile))
	const name = "prod-worker-3"

	r := newRotation(t, sb, nil, name)

	if res, err := r.apply(r.plan(), apply.Hooks{}); err != nil || res.Failed() > 0 {
		t.Fatalf("apply: %v %+v", err, res)
	}

	m, ok := sb.Fleet().Machine(name)
	if !ok {
		t.Fatal("no machine " + name)
	}

	patch := filepath.Join(t.TempDir(), "sysctl.yaml")
	if err := os.WriteFile(patch, []byte("machine:\n  sysctls:\n    net.core.somaxconn: \"1024\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	if out := operator.Must("-n", m.IP, "patch", "mc", "--mode=no-reboot", "--patch", "@"+patch); !strings.Contains(out, "without a reboot") {
		t.Fatalf("talosctl patch mc --mode=no-reboot: %s", out)
	}

	node := func(p *planned) plan.NodePlan {
		t.Helper()

		n, ok := p.Plan.Node(name)
		if !ok {
			t.Fatalf("the plan has no %s", name)
		}

		return n
	}

	after, err := planCfg(context.Background(), r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if n := node(after); n.Action != plan.ActionNoOp || !strings.Contains(n.Sentence, "verified by ghcrsync on boot") {
		t.Fatalf("after an unrelated no-reboot change the node is planned %s (%s); want no-op on its verified marker", n.Action, n.Sentence)
	}

	if cfg := operator.Must("-n", m.IP, "get", "mc", "v1alpha1", "-o", "jsonpath={.spec}"); !strings.Contains(cfg, "net.core.somaxconn") {
		t.Fatal("the operator's change is not in the active config")
	}

	// The control: the marker without its boot id. Its runtime's start, before the operator's
	// change, proves nothing either: the node is fenced.
	boot := node(after).Invariants.BootID
	sandboxtest.PatchNode(t, sb.Kube(), name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.VerifiedBootAnnotation: nil}}})
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, sb.Kube(), name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.VerifiedBootAnnotation: boot}}})
	})

	unmarked, err := planCfg(context.Background(), r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if n := node(unmarked); n.Action != plan.ActionFence {
		t.Errorf("a verified marker without a boot id: the node is planned %s (%s), want fence", n.Action, n.Reason)
	}
}
