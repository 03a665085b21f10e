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
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
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
