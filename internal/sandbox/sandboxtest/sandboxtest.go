// Package sandboxtest gives each test package one sandbox (started in TestMain), so the
// suite pays the control plane's start-up once per package.
package sandboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/siderolabs/talos/pkg/machinery/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
)

var current *sandbox.Sandbox

// Main starts a sandbox with test-speed defaults (1 s heartbeat and autoscaler loop, 2 s
// reboots, no random scale events), runs the tests, stops the sandbox and fails if any of its
// processes survived. Use it from TestMain: sandboxtest.Main(m, sandbox.Options{...}).
func Main(m *testing.M, opts sandbox.Options) {
	os.Exit(run(m, opts))
}

func run(m *testing.M, opts sandbox.Options) int {
	dir, err := os.MkdirTemp("", "ghcrsync-sandbox-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)

		return 1
	}

	opts.Dir = dir
	if opts.Heartbeat == 0 {
		opts.Heartbeat = time.Second
	}

	if opts.Reboot == 0 {
		opts.Reboot = 2 * time.Second
	}

	if opts.AutoscalerInterval == 0 {
		opts.AutoscalerInterval = time.Second
	}

	logFile, err := os.Create(filepath.Join(dir, "sandbox.log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)

		return 1
	}
	defer logFile.Close()

	opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "sandbox", Level: hclog.Debug, Output: logFile})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	start := time.Now()

	sb, err := sandbox.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxtest: start sandbox: %v\n(logs in %s)\n", err, dir)

		return 1
	}

	fmt.Fprintf(os.Stderr, "sandboxtest: sandbox up in %s (%s)\n", time.Since(start).Round(time.Millisecond), dir)

	current = sb
	code := m.Run()

	pids := sb.ChildPIDs()
	sb.Stop()

	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			fmt.Fprintf(os.Stderr, "sandboxtest: process %d survived the sandbox's stop\n", pid)

			code = 1
		}
	}

	if code != 0 {
		fmt.Fprintf(os.Stderr, "sandboxtest: sandbox logs kept in %s\n", dir)
	} else {
		_ = os.RemoveAll(dir)
	}

	return code
}

// Get returns the package's sandbox.
func Get(t testing.TB) *sandbox.Sandbox {
	t.Helper()

	if current == nil {
		t.Fatal("sandboxtest: no sandbox: call sandboxtest.Main from TestMain")
	}

	return current
}

// Kube is a client built from the sandbox's kubeconfig, as ghcrsync would build it: through
// the API endpoint (and so affected when the endpoint node reboots).
func Kube(t testing.TB) kubernetes.Interface {
	t.Helper()

	return KubeFrom(t, Get(t).Path(sandbox.KubeconfigFile))
}

// KubeFrom is a client built from the given kubeconfig file.
func KubeFrom(t testing.TB, path string) kubernetes.Interface {
	t.Helper()

	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}

	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	return k
}

// Talos is the real machinery client built from the sandbox's talosconfig (file is
// sandbox.TalosconfigFile or sandbox.TalosconfigReaderFile).
func Talos(t testing.TB, file string) *client.Client {
	t.Helper()

	c, err := client.New(context.Background(), client.WithConfigFromFile(Get(t).Path(file)))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = c.Close() })

	return c
}

// Eventually retries check every 100 ms until it returns nil or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()

	deadline := time.Now().Add(timeout)

	for {
		err := check()
		if err == nil {
			return
		}

		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}

		time.Sleep(100 * time.Millisecond)
	}
}

// QuietAutoscaler pauses the sandbox's autoscaler and removes the candidate taints it already
// placed, so a test starts from a fleet with none; it resumes it when the test ends.
func QuietAutoscaler(t testing.TB) {
	t.Helper()

	sb := Get(t)
	ctx := context.Background()

	if _, err := sb.Do(ctx, "pause-autoscaler", sandbox.Request{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _, _ = sb.Do(context.Background(), "resume-autoscaler", sandbox.Request{}) })

	kube := sb.Kube()

	for _, m := range sb.Fleet().Machines() {
		if !m.Autoscaled {
			continue
		}

		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := kube.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}

			kept := n.Spec.Taints[:0]
			for _, taint := range n.Spec.Taints {
				if taint.Key != sandbox.DeletionCandidateTaint {
					kept = append(kept, taint)
				}
			}

			n.Spec.Taints = kept
			_, err = kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})

			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// PatchNode merge-patches a Node (a test's stand-in for an admin or another controller).
func PatchNode(t testing.TB, kube kubernetes.Interface, name string, v map[string]any) {
	t.Helper()

	b, _ := json.Marshal(v)
	if _, err := kube.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
