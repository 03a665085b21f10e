package sandbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The real talosctl v1.13.9 — a client nobody here wrote — drives the simulated machines as an
// operator would: get mc -o yaml, get rd, patch mc --mode=staged with a merge patch adding
// registry auth, apply-config --dry-run with Talos's diff, an invalid config refused with
// InvalidArgument, reboot with its default wait seeing the boot ID change, and health
// --server=false with the node list.
func TestRealTalosctl(t *testing.T) {
	c := sandboxtest.NewTalosctl(t, "") // skips at once when it is not built

	sb := sandboxtest.Start(t, sandbox.Options{
		ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})

	c.Conf = sb.Path(sandbox.TalosconfigFile)
	cp, worker := sb.Fleet().Machines()[0], sb.Fleet().Machines()[1]
	dir := t.TempDir()

	if out := c.Must("-n", worker.IP, "get", "mc", "v1alpha1", "-o", "yaml"); !strings.Contains(out, "kind: RegistryAuthConfig") || !strings.Contains(out, "type: MachineConfigs.config.talos.dev") {
		t.Fatalf("get mc -o yaml:\n%s", out)
	}

	if out := c.Must("-n", worker.IP, "get", "rd"); !strings.Contains(out, "machineconfigs.config.talos.dev") || !strings.Contains(out, " mc ") {
		t.Fatalf("get rd:\n%s", out)
	}

	// get -w follows the resource: its current state first (the watch runs until stopped).
	wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()

	watch, _ := exec.CommandContext(wctx, c.Bin, "--talosconfig", c.Conf, "-n", worker.IP, "get", "machinestatus", "-w").CombinedOutput()
	if !strings.Contains(string(watch), "MachineStatus") || !strings.Contains(string(watch), "running") {
		t.Fatalf("get machinestatus -w:\n%s", watch)
	}

	patch := filepath.Join(dir, "auth.yaml")
	_ = os.WriteFile(patch, []byte("apiVersion: v1alpha1\nkind: RegistryAuthConfig\nname: ghcr.io\nusername: patched-user\npassword: patched-secret\n"), 0o600)

	if out := c.Must("-n", worker.IP, "patch", "mc", "--mode=staged", "--patch", "@"+patch); !strings.Contains(out, "Staged configuration to be applied after the next reboot") {
		t.Fatalf("patch mc --mode=staged:\n%s", out)
	}

	talos := sandboxtest.TalosFor(t, sb, sandbox.TalosconfigFile)
	persisted, err := safe.StateGetByID[*talosconfig.MachineConfig](onNodeIPOrName(context.Background(), worker.IP), talos.COSI, talosconfig.PersistentID)
	if err != nil || persisted.Config().RegistryAuthConfigs()[sandbox.RegistryHost].Username() != "patched-user" {
		t.Fatalf("the patch did not stage the credential: %v", err)
	}

	current := c.Must("-n", worker.IP, "get", "mc", "persistent", "-o", "jsonpath={.spec}")
	changed := filepath.Join(dir, "changed.yaml")
	_ = os.WriteFile(changed, []byte(strings.Replace(current, "username: patched-user", "username: dry-run-user", 1)), 0o600)

	if out := c.Must("-n", worker.IP, "apply-config", "--dry-run", "--file", changed); !strings.Contains(out, "Dry run summary:") ||
		!strings.Contains(out, "Config diff:") || !strings.Contains(out, "+username: dry-run-user") {
		t.Fatalf("apply-config --dry-run:\n%s", out)
	}

	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte(replaceEndpoint(current)), 0o600)

	if out, err := c.Run("-n", worker.IP, "apply-config", "--file", bad); err == nil ||
		!strings.Contains(out, "InvalidArgument") || !strings.Contains(out, "hostname must not be blank") {
		t.Fatalf("apply-config of an invalid config: %v\n%s", err, out)
	}

	// Reboot with the default wait; fence the node first, so the witness sees a safe reboot.
	unfence := fence(t, sb.Kube(), worker.Name)
	before := worker.BootID()

	if out := c.Must("-n", worker.IP, "reboot"); !strings.Contains(out, "post check passed") {
		t.Fatalf("reboot:\n%s", out)
	}

	if after := worker.BootID(); after == "" || after == before || worker.Configured().Username != "patched-user" {
		t.Fatalf("after talosctl reboot: boot %q (before %q), configured %q", after, before, worker.Configured().Username)
	}

	unfence()

	out := c.Must("-n", cp.IP, "health", "--server=false", "--control-plane-nodes", cp.IP, "--worker-nodes", worker.IP, "--wait-timeout", "2m")
	for _, want := range []string{"etcd members to be control plane nodes: OK", "all nodes memory sizes: OK", "all nodes to finish boot sequence: OK",
		"all control plane static pods to be running: OK", "all k8s nodes to report schedulable: OK"} {
		if !strings.Contains(out, want) {
			t.Fatalf("health lacks %q:\n%s", want, out)
		}
	}

	// config new mints a CI certificate (the quickstart's step): the new talosconfig reads the
	// machine config, and carries only the roles asked for. Refused to an os:reader and on a
	// worker, as machined refuses them.
	minted := filepath.Join(dir, "ci.talosconfig")
	c.Must("-n", cp.IP, "config", "new", minted, "--roles", "os:reader", "--crt-ttl", "2h")

	ci := c
	ci.Conf = minted
	if out := ci.Must("-n", worker.IP, "get", "machinestatus"); !strings.Contains(out, "running") {
		t.Fatalf("the minted talosconfig: get machinestatus:\n%s", out)
	}

	if out := ci.Must("config", "info"); !strings.Contains(out, "os:reader") || strings.Contains(out, "os:admin") || !strings.Contains(out, "Certificate expires: 1 hour from now") {
		t.Fatalf("the minted talosconfig's info:\n%s", out)
	}

	if out, err := ci.Run("-n", cp.IP, "config", "new", filepath.Join(dir, "escalated"), "--roles", "os:admin"); err == nil || !strings.Contains(out, "PermissionDenied") {
		t.Fatalf("config new by an os:reader: %v\n%s", err, out)
	}

	if out, err := c.Run("-n", worker.IP, "config", "new", filepath.Join(dir, "from-a-worker")); err == nil || !strings.Contains(out, "control plane") {
		t.Fatalf("config new on a worker: %v\n%s", err, out)
	}

	if got := sb.Fleet().Stats().UnsafeWrites; got != 0 {
		t.Fatalf("unsafe writes: %+v", sb.Fleet().Stats().Unsafe)
	}

	t.Logf("talosctl %s drove the sandbox", c.Bin)
}

// replaceEndpoint blanks the control-plane endpoint of a config (what `talosctl validate`
// rejects with "invalid controlplane endpoint: hostname must not be blank").
func replaceEndpoint(cfg string) string {
	lines := strings.Split(cfg, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "endpoint: https://") {
			lines[i] = l[:strings.Index(l, "endpoint:")] + `endpoint: ""`
		}
	}

	return strings.Join(lines, "\n")
}
