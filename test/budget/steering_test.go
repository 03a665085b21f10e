package budget

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// A run under --allow-pending and a budget, killed outright (SIGKILL at its first reboot: no
// chance to wind down), leaves its NoSchedule steering on the nodes it expected to rotate in
// its budget — as docs/apply.md says, and on no other: the nodes left for the next run stay
// schedulable (the negative control: they exist and carry nothing). `fences` lists each as a
// steering fence of a run proved over, and `release` takes every one off without --holder.
func TestAKilledRunLeavesHardSteeringOnlyOnItsBudgetedNodes(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()

	if _, err := sb.RotateSecret("killed-steering"); err != nil {
		t.Fatal(err)
	}

	cfg := config(t, sb, t.TempDir())
	bin := sandboxtest.Binary(t)

	const within = "35s"

	// What this run expects to rotate in its budget.
	p := ghcrsync(t, sb, "plan", "--allow-pending", "--within", within, "--json", "--config", cfg)

	var pj struct {
		Nodes []struct {
			Name     string `json:"name"`
			Action   string `json:"action"`
			InBudget bool   `json:"in_budget"`
		} `json:"nodes"`
	}

	if err := json.Unmarshal([]byte(p.stdout), &pj); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, p.stdout)
	}

	var budgeted, left []string

	for _, n := range pj.Nodes {
		switch {
		case n.Action != "fence":
		case n.InBudget:
			budgeted = append(budgeted, n.Name)
		default:
			left = append(left, n.Name)
		}
	}

	if len(budgeted) == 0 || len(left) == 0 {
		t.Fatalf("the budget should fit some nodes and leave others: fits %v, leaves %v", budgeted, left)
	}

	cmd := exec.Command(bin, "apply", "--auto-approve", "--allow-pending", "--within", within, "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
	sandboxtest.KillWhen(t, cmd, "rebooting: node=")

	steered := func() []string {
		nodes, err := sb.Kube().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}

		var out []string

		for _, n := range nodes.Items {
			if slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taints.Steering && x.Effect == corev1.TaintEffectNoSchedule }) {
				out = append(out, n.Name)
			}
		}

		sort.Strings(out)

		return out
	}

	got := steered()
	if len(got) == 0 {
		t.Fatal("the killed run left no steering: the test proves nothing")
	}

	for _, n := range got {
		if !slices.Contains(budgeted, n) {
			t.Fatalf("the killed run left NoSchedule steering on %s, which its budget left for the next run (steered %v, budgeted %v)", n, got, budgeted)
		}
	}

	t.Logf("killed at its first reboot: NoSchedule steering on %d of %d fenced nodes (%v); %v left schedulable", len(got), len(budgeted)+len(left), got, left)

	f := ghcrsync(t, sb, "fences", "--config", cfg)
	if !strings.Contains(f.stdout, "steering") || !strings.Contains(f.stdout, "process has exited") {
		t.Fatalf("fences after the kill does not list the steering of a run proved over:\n%s", f.stdout)
	}

	if r := ghcrsync(t, sb, "release", "--config", cfg); r.code != 0 {
		t.Fatalf("release after the kill: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if got := steered(); len(got) != 0 {
		t.Fatalf("release left NoSchedule steering on %v", got)
	}
}
