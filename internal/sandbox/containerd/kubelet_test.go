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

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/containerd"
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

// A real kubelet (1.35, built from the Kubernetes modules) registers with the sandbox's API
// server as an ordinary Node and runs pods on a real containerd: a pod whose private image it
// pulls through the pod's imagePullSecrets runs; with the secret's credential revoked in the
// registry, the pod gets a real ErrImagePull.
func TestRealKubeletRunsAPodWithAPullSecret(t *testing.T) {
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
	defer cancel()

	reg := sb.Registry()
	dir := t.TempDir()

	// A runnable pod sandbox image (public, as registry.k8s.io/pause is) and a runnable private image.
	pause := filepath.Join(dir, "pause-bin")
	if out, err := exec.Command("go", "build", "-o", pause, "./pause").CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}

	if err := reg.PushRunnable("ghcr.io/ghcrsync/pause:v1", pause, []string{"/pause"}, true); err != nil {
		t.Fatal(err)
	}

	if err := reg.PushRunnable("ghcrsync/real-app:v1", pause, []string{"/pause"}, false); err != nil {
		t.Fatal(err)
	}

	reg.AddCredential("tenant", "tenant-secret")

	node, err := containerd.StartWithPods(ctx, filepath.Join(dir, "containerd"), reg.Addr(), "10.254.0.0/24", nil)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(containerd.RemoveBridge)
	t.Cleanup(func() { node.Teardown(context.Background()) })

	const name = "real-node-1"

	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	if err := sb.WriteKubeconfig(kubeconfig, "system:node:"+name, "system:nodes"); err != nil {
		t.Fatal(err)
	}

	l, _ := net.Listen("tcp", "127.0.0.1:0")
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()

	kl, err := containerd.StartKubelet(ctx, containerd.KubeletConfig{Binary: bin, Dir: filepath.Join(dir, "kubelet"), NodeName: name,
		NodeIP: "127.0.0.1", Kubeconfig: kubeconfig, Port: port, Runtime: node})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(kl.Stop)

	kube := sb.Kube()
	failNow := func(format string, args ...any) {
		t.Helper()
		kl, _ := os.ReadFile(kl.LogPath())
		ctd, _ := os.ReadFile(node.LogPath())
		t.Fatalf(format+"\n--- kubelet log (tail)\n%s\n--- containerd log (tail)\n%s", append(args, tailLines(string(kl), 40), tailLines(string(ctd), 20))...)
	}

	if err := wait.PollUntilContextTimeout(ctx, time.Second, 120*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}

		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}

		return false, nil
	}); err != nil {
		failNow("the real kubelet's Node %s is not Ready: %v", name, err)
	}

	ns := "real-node"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	auth := base64.StdEncoding.EncodeToString([]byte("tenant:tenant-secret"))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.Addr(), auth)

	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pod := func(podName string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: ns}, Spec: corev1.PodSpec{
			NodeName: name, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}},
			Tolerations:      []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:       []corev1.Container{{Name: "app", Image: reg.Addr() + "/ghcrsync/real-app:v1", ImagePullPolicy: corev1.PullAlways}},
		}}
	}
	state := func(podName string) (running bool, waiting string) {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, ""
		}

		cs := p.Status.ContainerStatuses[0]
		if cs.State.Waiting != nil {
			return false, cs.State.Waiting.Reason
		}

		return cs.State.Running != nil, ""
	}

	if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod("pulls"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(context.Context) (bool, error) {
		running, _ := state("pulls")
		return running, nil
	}); err != nil {
		_, w := state("pulls")
		failNow("the pod with the pull secret is not running (waiting: %q): %v", w, err)
	}

	// The secret's credential revoked: a new pod (pull policy Always) fails to pull, for real.
	reg.RevokeCredential("tenant")

	if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod("refused"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(context.Context) (bool, error) {
		_, w := state("refused")
		return w == "ErrImagePull" || w == "ImagePullBackOff", nil
	}); err != nil {
		_, w := state("refused")
		failNow("the pod with a revoked credential did not get ErrImagePull (waiting: %q): %v", w, err)
	}

	for _, p := range []string{"pulls", "refused"} {
		_ = kube.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}

	return strings.Join(l, "\n")
}
