package budget

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// flapConfig is the sandbox's configuration with the registry's trouble waited out as long as
// the defaults do (the sandbox's own config shortens it, so a revoked credential fails fast).
func flapConfig(t *testing.T, sb *sandbox.Sandbox, dir string) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, dir, func(s string) string {
		s = strings.Replace(s, `retry_window  = "40s"`, `retry_window  = "2m"`, 1)
		s = strings.Replace(s, `denied_window = "6s"`, `denied_window = "45s"`, 1)
		s = strings.Replace(s, "nodes {\n", "nodes {\n  expected_node_time = \"10s\"\n", 1)

		return s
	})
}

// GHCR's incidents: for seconds to a minute the registry answers every client 429, 503 or 403
// DENIED. A merge that lands then must not fail its deploy: the plan's proof and each node's
// runtime proof wait the trouble out, and say what they waited out. The negative control: a
// denial that lasts — the new credential refused for the probe's package — fails the plan,
// naming the package and "refused (stable)", after the denied window (20 s there) and not before.
func TestTheRegistrysPassingTroubleIsWaitedOut(t *testing.T) {
	sb := sandboxtest.Get(t)
	reg := sb.Registry()

	c, err := sb.RotateSecret("flap")
	if err != nil {
		t.Fatal(err)
	}

	cfg := flapConfig(t, sb, t.TempDir())
	bin := sandboxtest.Binary(t) // built before the flap starts, not during it

	// The plan, proved while the registry flaps for 30 s.
	if err := reg.Flap(30*time.Second, nil, 2*time.Second, 7); err != nil {
		t.Fatal(err)
	}

	p := ghcrsync(t, sb, "plan", "--config", cfg)
	served := reg.Served()

	if p.code != 0 || !strings.Contains(p.stdout, "passing trouble") {
		t.Fatalf("plan while the registry flapped (served %v): exit %d\n%s\n%s", served, p.code, p.stdout, p.stderr)
	}

	if served["429"]+served["503"]+served["denied"] == 0 {
		t.Fatal("the flap answered nothing: the plan's proof was not troubled (the test proves nothing)")
	}

	t.Logf("plan: flap served %v, plan took %s: %s", served, p.took.Round(time.Second), warningLine(p.stdout, "passing trouble"))

	// The apply: the registry denies everyone for 30 s from the first reboot, so the node's runtime proof
	// (and the runtimes' pulls) meet it.
	cmd := exec.Command(bin, "apply", "--auto-approve", "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}

	var out, errb sandboxtest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb

	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 2*time.Minute, "the first reboot", func() error {
		if strings.Contains(errb.String(), "rebooting: node=") {
			return nil
		}

		return os.ErrNotExist
	})

	if err := reg.Flap(30*time.Second, []string{"denied"}, 0, 8); err != nil { // GHCR's DENIED to everyone: the hardest to tell from a refusal
		t.Fatal(err)
	}

	start := time.Now()
	err = cmd.Wait()
	served = reg.Served()

	if err != nil || !strings.Contains(out.String(), "It is safe to revoke") {
		t.Fatalf("apply while the registry flapped (served %v): %v\n%s\n%s", served, err, out.String(), errb.String())
	}

	if served["429"]+served["503"]+served["denied"] == 0 {
		t.Fatal("the flap during apply answered nothing (the test proves nothing)")
	}

	if !strings.Contains(errb.String(), "passing trouble was waited out") {
		t.Fatalf("no node's runtime proof met the flap (served %v): the test proves nothing\n%s", served, errb.String())
	}

	t.Logf("apply: flap served %v; the rest of the run took %s", served, time.Since(start).Round(time.Second))

	// The negative control: the new credential denied the probe's package for good. The plan
	// fails naming the package and "refused (stable)", once the denial has lasted its window.
	next, err := sb.RotateSecret("flap-denied")
	if err != nil {
		t.Fatal(err)
	}

	reg.DenyRepository(next.Username, "ghcrsync/private-probe")
	t.Cleanup(func() { reg.AllowRepository(next.Username, "ghcrsync/private-probe") })

	// A denied window of 20 s here (the defaults' 45 s adds nothing but time to what is tested).
	short := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, `denied_window = "6s"`, `denied_window = "20s"`, 1)
	})

	denied := ghcrsync(t, sb, "plan", "--config", short)
	if denied.code == 0 || !strings.Contains(denied.stderr, "ghcrsync/private-probe") || !strings.Contains(denied.stderr, "refused (stable)") {
		t.Fatalf("plan with the new credential denied its package: exit %d\n%s\n%s", denied.code, denied.stdout, denied.stderr)
	}

	if denied.took < 20*time.Second {
		t.Fatalf("a lasting denial failed after %s, before the denied window (20s): a passing incident would fail a deploy", denied.took)
	}

	for _, secret := range []string{c.Password, next.Password} {
		if strings.Contains(p.stdout+p.stderr+out.String()+errb.String()+denied.stdout+denied.stderr, secret) {
			t.Fatal("a credential's password appears in the output")
		}
	}
}

// warningLine is the line of out that contains what.
func warningLine(out, what string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, what) {
			return strings.TrimSpace(l)
		}
	}

	return ""
}
