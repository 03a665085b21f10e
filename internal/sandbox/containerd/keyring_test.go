package containerd_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
)

// writeKeyring writes the kubelet's node keyring, ROOT/config.json, with cred for the registry
// (a temp file renamed over it, as any careful writer does).
func writeKeyring(t *testing.T, root string, cred sandbox.Credential) time.Time {
	t.Helper()

	auth := base64.StdEncoding.EncodeToString([]byte(cred.Username + ":" + cred.Password))
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{registry.RegistryHost: map[string]string{"auth": auth}}})

	tmp := filepath.Join(root, ".config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}

	if err := os.Rename(tmp, filepath.Join(root, "config.json")); err != nil {
		t.Fatal(err)
	}

	return time.Now()
}

// prober runs the runtime probe (probe.Pod: no pull secret, imagePullPolicy Always, the image
// by tag) on a node, a new pod per attempt.
type prober struct {
	t    *testing.T
	sb   *sandbox.Sandbox
	node string
	n    int
}

func (p *prober) once() string {
	p.t.Helper()
	p.n++

	pod := probe.Pod(p.node, plan.Probe{Image: registry.RegistryHost + "/" + registry.PrivateImages[0], Namespace: sandbox.ProbeNamespace,
		ServiceAccount: sandbox.ProbeServiceAccount}, fmt.Sprintf("%d", p.n))
	pod.GenerateName, pod.Name = "", fmt.Sprintf("keyring-%s-%d", p.node, p.n)

	kube := p.sb.Kube()
	if _, err := kube.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}

	state, _ := sandboxtest.PullOutcome(p.t, p.sb, pod.Namespace, pod.Name)
	_ = kube.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})

	return state
}

// until probes every 5 s until a probe passes, and returns how long after since that was (false:
// none passed within limit, reported as the test's error).
func (p *prober) until(since time.Time, limit time.Duration) (time.Duration, bool) {
	p.t.Helper()

	for {
		if p.once() == "ok" {
			return time.Since(since), true
		}

		if time.Since(since) > limit {
			p.t.Errorf("%s: no probe passed within %s of the keyring write", p.node, limit)

			return 0, false
		}

		time.Sleep(5 * time.Second)
	}
}

// The zero-reboot route, proved on the real kubelet (1.35.4) and containerd (1.6) before ghcrsync
// builds on it: a Talos 1.13 node's containerd holds a credential the registry has revoked (it
// loads registry auth only at boot), and the new credential written into the kubelet's node
// keyring (ROOT/config.json) makes the runtime probe — no pull secret, pull Always — pass with
// no restart of anything: the kubelet sends the keyring's credential with the CRI PullImage,
// and containerd uses a request's credential before its own. Measured per node, from the write
// to the first passing probe:
//   - cold: no pull since the kubelet started, so its keyring cache is empty and expired: the
//     first probe after the write reads the file;
//   - warm: a pull a moment before the write filled the kubelet's 5-minute cache with "no
//     keyring": the probe fails until the cache expires (≤ 5 min), then passes;
//   - rewritten: a keyring rewritten with another credential (the old one revoked) is read at
//     the next expiry of the cache that read it (≤ 5 min).
//
// Beside the route: a pod with a valid pull secret pulls while the node's own credential is
// revoked (a proof with a pull secret would be vacuous: the probe carries none); an image pulled
// before the write with the node's credential is reused by a new IfNotPresent pod without
// asking the registry (KEP-2535's credential verification forces no re-pull); and the
// containerd and kubelet processes are the same at the end as at the start.
func TestKubeletKeyringTakesANewCredentialWithNoRestart(t *testing.T) {
	sb := realFleet(t, sandbox.Options{ControlPlanes: 1, Workers: 4, RealNodes: 2, TalosVersion: "1.13", NoWorkloads: true, AutoscalerPaused: true, Heartbeat: time.Second})
	cold, warm := "prod-worker-1", "prod-worker-2"
	// Their simulated twins (the simulated kubelet's keyring, its cache the real one's five
	// minutes): each decision below is compared with the real kubelet's.
	simCold, simWarm := "prod-worker-3", "prod-worker-4"
	reg := sb.Registry()
	ctx := context.Background()
	app := registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1"

	machines := map[string]*sandbox.Machine{}
	pids := map[string][]int{}

	for _, node := range []string{cold, warm} {
		m, _ := sb.Fleet().Machine(node)
		if !m.Real() {
			t.Fatalf("%s is not a real node", node)
		}

		machines[node], pids[node] = m, m.RuntimePIDs()
	}

	// warm: an app pod pulled with the node's credential (it keeps running), which also fills
	// the kubelet's keyring cache with "no keyring".
	ns := "keyring"
	namespace(t, sb, ns)
	pod(t, sb, ns, "resident", warm, app, corev1.PullIfNotPresent, "")
	pod(t, sb, ns, "sim-resident", simWarm, app, corev1.PullIfNotPresent, "")

	for _, p := range []string{"resident", "sim-resident"} {
		if state, image := sandboxtest.PullOutcome(t, sb, ns, p); state != "ok" || image != "pulled" {
			t.Fatalf("the %s pod: %s %s", p, state, image)
		}
	}

	filled := time.Now()

	old, next := sb.OldCredential(), sb.NewCredential()
	reg.RevokeCredential(old.Username)

	// Both containerds hold the revoked credential: asked with no credential of the kubelet's,
	// they are refused (a CRI pull straight to containerd: the kubelet's cache is not touched).
	for _, node := range []string{cold, warm} {
		if _, err := machines[node].RuntimePull(ctx, registry.RegistryHost+"/"+registry.PrivateImages[0]); err == nil {
			t.Fatalf("%s's containerd pulled with its revoked credential", node)
		}
	}

	// A pod with a valid pull secret pulls on warm all the same: a proof that carried one would
	// prove the secret, not the node.
	pullSecret(t, sb, ns, "valid", next.Username, next.Password)
	pod(t, sb, ns, "with-secret", warm, app, corev1.PullAlways, "valid")

	if state, _ := sandboxtest.PullOutcome(t, sb, ns, "with-secret"); state != "ok" {
		t.Fatalf("a pod with a valid pull secret on %s: %s", warm, state)
	}

	logBefore := len(reg.AccessLog())

	var (
		mu       sync.Mutex
		measured = map[string]float64{} // seconds
		wg       sync.WaitGroup
	)

	measure := func(name string, d time.Duration, ok bool) bool {
		if !ok {
			return false
		}

		mu.Lock()
		defer mu.Unlock()

		measured[name] = d.Seconds()
		t.Logf("kubelet keyring: %s: from the write to the first passing probe %s", name, d.Round(100*time.Millisecond))

		return true
	}

	const limit = 5*time.Minute + 45*time.Second

	// What each kubelet decided: the first probe right after the write, then whether one passed
	// within the cache's lifetime.
	decisions := map[string]string{}

	decide := func(kind, first string, ok bool) {
		mu.Lock()
		defer mu.Unlock()

		decisions[kind] = fmt.Sprintf("first probe %s, then passed %t", first, ok)
	}

	twin := func(node, kind string, m *sandbox.Machine) {
		defer wg.Done()

		p := &prober{t: t, sb: sb, node: node}
		written := writeKeyring(t, m.KubeletRootDir(), next)
		first := p.once()

		if first == "ok" {
			decide(kind, first, true)

			return
		}

		d, ok := p.until(written, limit)
		decide(kind, first, ok)
		measure(kind, d, ok)
	}

	wg.Add(4)

	for _, s := range []struct{ node, kind string }{{simCold, "cold (simulated kubelet)"}, {simWarm, "warm (simulated kubelet)"}} {
		m, _ := sb.Fleet().Machine(s.node)
		go twin(s.node, s.kind, m)
	}

	go func() { // warm: the first probe after the write fails (the cache says "no keyring")
		defer wg.Done()

		p := &prober{t: t, sb: sb, node: warm}
		written := writeKeyring(t, machines[warm].KubeletRootDir(), next)

		got := p.once()
		if got != "ErrImagePull" && time.Since(filled) < 4*time.Minute {
			t.Errorf("%s: the probe right after the write, within the cache's 5 minutes: %s, want ErrImagePull", warm, got)
		}

		before := written.Sub(filled).Round(time.Second)
		d, ok := p.until(written, limit)
		measure("warm (cache filled "+before.String()+" before the write)", d, ok)
		decide("warm (real kubelet)", got, ok)
	}()

	// cold gets a credential of its own: its rewrite revokes it, and warm's must stay valid.
	coldCred, err := sb.RotateSecret("keyring-cold")
	if err != nil {
		t.Fatal(err)
	}

	go func() { // cold, then rewritten
		defer wg.Done()

		p := &prober{t: t, sb: sb, node: cold}
		written := writeKeyring(t, machines[cold].KubeletRootDir(), coldCred)

		first := p.once()
		decide("cold (real kubelet)", first, first == "ok")

		if d, ok := p.until(written, limit); !measure("cold (no pull since the kubelet started)", d, ok) {
			return
		}

		// The cache now holds coldCred; the keyring is rewritten with a third credential and
		// coldCred revoked: the probe fails until the cache expires, then passes.
		third, err := sb.RotateSecret("keyring-third")
		if err != nil {
			t.Error(err)

			return
		}

		rewritten := writeKeyring(t, machines[cold].KubeletRootDir(), third)
		reg.RevokeCredential(coldCred.Username)

		if got := p.once(); got != "ErrImagePull" {
			t.Errorf("%s: the probe right after the keyring was rewritten: %s, want ErrImagePull (the cache holds the revoked credential)", cold, got)
		}

		d, ok := p.until(rewritten, limit)
		measure("rewritten", d, ok)
	}()

	wg.Wait()

	if t.Failed() {
		return
	}

	// The simulated kubelet decides as the real one does, at the cache's boundary.
	for _, kind := range []string{"cold", "warm"} {
		if real, sim := decisions[kind+" (real kubelet)"], decisions[kind+" (simulated kubelet)"]; real != sim || real == "" {
			t.Errorf("%s: the real kubelet: %s; the simulated one: %s", kind, real, sim)
		}
	}

	// KEP-2535: an image the node pulled with its own credential before the write is reused by a
	// new IfNotPresent pod, without a request to the registry for it.
	pod(t, sb, ns, "reuse", warm, app, corev1.PullIfNotPresent, "")

	if state, image := sandboxtest.PullOutcome(t, sb, ns, "reuse"); state != "ok" || image != "present" {
		t.Fatalf("a new IfNotPresent pod of an image pulled before the write: %s %s, want ok present", state, image)
	}

	for _, a := range reg.AccessLog()[logBefore:] {
		if a.What == "manifest" && strings.Contains(a.Path, "/app/") {
			t.Fatalf("the registry was asked for the app image after the keyring write: %+v", a)
		}
	}

	if p, err := sb.Kube().CoreV1().Pods(ns).Get(ctx, "resident", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning ||
		p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("the resident pod: %v %+v", err, p.Status)
	}

	// Nothing restarted: containerd and the kubelet are the processes they were.
	for node, m := range machines {
		if now := m.RuntimePIDs(); !slices.Equal(now, pids[node]) {
			t.Fatalf("%s's containerd and kubelet were %v and are %v: something restarted", node, pids[node], now)
		}
	}

	if out := os.Getenv("GHCRSYNC_KEYRING_EVIDENCE"); out != "" {
		b, _ := json.MarshalIndent(measured, "", "  ")
		_ = os.WriteFile(out, b, 0o600)
	}
}
