package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// documentedStep returns the run: script of the named step of the shipped deploy workflow,
// docs/workflows/apply.yml (docs/ci.md links it), as the runner would write it to a file for
// bash.
func documentedStep(t *testing.T, name string) string {
	t.Helper()

	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "workflows", "apply.yml"))
	if err != nil {
		t.Fatal(err)
	}

	sc := bufio.NewScanner(strings.NewReader(string(doc)))

	var (
		lines  []string
		inStep bool
		indent = -1
	)

	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)

		switch {
		case trimmed == "- name: "+name:
			inStep = true
		case inStep && indent < 0 && trimmed == "run: |":
			indent = 0
		case inStep && indent == 0:
			indent = len(line) - len(strings.TrimLeft(line, " "))
			lines = append(lines, line[indent:])
		case inStep && indent > 0:
			if trimmed != "" && len(line)-len(strings.TrimLeft(line, " ")) < indent {
				return strings.Join(lines, "\n") + "\n"
			}

			lines = append(lines, strings.TrimPrefix(line, strings.Repeat(" ", indent)))
		}
	}

	if len(lines) == 0 {
		t.Fatalf("docs/workflows/apply.yml has no step %q with a run: block", name)
	}

	return strings.Join(lines, "\n") + "\n"
}

// The apply step of docs/workflows/apply.yml, run under bash as the runner runs it: a cancel signals the
// step's shell only, and ghcrsync must be the one that receives it (the step execs it). The
// negative control runs the step without exec: the shell swallows the signal and ghcrsync
// never hears of it — which is why the docs say exec.
func TestDocumentedApplyStepReceivesTheSignal(t *testing.T) {
	step := documentedStep(t, "Apply")
	if !strings.Contains(step, "exec ghcrsync apply") {
		t.Fatalf("the documented apply step does not exec ghcrsync:\n%s", step)
	}

	sb := sandboxtest.Start(t, sandbox.Options{
		ControlPlanes: 1, Workers: 2, NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})
	cfg := sandboxEnv(t, sb)
	bin := sandboxtest.Binary(t)

	runnerTemp := t.TempDir()
	for _, f := range []string{"kubeconfig", "talosconfig"} {
		if err := os.Symlink(sb.Path(f), filepath.Join(runnerTemp, f)); err != nil {
			t.Fatal(err)
		}
	}

	run := func(script string) (code int, out string) {
		work := t.TempDir()
		env := append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "RUNNER_TEMP="+runnerTemp,
			"GHCRSYNC_CONFIG="+cfg, "SOPS_AGE_KEY_FILE="+sb.Path(sandbox.AgeKeyFile), "GITHUB_ACTIONS=",
			"GHCRSYNC_WITHIN=40m") // as the job's env sets it

		planCmd := exec.Command(bin, "plan", "--out", filepath.Join(work, "plan.out"))
		planCmd.Env = env

		if b, err := planCmd.CombinedOutput(); err != nil {
			t.Fatalf("plan: %v\n%s", err, b)
		}

		path := filepath.Join(work, "step.sh")
		if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}

		// As the runner does: bash -e {0}, in the workspace.
		c := exec.Command("bash", "--noprofile", "--norc", "-e", "-o", "pipefail", path)
		c.Dir, c.Env = work, env

		var buf sandboxtest.SyncBuffer
		c.Stdout, c.Stderr = &buf, &buf

		if err := c.Start(); err != nil {
			t.Fatal(err)
		}

		sandboxtest.Eventually(t, 2*time.Minute, "a node rebooting", func() error {
			if strings.Contains(buf.String(), "rebooting: node=") {
				return nil
			}

			return os.ErrNotExist
		})

		// The runner's cancel: SIGINT to the step's shell process only (not its group).
		_ = syscall.Kill(c.Process.Pid, syscall.SIGINT)
		_ = c.Wait()

		return c.ProcessState.ExitCode(), buf.String()
	}

	code, out := run(step)
	if code != 130 || !strings.Contains(out, "Received interrupt") {
		t.Fatalf("the documented step, cancelled: exit %d, want 130 from ghcrsync\n%s", code, out)
	}

	// Same host, dead process: release proves the run is over without --holder.
	if r := ghcrsync(t, "release", "--config", cfg); r.code != 0 {
		t.Fatalf("release after the cancelled step: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	code, out = run(strings.Replace(step, "exec ghcrsync apply", "ghcrsync apply", 1))
	if strings.Contains(out, "Received interrupt") || !strings.Contains(out, "Apply complete") {
		t.Fatalf("without exec, ghcrsync heard the shell's signal (exit %d): the negative control does not hold\n%s", code, out)
	}
}
