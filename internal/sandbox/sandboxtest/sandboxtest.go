// Package sandboxtest gives each test package one sandbox (started in TestMain), so the
// suite pays the control plane's start-up once per package.
package sandboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/hashicorp/go-hclog"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/registryauth"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
)

var (
	opts    sandbox.Options
	dir     string
	once    sync.Once
	current *sandbox.Sandbox
	failure error
)

// Main gives the package's tests one sandbox with test-speed defaults (1 s heartbeat and
// autoscaler loop, 2 s reboots, no random scale events), started by the first test that asks for
// it (so a package's unit tests never wait for it), stopped after the tests; it fails the run if
// any of its processes survived. With -short, tests that need it are skipped. Use it from
// TestMain: sandboxtest.Main(m, sandbox.Options{...}).
func Main(m *testing.M, o sandbox.Options) {
	flag.Parse()

	opts = o

	code := m.Run()

	if current != nil {
		code = stop(code)
	}

	if dir != "" && code == 0 {
		_ = os.RemoveAll(dir)
	}

	// The package's ghcrsync binary (Binary), 140 MB a package: kept, it filled the disk after
	// a few runs of the suite.
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}

	os.Exit(code)
}

func start() (*sandbox.Sandbox, error) {
	var err error
	if dir, err = os.MkdirTemp("", "ghcrsync-sandbox-"); err != nil {
		return nil, err
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
		return nil, err
	}

	opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "sandbox", Level: hclog.Debug, Output: logFile})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	begin := time.Now()

	sb, err := sandbox.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("sandboxtest: start sandbox: %w (logs in %s)", err, dir)
	}

	fmt.Fprintf(os.Stderr, "sandboxtest: sandbox up in %s (%s)\n", time.Since(begin).Round(time.Millisecond), dir)

	return sb, nil
}

// stop stops the sandbox and checks that none of its processes survived.
func stop(code int) int {
	pids := current.ChildPIDs()
	current.Stop()

	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			fmt.Fprintf(os.Stderr, "sandboxtest: process %d survived the sandbox's stop\n", pid)

			code = 1
		}
	}

	if code != 0 {
		fmt.Fprintf(os.Stderr, "sandboxtest: sandbox logs kept in %s\n", dir)
	}

	return code
}

// Get returns the package's sandbox, starting it on first use; with -short it skips the test.
func Get(t testing.TB) *sandbox.Sandbox {
	t.Helper()

	if testing.Short() {
		t.Skip("needs the sandbox (a real control plane); skipped with -short")
	}

	shard(t)

	once.Do(func() { current, failure = start() })

	if failure != nil {
		t.Fatal(failure)
	}

	if current == nil {
		t.Fatal("sandboxtest: no sandbox: call sandboxtest.Main from TestMain")
	}

	return current
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary builds cmd/ghcrsync once per test package and returns its path: for tests that drive
// the real binary (signals, kill -9, another identity's environment).
func Binary(t testing.TB) string {
	t.Helper()

	binOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}

		d, err := os.MkdirTemp("", "ghcrsync-bin-")
		if err != nil {
			binErr = err

			return
		}

		binPath = filepath.Join(d, "ghcrsync")

		// Static, as `make build` and the image build it (a Job's process runs chrooted).
		build := exec.Command(goBin, "build", "-o", binPath, "github.com/ghcrsync/ghcrsync/cmd/ghcrsync")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")

		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build ghcrsync: %w\n%s", err, out)
		}
	})

	if binErr != nil {
		t.Fatal(binErr)
	}

	return binPath
}

// Run runs the ghcrsync binary (Binary) with args in a bare environment: PATH, a fresh HOME,
// and the sandbox's age key for SOPS. It returns the exit code and what it printed.
func Run(t testing.TB, sb *sandbox.Sandbox, args ...string) (code int, stdout, stderr string) {
	t.Helper()

	cmd := exec.Command(Binary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}

	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()

	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
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

// DynamicFrom is a dynamic client built from the given kubeconfig file.
func DynamicFrom(t testing.TB, path string) dynamic.Interface {
	t.Helper()

	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}

	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	return d
}

// Talos is the real machinery client built from the sandbox's talosconfig (file is
// sandbox.TalosconfigFile or sandbox.TalosconfigReaderFile).
func Talos(t testing.TB, file string) *client.Client {
	t.Helper()

	return TalosFor(t, Get(t), file)
}

// TalosFor is Talos for a given sandbox (one a test started with Start).
func TalosFor(t testing.TB, sb *sandbox.Sandbox, file string) *client.Client {
	t.Helper()

	c, err := client.New(context.Background(), client.WithConfigFromFile(sb.Path(file)))
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

// EditNode is an operator's read-modify-write of a Node, as kubectl edit makes it: read, change,
// update, and read and change again when a write (a kubelet heartbeat) landed in between.
func EditNode(ctx context.Context, kube kubernetes.Interface, name string, change func(*corev1.Node)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		change(n)
		_, err = kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})

		return err
	})
}

// ShardEnv splits a package's sandbox tests over processes: with ShardEnv=i/n, the k-th top-level
// test to ask for a sandbox (Get or Start) runs in the process of shard k mod n and is skipped in
// the others. Every process meets the tests in the same order, so each runs exactly once; a
// process whose tests are all elsewhere never starts a sandbox. `make test APPLY_SHARDS=n`
// runs the apply package so (scripts/test.sh), for a machine with cores to spare.
const ShardEnv = "GHCRSYNC_SANDBOX_SHARD"

var shards struct {
	sync.Mutex
	seen map[string]int
}

func shard(t testing.TB) {
	t.Helper()

	spec := os.Getenv(ShardEnv)
	if spec == "" {
		return
	}

	var i, n int
	if _, err := fmt.Sscanf(spec, "%d/%d", &i, &n); err != nil || n < 1 || i < 0 || i >= n {
		t.Fatalf("%s=%q: want i/n with 0 <= i < n (or unset: every test)", ShardEnv, spec)
	}

	top, _, _ := strings.Cut(t.Name(), "/")

	shards.Lock()

	k, ok := shards.seen[top]
	if !ok {
		if shards.seen == nil {
			shards.seen = map[string]int{}
		}

		k = len(shards.seen)
		shards.seen[top] = k
	}

	shards.Unlock()

	if k%n != i {
		t.Skipf("runs in sandbox shard %d/%d (%s=%s)", k%n, n, ShardEnv, spec)
	}
}

// Start starts a sandbox of the test's own (in a temporary folder, stopped when the test ends),
// for a test that needs another shape than the package's; with -short it skips the test.
func Start(t testing.TB, o sandbox.Options) *sandbox.Sandbox {
	t.Helper()

	if testing.Short() {
		t.Skip("needs a sandbox (a real control plane); skipped with -short")
	}

	shard(t)

	if o.Dir == "" {
		o.Dir = t.TempDir()
	}

	sb, err := sandbox.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(sb.Stop)

	return sb
}

// SyncBuffer is a bytes.Buffer safe for one writer and readers in other goroutines: a child
// process's output read while it runs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.b.String()
}

// KillWhen starts cmd, waits (up to two minutes) until its stderr shows marker, kills it with
// SIGKILL — no chance to wind down, as an OOM kill or a runner that gives up — and returns
// what it printed.
func KillWhen(t testing.TB, cmd *exec.Cmd, marker string) (stdout, stderr string) {
	t.Helper()

	var out, errb SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb

	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	Eventually(t, 2*time.Minute, "output "+marker, func() error {
		if strings.Contains(errb.String(), marker) {
			return nil
		}

		return fmt.Errorf("not yet:\n%s", errb.String())
	})

	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	return out.String(), errb.String()
}

// CopyConfig copies the sandbox's ghcrsync.hcl into dir with absolute paths (its kubeconfig,
// talosconfig and SOPS file; the local state file in dir), applies edit, and returns its path.
func CopyConfig(t testing.TB, sb *sandbox.Sandbox, dir string, edit func(string) string) string {
	t.Helper()

	b, err := os.ReadFile(sb.Path(sandbox.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	s := string(b)
	for _, f := range []string{sandbox.KubeconfigFile, sandbox.TalosconfigFile, sandbox.SecretFile} {
		s = strings.Replace(s, `"`+f+`"`, `"`+sb.Path(f)+`"`, 1)
	}

	s = strings.Replace(s, `"ghcrsync.state.json"`, `"`+filepath.Join(dir, "ghcrsync.state.json")+`"`, 1)

	if edit != nil {
		s = edit(s)
	}

	path := filepath.Join(dir, "ghcrsync.hcl")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}

	return path
}

// PinnedDeploymentObject is a one-replica Deployment ns/name of a pause pod pinned to node,
// labelled app=name.
func PinnedDeploymentObject(ns, name, node string) *appsv1.Deployment {
	labels := map[string]string{"app": name}

	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": node}, TerminationGracePeriodSeconds: ptr.To(int64(0)),
					Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
}

// PinnedDeployment creates namespace ns (deleted at the end of the test) holding a one-replica
// Deployment, name, of a pause pod pinned to node (labels app=name), and returns its labels.
func PinnedDeployment(t testing.TB, kube kubernetes.Interface, ns, name, node string) map[string]string {
	t.Helper()

	ctx := context.Background()

	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	labels := map[string]string{"app": name}
	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, PinnedDeploymentObject(ns, name, node), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The drain a test aims at this pod must find it: wait until it runs on the node.
	Eventually(t, 60*time.Second, "deployment "+ns+"/"+name+"'s pod runs on "+node, func() error {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return err
		}

		for _, p := range pods.Items {
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}

		return fmt.Errorf("%d pods, none running on %s", len(pods.Items), node)
	})

	return labels
}

// Talosctl is the real talosctl (scripts/build-talosctl.sh, `make talosctl`) run with one
// talosconfig, as an operator runs it against the sandbox's machines.
type Talosctl struct {
	t testing.TB
	// Bin and Conf are the binary and the talosconfig it is run with.
	Bin, Conf string
}

// NewTalosctl finds the real talosctl (GHCRSYNC_TALOSCTL, else the build cache) and skips the
// test when it is not built.
func NewTalosctl(t testing.TB, talosconfig string) Talosctl {
	t.Helper()

	bin := sandbox.CachePath("GHCRSYNC_TALOSCTL", "talosctl", "v1.13.9", "talosctl")

	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no talosctl at %s (build it with `make talosctl`): %v", bin, err)
	}

	return Talosctl{t: t, Bin: bin, Conf: talosconfig}
}

// Run runs talosctl with args (3 minutes at most) and returns its output.
func (c Talosctl) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cmd := exec.CommandContext(ctx, c.Bin, append([]string{"--talosconfig", c.Conf}, args...)...)

	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()

	return out.String(), err
}

// Must is Run, failing the test on an error (naming the subcommand and its output, never a
// file's content passed in args).
func (c Talosctl) Must(args ...string) string {
	c.t.Helper()

	out, err := c.Run(args...)
	if err != nil {
		c.t.Fatalf("talosctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	return out
}

// Cordon cordons the node as an operator does (`kubectl cordon`: spec.unschedulable).
func Cordon(t testing.TB, kube kubernetes.Interface, name string) {
	t.Helper()
	PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": true}})
}

// Limit is what a budget allows: MinAvailable or MaxUnavailable.
type Limit func(*policyv1.PodDisruptionBudgetSpec)

// MinAvailable keeps n pods available.
func MinAvailable(n int32) Limit {
	return func(s *policyv1.PodDisruptionBudgetSpec) { s.MinAvailable = ptr.To(intstr.FromInt32(n)) }
}

// MaxUnavailable lets n pods be unavailable.
func MaxUnavailable(n int32) Limit {
	return func(s *policyv1.PodDisruptionBudgetSpec) { s.MaxUnavailable = ptr.To(intstr.FromInt32(n)) }
}

// Budget replaces the PodDisruptionBudget ns/name with one selecting the pods labelled labels
// under limit, and waits until the controller-manager's disruption controller has judged it
// (observed its generation and counted healthy pods), so a drain or a plan meets it as written.
// It returns that judgement.
func Budget(t testing.TB, kube kubernetes.Interface, ns, name string, labels map[string]string, limit Limit, healthy int32) policyv1.PodDisruptionBudgetStatus {
	t.Helper()

	ctx := context.Background()
	pdbs := kube.PolicyV1().PodDisruptionBudgets(ns)
	_ = pdbs.Delete(ctx, name, metav1.DeleteOptions{})

	spec := policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}}
	limit(&spec)

	if _, err := pdbs.Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	status, err := JudgedBudget(ctx, kube, ns, name, healthy)
	if err != nil {
		t.Fatal(err)
	}

	return status
}

// JudgedBudget waits, a minute at most, until the disruption controller has judged the budget
// ns/name (observed its generation, counted healthy pods) and returns its judgement.
func JudgedBudget(ctx context.Context, kube kubernetes.Interface, ns, name string, healthy int32) (policyv1.PodDisruptionBudgetStatus, error) {
	var last string

	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		b, err := kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && b.Status.ObservedGeneration >= b.Generation && b.Status.CurrentHealthy == healthy {
			return b.Status, nil
		}

		last = fmt.Sprintf("status %+v (%v)", b.Status, err)
	}

	return policyv1.PodDisruptionBudgetStatus{}, fmt.Errorf("the disruption controller did not judge budget %s/%s with %d healthy pod(s) within a minute: %s", ns, name, healthy, last)
}

// Mutations lists the mutating requests user made (create, update, patch, delete,
// deletecollection), as "VERB URI STATUS", from the apiserver's audit log: what a test checks
// was, or was not, written by an identity.
func Mutations(t testing.TB, sb *sandbox.Sandbox, user string) []string {
	t.Helper()

	evs, err := sb.AuditedWrites(user)
	if err != nil {
		t.Fatal(err)
	}

	var out []string

	for _, ev := range evs {
		switch ev.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
			out = append(out, fmt.Sprintf("%s %s %d", ev.Verb, ev.RequestURI, ev.ResponseStatus.Code))
		}
	}

	return out
}

// StageCredential writes cred into node's machine config as a person would (the operator's
// talosconfig, not ghcrsync's), staged: Talos loads it at the next boot.
func StageCredential(t testing.TB, sb *sandbox.Sandbox, node string, cred sandbox.Credential) {
	t.Helper()

	m, ok := sb.Fleet().Machine(node)
	if !ok {
		t.Fatalf("no machine %s", node)
	}

	ctx := client.WithNode(context.Background(), m.IP)
	tc := TalosFor(t, sb, sandbox.TalosconfigOperatorFile)

	active, err := safe.StateGetByID[*talosconfig.MachineConfig](ctx, tc.COSI, talosconfig.ActiveID)
	if err != nil {
		t.Fatal(err)
	}

	data, err := registryauth.With(active.Provider(), sandbox.RegistryHost, cred.Username, cred.Password)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := tc.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_STAGED}); err != nil {
		t.Fatalf("stage a credential on %s: %v", node, err)
	}
}
