package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/state"
)

// childMain runs the CLI in a child process of the test binary (GHCRSYNC_MAIN_ARGS, separated by the unit separator 0x1f),
// with real signal handling; GHCRSYNC_TEST_MARK_AT names a phase at which it writes the file
// GHCRSYNC_TEST_MARKER and then pauses GHCRSYNC_TEST_PAUSE, so the parent can signal it there.
func childMain() bool {
	args := os.Getenv("GHCRSYNC_MAIN_ARGS")
	if args == "" {
		return false
	}

	if at := state.Phase(os.Getenv("GHCRSYNC_TEST_MARK_AT")); at != "" {
		pause, _ := time.ParseDuration(os.Getenv("GHCRSYNC_TEST_PAUSE"))
		testHooks = apply.Hooks{BeforeMutation: func(_ string, phase state.Phase) {
			if phase == at {
				_ = os.WriteFile(os.Getenv("GHCRSYNC_TEST_MARKER"), []byte(phase), 0o600)
				time.Sleep(pause)
			}
		}}
	}

	os.Exit(run(strings.Split(args, "\x1f"), os.Stdout, os.Stderr))

	return true
}

// child is a `ghcrsync` process of its own.
type child struct {
	cmd    *exec.Cmd
	out    *strings.Builder
	marker string
}

func startChild(t *testing.T, markAt state.Phase, pause time.Duration, args ...string) *child {
	t.Helper()

	marker := filepath.Join(t.TempDir(), "marker")
	out := &strings.Builder{}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GHCRSYNC_MAIN_ARGS="+strings.Join(args, "\x1f"), "GHCRSYNC_TEST_MARK_AT="+string(markAt),
		"GHCRSYNC_TEST_PAUSE="+pause.String(), "GHCRSYNC_TEST_MARKER="+marker)
	cmd.Stdout, cmd.Stderr = out, out

	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })

	return &child{cmd: cmd, out: out, marker: marker}
}

// waitMarked waits until the child reached its phase.
func (c *child) waitMarked(t *testing.T) {
	t.Helper()

	sandboxtest.Eventually(t, 2*time.Minute, "the run reaches its phase", func() error {
		if _, err := os.Stat(c.marker); err != nil {
			return err
		}

		return nil
	})
}

// signal sends sig and waits for the exit: its code and how long it took.
func (c *child) signal(t *testing.T, sig syscall.Signal) (int, time.Duration) {
	t.Helper()

	start := time.Now()
	_ = c.cmd.Process.Signal(sig)
	err := c.cmd.Wait()

	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}

	return c.cmd.ProcessState.ExitCode(), time.Since(start)
}

// oneNodeRotation is a configuration rotating one node to a fresh credential, with a 4 s Lease of
// its own, and a saved plan for it.
func oneNodeRotation(t *testing.T, sb *sandbox.Sandbox, node string, edit func(string) string) (cfg, planFile string) {
	t.Helper()

	dir := t.TempDir()
	group := strings.ReplaceAll(t.Name(), "/", "-")

	sandboxtest.PatchNode(t, sb.Kube(), node, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": group}}})
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, sb.Kube(), node, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": nil}}})
	})

	cred := sandbox.Credential{Username: "cancel-" + fmt.Sprint(time.Now().UnixNano()), Password: fmt.Sprintf("ghp_cancel_%d", time.Now().UnixNano())}
	sb.Registry().AddCredential(cred.Username, cred.Password)
	secret := encryptFor(t, sb, dir, sandbox.DockerConfigJSON(cred))

	cfg = copyConfig(t, sb, dir, func(s string) string {
		s = strings.Replace(s, sb.Path("secret.enc.yaml"), secret, 1)
		s = strings.Replace(s, "nodes {", "nodes {\n  selector = \"ghcrsync.dev/test-group="+group+"\"\n  verdict  = \"selected\"", 1)
		s = strings.Replace(s, `"ghcr-auth-refresh"`, `"`+strings.ToLower(group)+`"`, 1)
		s = strings.Replace(s, `duration  = "15s"`, `duration  = "4s"`, 1)
		s = strings.Replace(s, `heartbeat = "5s"`, `heartbeat = "1s"`, 1)

		if edit != nil {
			s = edit(s)
		}

		return s
	})

	planFile = filepath.Join(dir, "rotation.plan")
	if r := ghcrsync(t, "plan", "--config", cfg, "--out", planFile); r.code != 0 {
		t.Fatalf("plan: %s", r.stderr)
	}

	return cfg, planFile
}

func stateOf(t *testing.T, cfg string) *state.State {
	t.Helper()

	st, err := state.ReadLocal(filepath.Join(filepath.Dir(cfg), "ghcrsync.state.json"))
	if err != nil {
		t.Fatal(err)
	}

	return st
}

// SIGTERM while a drain waits on a PodDisruptionBudget: the run stops within seconds (exit 143),
// the node is uncordoned as recorded (nothing reached Talos), the Lease is free, the state says
// cancelled. Negative control for the clock: the drain alone would have waited a minute.
func TestSIGTERMDuringDrain(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)
	const name = "prod-worker-3"

	blockDrain(t, sb, name)
	cfg, planFile := oneNodeRotation(t, sb, name, func(s string) string {
		return strings.Replace(s, `drain_timeout         = "2m"`, `drain_timeout         = "60s"`, 1) + waitHeldDrains
	})

	c := startChild(t, state.PhaseDrained, 0, "apply", "--config", cfg, planFile)
	c.waitMarked(t)
	time.Sleep(time.Second) // the drain is waiting on the budget

	code, took := c.signal(t, syscall.SIGTERM)
	if code != 143 || took > 10*time.Second {
		t.Fatalf("exit %d after %s:\n%s", code, took, c.out)
	}

	if !strings.Contains(c.out.String(), "Apply cancelled: no node is left fenced") {
		t.Fatalf("the cancelled run's last line:\n%s", c.out)
	}

	n, _ := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" {
		t.Fatalf("the node was not restored: cordoned %t, %+v", n.Spec.Unschedulable, n.Annotations)
	}

	st := stateOf(t, cfg)
	if rec := st.Record(name); rec.Outcome != state.OutcomeCancelled || rec.Holds() || st.Run.Outcome != "cancelled" {
		t.Fatalf("state: %+v run %+v", rec, st.Run)
	}

	if r := ghcrsync(t, "fences", "--config", cfg); !strings.Contains(r.stdout, "No fence is held.") {
		t.Fatalf("fences after a clean cancellation:\n%s", r.stdout)
	}
}

// SIGTERM right after the node's Talos config was written: exit 143, the node stays fenced and
// recorded at its phase; `fences` shows it releasable (its process on this host exited), and
// `release` with no --holder clears it.
func TestSIGTERMAfterConfigured(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)
	const name = "prod-worker-2"

	cfg, planFile := oneNodeRotation(t, sb, name, nil)

	c := startChild(t, state.PhaseRebooting, 3*time.Second, "apply", "--config", cfg, planFile)
	c.waitMarked(t)

	code, took := c.signal(t, syscall.SIGTERM)
	if code != 143 || took > 10*time.Second || !strings.Contains(c.out.String(), "1 node(s) left fenced ("+name+")") ||
		!strings.Contains(c.out.String(), "Release with: ghcrsync release --config") {
		t.Fatalf("exit %d after %s:\n%s", code, took, c.out)
	}

	if rec := stateOf(t, cfg).Record(name); rec.Outcome != state.OutcomeCancelled || !rec.Holds() || rec.Phase != state.PhaseRebooting {
		t.Fatalf("state: %+v", rec)
	}

	r := ghcrsync(t, "fences", "--config", cfg, "--json")

	var rep view.FencesJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Fences) != 1 || !rep.Fences[0].Releasable || !strings.Contains(rep.Fences[0].Evidence, "has exited") {
		t.Fatalf("fences: %v\n%s", err, r.stdout)
	}

	if r := ghcrsync(t, "release", "--config", cfg); r.code != 0 || !strings.Contains(r.stdout, "LEFT CORDONED (an unproven hold)") {
		t.Fatalf("release: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Cancelled while rebooting, after its Talos write, never proved: the node stays out of
	// service, on ghcrsync's unproven hold, until a proof or a person returns it.
	n, _ := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if !n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" || n.Annotations[object.UnprovenAnnotation] == "" {
		t.Fatalf("after release: cordoned %t, %+v", n.Spec.Unschedulable, n.Annotations)
	}

	if r := ghcrsync(t, "release", "--config", cfg, "--uncordon-unproven"); r.code != 0 {
		t.Fatalf("release --uncordon-unproven: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	n, _ = sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if n.Spec.Unschedulable || n.Annotations[object.UnprovenAnnotation] != "" {
		t.Fatalf("after release --uncordon-unproven: cordoned %t, %+v", n.Spec.Unschedulable, n.Annotations)
	}
}

// SIGINT, then SIGKILL 2 s later (GitHub Actions' escalation): whatever point the run reached,
// the state still tells the truth, and `release` leaves nothing behind.
func TestSIGINTThenSIGKILL(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)
	const name = "prod-worker-1"

	cfg, planFile := oneNodeRotation(t, sb, name, nil)

	c := startChild(t, state.PhaseDrained, 0, "apply", "--config", cfg, planFile)
	c.waitMarked(t)

	_ = c.cmd.Process.Signal(syscall.SIGINT)
	time.Sleep(2 * time.Second)
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()

	if code := c.cmd.ProcessState.ExitCode(); code != 130 && code != -1 {
		t.Fatalf("exit %d:\n%s", code, c.out)
	}

	rec := stateOf(t, cfg).Record(name)
	n, _ := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})

	// The state is written before each mutation: a fence on the node is one the record allows.
	if fenced := n.Annotations[object.OwnerAnnotation] != ""; fenced && !rec.Holds() && rec.Phase != state.PhaseReleased {
		t.Fatalf("the node is fenced, the state does not say so: %+v", rec)
	}

	if r := ghcrsync(t, "release", "--config", cfg); r.code != 0 {
		t.Fatalf("release: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	n, _ = sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" {
		t.Fatalf("after release: cordoned %t, %+v", n.Spec.Unschedulable, n.Annotations)
	}
}

// blockDrain pins a pod to the node behind a PodDisruptionBudget that allows no disruption.
func blockDrain(t *testing.T, sb *sandbox.Sandbox, name string) {
	t.Helper()

	kube := sb.Kube()
	ns := "pdb-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))

	labels := sandboxtest.PinnedDeployment(t, kube, ns, "pinned", name)

	sandboxtest.Budget(t, kube, ns, "pinned", labels, sandboxtest.MinAvailable(1), 1)
}

// A state that cannot be read — corrupt, or written by a newer ghcrsync — never wedges the
// commands that repair a wedge: `fences` and `release` say so and work from the nodes'
// annotations (leaving the state as it is), and `state push` replaces a corrupt state (a newer
// one only with --force). The negative control: `plan` still refuses the unreadable state.
func TestRepairWithAnUnreadableState(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)
	const name = "prod-worker-3"

	for _, tc := range []struct {
		name, content string
	}{
		{"corrupt", `{"format_version": "1", "records": [`},
		{"newer", `{"format_version":"9","lineage":"future","serial":4,"records":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, planFile := oneNodeRotation(t, sb, name, nil)

			c := startChild(t, state.PhaseRebooting, 3*time.Second, "apply", "--config", cfg, planFile)
			c.waitMarked(t)

			if code, _ := c.signal(t, syscall.SIGTERM); code != 143 {
				t.Fatalf("exit %d:\n%s", code, c.out)
			}

			statePath := filepath.Join(filepath.Dir(cfg), "ghcrsync.state.json")
			if err := os.WriteFile(statePath, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}

			if r := ghcrsync(t, "plan", "--config", cfg); r.code != 1 || !strings.Contains(r.stderr, "state file") {
				t.Fatalf("plan with the state %s: exit %d\n%s", tc.name, r.code, r.stderr)
			}

			r := ghcrsync(t, "fences", "--config", cfg)
			if r.code != 0 || !strings.Contains(r.stderr, "the state cannot be read") || !strings.Contains(r.stdout, name) {
				t.Fatalf("fences with the state %s: exit %d\n%s\n%s", tc.name, r.code, r.stdout, r.stderr)
			}

			if r := ghcrsync(t, "release", "--config", cfg); r.code != 0 || !strings.Contains(r.stdout, "Release complete") {
				t.Fatalf("release with the state %s: exit %d\n%s\n%s", tc.name, r.code, r.stdout, r.stderr)
			}

			n, _ := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
			if n.Annotations[object.OwnerAnnotation] != "" {
				t.Fatalf("release left the fence: %+v", n.Annotations)
			}

			if b, _ := os.ReadFile(statePath); string(b) != tc.content {
				t.Fatalf("release wrote over the unreadable state:\n%s", b)
			}

			// state push: a corrupt state is replaced; a newer one only with --force.
			good := filepath.Join(t.TempDir(), "good.json")
			if err := os.WriteFile(good, []byte(`{"format_version":"1","lineage":"aaaa","serial":2,"records":[]}`), 0o600); err != nil {
				t.Fatal(err)
			}

			r = ghcrsync(t, "state", "push", "--config", cfg, good)
			switch {
			case tc.name == "newer" && (r.code != 1 || !strings.Contains(r.stderr, "pass --force to replace it")):
				t.Fatalf("push over a newer state without --force: exit %d\n%s", r.code, r.stderr)
			case tc.name == "newer":
				r = ghcrsync(t, "state", "push", "--config", cfg, "--force", good)
				fallthrough
			default:
				if r.code != 0 || stateOf(t, cfg).Lineage != "aaaa" {
					t.Fatalf("push over the %s state: exit %d\n%s", tc.name, r.code, r.stderr)
				}
			}

			waitReadyNode(t, sb, name)
		})
	}
}

// waitReadyNode waits until the node is Ready again (its reboot done).
func waitReadyNode(t *testing.T, sb *sandbox.Sandbox, name string) {
	t.Helper()

	sandboxtest.Eventually(t, time.Minute, name+" Ready", func() error {
		n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if !sandbox.NodeReady(n) {
			return fmt.Errorf("not Ready")
		}

		return nil
	})
}

// waitHeldDrains makes a drain held by a budget that never frees by itself wait drain_timeout
// (maintenance.held_drain = "wait"), as the tests of a held drain need: by default such a node
// is deferred (test/coexist).
const waitHeldDrains = "\nmaintenance {\n  held_drain = \"wait\"\n}\n"
