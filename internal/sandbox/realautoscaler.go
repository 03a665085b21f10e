package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Autoscaler modes (Options.Autoscaler, `ghcrsync-sandbox up --autoscaler`).
const (
	// AutoscalerSim is the seeded simulation (autoscaler.go): deterministic, the default.
	AutoscalerSim = "sim"
	// AutoscalerReal is the real Kubernetes cluster-autoscaler 1.33.0 with its Hetzner provider,
	// against the sandbox's fake Hetzner Cloud API (hcloud.go).
	AutoscalerReal = "real"
)

// ClusterAutoscalerVersion is the release scripts/build-cluster-autoscaler.sh builds.
const ClusterAutoscalerVersion = "1.33.0"

// ClusterAutoscalerBinary is where scripts/build-cluster-autoscaler.sh caches the binary.
func ClusterAutoscalerBinary() string {
	return CachePath("GHCRSYNC_CLUSTER_AUTOSCALER", "cluster-autoscaler", "ca-"+ClusterAutoscalerVersion+"-hetzner", "cluster-autoscaler")
}

// The autoscaler's identity towards the apiserver: its writes are told apart by this user.
const ClusterAutoscalerUser = "cluster-autoscaler"

// realAutoscaler runs the cluster-autoscaler binary as a child process, as its Deployment
// would: HCLOUD_CLUSTER_CONFIG is the template Secret's value when the process starts, and only
// then; a rollout restart of the Deployment (the reader, readers.go) stops it and starts a new
// one that reads the Secret again. A process that exits on its own (it does on a lost
// leader lease or a long API outage) is started again, as the Deployment's pod would be.
type realAutoscaler struct {
	f          *Fleet
	api        *hcloudAPI
	bin, dir   string
	kubeconfig string
	addr       string
	min, max   int
	unneeded   time.Duration

	mu      sync.Mutex
	proc    *process
	paused  bool
	starts  int
	started time.Time

	cancel context.CancelFunc
	done   chan struct{}
}

func startRealAutoscaler(ctx context.Context, s *Sandbox) (*realAutoscaler, error) {
	bin := ClusterAutoscalerBinary()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("sandbox: the real cluster-autoscaler %s: %w (build it with `make cluster-autoscaler`)", bin, err)
	}

	f := s.fleet

	api, err := startHcloudAPI(f)
	if err != nil {
		return nil, err
	}

	a := &realAutoscaler{f: f, api: api, bin: bin, dir: s.opts.Dir, min: s.opts.Autoscaled, max: s.opts.Autoscaled + 4, unneeded: 5 * time.Second}

	if err := grantAutoscaler(ctx, f.admin); err != nil {
		api.close()

		return nil, err
	}

	kp, err := f.cp.kubeCA.client(ClusterAutoscalerUser)
	if err != nil {
		api.close()

		return nil, err
	}

	// The in-cluster Service reaches whichever apiserver is up: the apiserver's own address, not
	// the endpoint node's (which reboots with its node).
	kc, err := kubeconfigBytes("https://"+f.cp.apiAddr, f.cp.kubeCA.certPEM(), kp.CrtPEM, kp.KeyPEM)
	if err != nil {
		api.close()

		return nil, err
	}

	a.kubeconfig = filepath.Join(s.opts.Dir, "cluster-autoscaler.kubeconfig")
	if err := os.WriteFile(a.kubeconfig, kc, 0o600); err != nil {
		api.close()

		return nil, err
	}

	port, err := freePort("127.0.0.1")
	if err != nil {
		api.close()

		return nil, err
	}

	a.addr = "127.0.0.1:" + strconv.Itoa(port)

	return a, nil
}

// run starts the process and supervises it until stop.
func (a *realAutoscaler) run() error {
	if err := a.restart(); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(a.f.ctx)
	a.cancel, a.done = cancel, make(chan struct{})

	go func() {
		defer close(a.done)

		for {
			a.mu.Lock()
			p := a.proc
			a.mu.Unlock()

			var exited <-chan struct{} // nil (paused): never
			if p != nil {
				exited = p.Done()
			}

			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			case <-exited:
			}

			// It exited on its own (not replaced by a restart, not paused): start it again.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}

			a.mu.Lock()
			again := !a.paused && a.proc == p
			a.mu.Unlock()

			if again {
				a.f.log.Warn("cluster-autoscaler exited; starting it again as its Deployment would", "error", p.Err())

				if err := a.restart(); err != nil {
					a.f.log.Warn("cluster-autoscaler did not start", "error", err)
				}
			}
		}
	}()

	return nil
}

// restart stops the running process (SIGTERM, as a rollout does) and starts one that reads
// the template Secret as it is now.
func (a *realAutoscaler) restart() error {
	a.mu.Lock()
	defer a.mu.Unlock()

	if a.proc != nil {
		_ = a.proc.Stop(10 * time.Second)
		a.proc = nil
	}

	if a.paused {
		return nil
	}

	ctx, cancel := context.WithTimeout(a.f.ctx, 10*time.Second)
	defer cancel()

	sec, err := a.f.admin.CoreV1().Secrets(TemplateNamespace).Get(ctx, TemplateSecret, getOpts)
	if err != nil {
		return fmt.Errorf("sandbox: the autoscaler's environment (secretKeyRef %s/%s): %w", TemplateNamespace, TemplateSecret, err)
	}

	env := []string{
		"HCLOUD_TOKEN=" + a.api.token,
		"HCLOUD_ENDPOINT=" + a.api.endpoint(),
		"HCLOUD_CLUSTER_CONFIG=" + strings.TrimSpace(string(sec.Data[TemplateKey])),
		"HCLOUD_PUBLIC_IPV4=true", "HCLOUD_PUBLIC_IPV6=false",
	}

	p, err := startProcess("cluster-autoscaler", a.bin, a.args(), env, a.dir+"/logs")
	if err != nil {
		return err
	}

	a.proc, a.started = p, time.Now()
	a.starts++
	a.f.log.Info("cluster-autoscaler started", "start", a.starts, "template", "read at start")

	return nil
}

// args are the flags of a fast test loop (docs/sandbox.md), pinned rather than left to 1.33's
// defaults: --cordon-node-before-terminating is true as from 1.34 on.
func (a *realAutoscaler) args() []string {
	return []string{
		"--kubeconfig=" + a.kubeconfig,
		"--cloud-provider=hetzner",
		fmt.Sprintf("--nodes=%d:%d:%s:%s:%s", a.min, a.max, hcloudServerType, hcloudLocation, TemplatePool),
		"--namespace=kube-system",
		"--leader-elect=false",
		"--address=" + a.addr,
		"--scan-interval=1s",
		"--scale-down-unneeded-time=" + a.unneeded.String(),
		"--scale-down-delay-after-add=2s",
		"--scale-down-delay-after-delete=0s",
		"--scale-down-delay-after-failure=5s",
		"--unremovable-node-recheck-timeout=5s",
		"--node-delete-delay-after-taint=1s",
		"--max-node-provision-time=1m",
		"--max-graceful-termination-sec=10",
		"--max-pod-eviction-time=20s",
		"--cordon-node-before-terminating=true",
		"--skip-nodes-with-local-storage=false",
		"--skip-nodes-with-system-pods=false",
		"--write-status-configmap=true",
		"--v=2",
	}
}

// setPaused stops the process (its Deployment scaled to 0) or starts it again.
func (a *realAutoscaler) setPaused(p bool) {
	a.mu.Lock()
	was := a.paused
	a.paused = p
	a.mu.Unlock()

	if p != was {
		if err := a.restart(); err != nil {
			a.f.log.Warn("cluster-autoscaler did not start", "error", err)
		}
	}
}

func (a *realAutoscaler) stop() {
	if a.cancel != nil {
		a.cancel()
		<-a.done
	}

	a.mu.Lock()
	p := a.proc
	a.proc = nil
	a.mu.Unlock()

	_ = p.Stop(10 * time.Second)
	a.api.close()
}

// RealAutoscalerFlags are the flags a test may change (the Deployment's args): the pool's
// minimum and maximum size (--nodes MIN:MAX; MaxSize 0 keeps the maximum) and
// --scale-down-unneeded-time.
type RealAutoscalerFlags struct {
	MinSize, MaxSize int
	UnneededTime     time.Duration
}

// ConfigureRealAutoscaler changes the real autoscaler's flags and restarts it, as editing its
// Deployment's args would.
func (s *Sandbox) ConfigureRealAutoscaler(flags RealAutoscalerFlags) error {
	if s.real == nil {
		return errors.New("sandbox: not started with the real cluster-autoscaler")
	}

	a := s.real
	a.mu.Lock()
	a.min, a.unneeded = flags.MinSize, flags.UnneededTime
	if flags.MaxSize > 0 {
		a.max = flags.MaxSize
	}
	a.mu.Unlock()

	return a.restart()
}

// RealAutoscaler reports whether the sandbox runs the real cluster-autoscaler.
func (s *Sandbox) RealAutoscaler() bool { return s.real != nil }

// HcloudCalls counts the fake Hetzner Cloud API's requests by "METHOD /path" ({id} for IDs);
// nil without the real autoscaler.
func (s *Sandbox) HcloudCalls() map[string]int {
	if s.real == nil {
		return nil
	}

	return s.real.api.Calls()
}

// Starts is how many times the process was started (1 + restarts).
func (a *realAutoscaler) Starts() int {
	a.mu.Lock()
	defer a.mu.Unlock()

	return a.starts
}

// grantAutoscaler is the Hetzner provider's example RBAC (cluster-autoscaler's
// examples/cluster-autoscaler-run-on-master.yaml), bound to the autoscaler's user.
func grantAutoscaler(ctx context.Context, kube kubernetes.Interface) error {
	rule := func(groups, resources, verbs []string, names ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs, ResourceNames: names}
	}
	read := []string{"get", "list", "watch"}
	core, subject := []string{""}, []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: ClusterAutoscalerUser}}

	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ClusterAutoscalerUser}, Rules: []rbacv1.PolicyRule{
		rule(core, []string{"events", "endpoints"}, []string{"create", "patch"}),
		rule(core, []string{"pods/eviction"}, []string{"create"}),
		rule(core, []string{"pods/status"}, []string{"update"}),
		rule(core, []string{"endpoints"}, []string{"get", "update"}, "cluster-autoscaler"),
		rule(core, []string{"nodes"}, []string{"watch", "list", "get", "update"}),
		rule(core, []string{"namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims", "persistentvolumes"}, read),
		rule([]string{"extensions"}, []string{"replicasets", "daemonsets"}, read),
		rule([]string{"policy"}, []string{"poddisruptionbudgets"}, read),
		rule([]string{"apps"}, []string{"statefulsets", "replicasets", "daemonsets"}, read),
		rule([]string{"storage.k8s.io"}, []string{"storageclasses", "csinodes", "csistoragecapacities", "csidrivers", "volumeattachments"}, read),
		rule([]string{"batch", "extensions"}, []string{"jobs"}, []string{"get", "list", "watch", "patch"}),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"create"}),
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"get", "update"}, "cluster-autoscaler"),
	}}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterAutoscalerUser}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ClusterAutoscalerUser},
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: ClusterAutoscalerUser, Namespace: "kube-system"}, Rules: []rbacv1.PolicyRule{
		rule(core, []string{"configmaps"}, []string{"create", "list", "watch"}),
		rule(core, []string{"configmaps"}, []string{"delete", "get", "update", "watch"}, "cluster-autoscaler-status", "cluster-autoscaler-priority-expander"),
	}}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterAutoscalerUser, Namespace: "kube-system"}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ClusterAutoscalerUser},
	}

	rbac := kube.RbacV1()

	for _, create := range []func() error{
		func() error { _, err := rbac.ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); return err },
		func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := rbac.Roles("kube-system").Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := rbac.RoleBindings("kube-system").Create(ctx, rb, metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("sandbox: the cluster-autoscaler's RBAC: %w", err)
		}
	}

	return nil
}

var errRealAutoscaler = errors.New("the real cluster-autoscaler decides on its own (ghcrsync-sandbox up --autoscaler real): " +
	"create a workload that does not fit to scale up, remove it to scale down, or use `ctl delete-node` for a server deleted by hand")
