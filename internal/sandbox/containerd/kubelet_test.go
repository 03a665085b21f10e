package containerd_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/containerd"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// kubeletBinary is the real kubelet make test builds (scripts/build-kubelet.sh), or "".
func kubeletBinary() string {
	if p := os.Getenv("GHCRSYNC_KUBELET"); p != "" {
		return p
	}

	home, _ := os.UserHomeDir()
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		cache = filepath.Join(home, ".cache")
	}

	p := filepath.Join(cache, "ghcrsync", "kubelet", "v1.35.4", "kubelet")
	if _, err := os.Stat(p); err != nil {
		return ""
	}

	return p
}

// realNode is one real machine of a test: the sandbox's control plane and registry, a real
// containerd and a real kubelet registered as Node name.
type realNode struct {
	t       *testing.T
	ctx     context.Context
	sb      *sandbox.Sandbox
	reg     *registry.Registry
	node    *containerd.Node
	kubelet *containerd.Kubelet
	dir     string
	bin     string
	port    int
	name    string
	pause   string // the static binary of the runnable images
}

// newRealNode starts the sandbox, a real containerd holding auth (the machine's Talos
// credential) and pushes the runnable images; the kubelet is started by startKubelet.
func newRealNode(t *testing.T, auth *containerd.Auth) *realNode {
	t.Helper()

	bin := kubeletBinary()
	if err := containerd.Available(); err != nil || bin == "" {
		why := fmt.Sprintf("%v; kubelet: %q (make kubelet builds it)", err, bin)
		if os.Getenv("GHCRSYNC_REAL_RUNTIME") == "required" {
			t.Fatal(why)
		}

		t.Skipf("SKIPPED, no real node on this machine: %s", why)
	}

	sb := sandboxtest.Start(t, sandbox.Options{ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)

	r := &realNode{t: t, ctx: ctx, sb: sb, reg: sb.Registry(), dir: t.TempDir(), bin: bin, name: "real-node-1"}

	// A runnable pod sandbox image (public, as registry.k8s.io/pause is).
	r.pause = filepath.Join(r.dir, "pause-bin")
	if out, err := exec.Command("go", "build", "-o", r.pause, "./pause").CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}

	if err := r.reg.PushRunnable("ghcr.io/ghcrsync/pause:v1", r.pause, []string{"/pause"}, true); err != nil {
		t.Fatal(err)
	}

	node, err := containerd.StartWithPods(ctx, filepath.Join(r.dir, "containerd"), r.reg.Addr(), "10.254.0.0/24", auth)
	if err != nil {
		t.Fatal(err)
	}

	r.node = node
	t.Cleanup(containerd.RemoveBridge)
	t.Cleanup(func() { node.Teardown(context.Background()) })

	l, _ := net.Listen("tcp", "127.0.0.1:0")
	r.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()

	return r
}

// startKubelet starts the kubelet reporting bootID and waits until its Node is Ready with it.
func (r *realNode) startKubelet(bootID string) {
	r.t.Helper()

	kubeconfig := filepath.Join(r.dir, "kubelet.kubeconfig")
	if err := r.sb.WriteKubeconfig(kubeconfig, "system:node:"+r.name, "system:nodes"); err != nil {
		r.t.Fatal(err)
	}

	kl, err := containerd.StartKubelet(containerd.KubeletConfig{Binary: r.bin, Dir: filepath.Join(r.dir, "kubelet"), NodeName: r.name,
		NodeIP: "127.0.0.1", Kubeconfig: kubeconfig, Port: r.port, Runtime: r.node, BootID: bootID})
	if err != nil {
		r.t.Fatal(err)
	}

	r.kubelet = kl
	r.t.Cleanup(kl.Stop)

	if err := wait.PollUntilContextTimeout(r.ctx, time.Second, 120*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := r.sb.Kube().CoreV1().Nodes().Get(ctx, r.name, metav1.GetOptions{})
		if err != nil || (bootID != "" && n.Status.NodeInfo.BootID != bootID) {
			return false, nil
		}

		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}

		return false, nil
	}); err != nil {
		r.fail("the real kubelet's Node %s is not Ready with boot %q: %v", r.name, bootID, err)
	}
}

func (r *realNode) fail(format string, args ...any) {
	r.t.Helper()

	kl, ctd := []byte{}, []byte{}
	if r.kubelet != nil {
		kl, _ = os.ReadFile(r.kubelet.LogPath())
	}

	ctd, _ = os.ReadFile(r.node.LogPath())
	r.t.Fatalf(format+"\n--- kubelet log (tail)\n%s\n--- containerd log (tail)\n%s", append(args, tailLines(string(kl), 40), tailLines(string(ctd), 20))...)
}

// waitPod waits until the pod's container is running, has exited 0 ("ok"), or waits on a pull
// failure ("ErrImagePull"), and says which.
func (r *realNode) waitPod(ns, name, want string) {
	r.t.Helper()

	got := ""

	if err := wait.PollUntilContextTimeout(r.ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := r.sb.Kube().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}

		cs := p.Status.ContainerStatuses[0]

		switch {
		case cs.State.Running != nil, cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			got = "ok"
		case cs.State.Waiting != nil && (cs.State.Waiting.Reason == "ErrImagePull" || cs.State.Waiting.Reason == "ImagePullBackOff"):
			got = "ErrImagePull"
		case cs.State.Waiting != nil:
			got = cs.State.Waiting.Reason
		}

		return got == want, nil
	}); err != nil {
		r.fail("pod %s/%s: %q, want %q: %v", ns, name, got, want, err)
	}
}

// A real kubelet (1.35, built from the Kubernetes modules) registers with the sandbox's API
// server as an ordinary Node and runs pods on a real containerd: a pod whose private image it
// pulls through the pod's imagePullSecrets runs; with the secret's credential revoked in the
// registry, the pod gets a real ErrImagePull.
func TestRealKubeletRunsAPodWithAPullSecret(t *testing.T) {
	r := newRealNode(t, nil)
	r.startKubelet("")

	if err := r.reg.PushRunnable("ghcrsync/real-app:v1", r.pause, []string{"/pause"}, false); err != nil {
		t.Fatal(err)
	}

	r.reg.AddCredential("tenant", "tenant-secret")

	kube, ctx, ns := r.sb.Kube(), r.ctx, "real-node"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	auth := base64.StdEncoding.EncodeToString([]byte("tenant:tenant-secret"))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, r.reg.Addr(), auth)

	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pod := func(podName string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: ns}, Spec: corev1.PodSpec{
			NodeName: r.name, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}},
			Tolerations:      []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:       []corev1.Container{{Name: "app", Image: r.reg.Addr() + "/ghcrsync/real-app:v1", ImagePullPolicy: corev1.PullAlways}},
		}}
	}

	if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod("pulls"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	r.waitPod(ns, "pulls", "ok")

	// The secret's credential revoked: a new pod (pull policy Always) fails to pull, for real.
	r.reg.RevokeCredential("tenant")

	if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod("refused"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	r.waitPod(ns, "refused", "ErrImagePull")
}

// ghcrsync's own runtime probe pod (cluster.ProbePod: pull Always, no pull secret, no token,
// PodSecurity restricted) on a real node proves the credential the node's containerd holds, as
// its Talos config rendered it: it passes with a valid credential; with that credential revoked
// in the registry it fails with a real ErrImagePull (the node's runtime cannot pull); after a
// reboot that loads the new credential (containerd restarted on the re-rendered config, the
// kubelet reporting a new boot id) it passes again.
func TestRealNodeRuntimeProofFollowsTheNodesCredential(t *testing.T) {
	r := newRealNode(t, &containerd.Auth{Username: "fleet-old", Password: "old-secret"})
	r.reg.AddCredential("fleet-old", "old-secret")
	r.reg.AddCredential("fleet-new", "new-secret")
	r.startKubelet("11111111-1111-4111-8111-111111111111")

	if err := r.reg.PushRunnable("ghcrsync/real-probe:v1", r.pause, []string{"/pause", "true"}, false); err != nil {
		t.Fatal(err)
	}

	kube, ctx, ns := r.sb.Kube(), r.ctx, "ghcrsync-probe"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "exists") {
		t.Fatal(err)
	}

	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ghcrsync-probe"}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "exists") {
		t.Fatal(err)
	}

	probe := func(attempt string) string {
		p := cluster.ProbePod(r.name, cluster.Probe{Image: "ghcr.io/ghcrsync/real-probe:v1", Namespace: ns, ServiceAccount: "ghcrsync-probe"}, attempt)
		p.GenerateName, p.Name = "", "probe-"+attempt

		if _, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		return p.Name
	}

	r.waitPod(ns, probe("old-valid"), "ok")

	r.reg.RevokeCredential("fleet-old")
	r.waitPod(ns, probe("old-revoked"), "ErrImagePull")

	// The reboot that loads the new credential.
	r.kubelet.Stop()

	if err := r.node.Reboot(ctx, &containerd.Auth{Username: "fleet-new", Password: "new-secret"}); err != nil {
		t.Fatal(err)
	}

	r.startKubelet("22222222-2222-4222-8222-222222222222")
	r.waitPod(ns, probe("new-after-reboot"), "ok")

	var asNew bool
	for _, a := range r.reg.AccessLog() {
		asNew = asNew || (a.User == "fleet-new" && a.What == "manifest" && a.Status == 200)
	}

	if !asNew {
		t.Fatal("the registry never answered the node's containerd as fleet-new")
	}
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}

	return strings.Join(l, "\n")
}
