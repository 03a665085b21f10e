package containerd_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
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

// realFleet starts a sandbox whose first o.RealNodes workers are real nodes, or skips saying
// why (make test requires them: GHCRSYNC_REAL_RUNTIME=required).
func realFleet(t *testing.T, o sandbox.Options) *sandbox.Sandbox {
	t.Helper()

	if _, _, err := sandbox.RealNodeBinaries(); err != nil {
		if os.Getenv("GHCRSYNC_REAL_RUNTIME") == "required" {
			t.Fatal(err)
		}

		t.Skipf("SKIPPED, no real node on this machine: %v", err)
	}

	return sandboxtest.Start(t, o)
}

// pullSecret creates a dockerconfigjson secret for ghcr.io with user:password.
func pullSecret(t *testing.T, sb *sandbox.Sandbox, ns, name, user, password string) {
	t.Helper()

	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, registry.RegistryHost, auth)

	if _, err := sb.Kube().CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func namespace(t *testing.T, sb *sandbox.Sandbox, ns string) {
	t.Helper()

	if _, err := sb.Kube().CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pod runs image on node with pull policy and the pull secret ("" none).
func pod(t *testing.T, sb *sandbox.Sandbox, ns, name, node, image string, policy corev1.PullPolicy, secret string) {
	t.Helper()

	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
		NodeName: node, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
		Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		Containers:  []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: policy}},
	}}
	if secret != "" {
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: secret}}
	}

	if _, err := sb.Kube().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A real node is an ordinary Node of the sandbox's fleet: its kubelet (1.35, built from the
// Kubernetes modules) registers it with the machine's address, provider ID and boot id, on a
// real containerd. The kubelet's own decisions about pulls — a pull secret used, a revoked
// credential refused, an image reused under IfNotPresent only as 1.35's pulled-image
// credential verification allows — are compared with the simulated kubelet's on a simulated
// machine of the same fleet: where they differ, this test fails.
func TestRealAndSimulatedKubeletsPullAlike(t *testing.T) {
	sb := realFleet(t, sandbox.Options{ControlPlanes: 1, Workers: 2, RealNodes: 1, NoWorkloads: true, AutoscalerPaused: true, Heartbeat: time.Second})
	real, sim := "prod-worker-1", "prod-worker-2"

	m, _ := sb.Fleet().Machine(real)
	n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), real, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if !m.Real() || n.Status.NodeInfo.KubeletVersion != sandbox.KubeletVersion || !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://1.") ||
		n.Status.NodeInfo.BootID != m.BootID() || n.Spec.ProviderID != fmt.Sprintf("%s%d", sandbox.HcloudProviderIDPrefix, m.ServerID) ||
		len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Address != m.IP {
		t.Fatalf("%s is not the real node of machine %s (%s): %+v, %s", real, m.Name, m.IP, n.Status.NodeInfo, n.Spec.ProviderID)
	}

	reg := sb.Registry()
	reg.AddCredential("tenant", "tenant-secret")
	// The node's own credential (its Talos config's) cannot read the app: only the secret can.
	reg.DenyRepository(sb.OldCredential().Username, registry.PrivateOrg+"/app")

	app := registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1"
	steps := []struct {
		name   string
		policy corev1.PullPolicy
		secret string
		revoke bool
	}{
		{name: "secret-pulls", policy: corev1.PullAlways, secret: "pull"},
		// Pulled with a secret: a pod without it must not start from the cached image; the
		// kubelet asks the registry with the node's credential, which is refused.
		{name: "no-secret-reuse", policy: corev1.PullIfNotPresent},
		// The same secret's credential: the image already present is used, no pull.
		{name: "same-secret-reuse", policy: corev1.PullIfNotPresent, secret: "pull"},
		{name: "revoked", policy: corev1.PullAlways, secret: "pull", revoke: true},
	}

	got := map[string][]string{}

	for _, node := range []string{real, sim} {
		ns := "pulls-" + node
		namespace(t, sb, ns)
		pullSecret(t, sb, ns, "pull", "tenant", "tenant-secret")
	}

	for _, s := range steps {
		if s.revoke {
			reg.RevokeCredential("tenant")
		}

		for _, node := range []string{real, sim} {
			ns := "pulls-" + node
			pod(t, sb, ns, s.name, node, app, s.policy, s.secret)
			state, image := sandboxtest.PullOutcome(t, sb, ns, s.name)
			got[node] = append(got[node], s.name+": "+state+" "+image)
		}
	}

	want := []string{"secret-pulls: ok pulled", "no-secret-reuse: ErrImagePull ", "same-secret-reuse: ok present", "revoked: ErrImagePull "}
	if strings.Join(got[real], "\n") != strings.Join(want, "\n") || strings.Join(got[sim], "\n") != strings.Join(want, "\n") {
		t.Fatalf("the kubelets decide differently:\nreal (%s):\n  %s\nsimulated:\n  %s\nwant:\n  %s", real,
			strings.Join(got[real], "\n  "), strings.Join(got[sim], "\n  "), strings.Join(want, "\n  "))
	}
}

// ghcrsync's own runtime probe pod (probe.Pod: pull Always, no pull secret, no token,
// PodSecurity restricted) on a real node proves the credential the node's containerd holds as
// its Talos config rendered it: it passes with a valid credential; with that credential revoked
// in the registry it fails with a real ErrImagePull; a new credential written into the machine
// config (staged: Talos 1.13 loads registry auth at boot) changes nothing until the reboot,
// after which the kubelet reports the new boot and the probe passes, the registry answering
// the node's containerd as the new user.
func TestRealNodeRuntimeProofFollowsTheNodesTalosConfig(t *testing.T) {
	sb := realFleet(t, sandbox.Options{ControlPlanes: 1, Workers: 1, RealNodes: 1, NoWorkloads: true, AutoscalerPaused: true, Heartbeat: time.Second, Reboot: time.Second})
	node := "prod-worker-1"
	m, _ := sb.Fleet().Machine(node)
	reg := sb.Registry()

	probe := func(attempt string) string {
		p := probe.Pod(node, plan.Probe{Image: registry.RegistryHost + "/" + registry.PrivateImages[0], Namespace: sandbox.ProbeNamespace, ServiceAccount: sandbox.ProbeServiceAccount}, attempt)
		p.GenerateName, p.Name = "", "probe-"+attempt

		if _, err := sb.Kube().CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		state, _ := sandboxtest.PullOutcome(t, sb, p.Namespace, p.Name)

		return state
	}

	if got := probe("old-valid"); got != "ok" {
		t.Fatalf("the probe with the node's valid credential: %s", got)
	}

	old := sb.OldCredential()
	reg.RevokeCredential(old.Username)

	if got := probe("old-revoked"); got != "ErrImagePull" {
		t.Fatalf("the probe with the node's credential revoked: %s, want ErrImagePull", got)
	}

	// The new credential in the machine config, through the Talos API, then the reboot.
	next := sb.NewCredential()
	sandboxtest.StageCredential(t, sb, node, next)

	if got := probe("staged"); got != "ErrImagePull" {
		t.Fatalf("the probe after the new credential was staged, before the reboot: %s, want ErrImagePull", got)
	}

	bootBefore := m.BootID()
	if _, err := sb.Do(context.Background(), "reboot", sandbox.Request{Node: node}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 2*time.Minute, node+" Ready with a new boot", func() error {
		n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if n.Status.NodeInfo.BootID == bootBefore || n.Status.NodeInfo.BootID != m.BootID() {
			return fmt.Errorf("boot %q", n.Status.NodeInfo.BootID)
		}

		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(time.Now().Add(-10*time.Second)) {
				return nil
			}
		}

		return fmt.Errorf("not Ready")
	})

	if got := probe("after-reboot"); got != "ok" {
		t.Fatalf("the probe after the reboot that loaded the new credential: %s", got)
	}

	if !reg.ServedManifest(next.Username, "containerd") {
		t.Fatalf("the registry never answered the node's containerd as %s", next.Username)
	}
}
