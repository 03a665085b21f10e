package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"

	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// Annotations, labels and taints the sandbox reads or writes on Nodes: the product's names.
const (
	// OwnerAnnotation marks a node fenced by a ghcrsync run; the safety witness requires it
	// (with a cordon) before a reboot.
	OwnerAnnotation = object.OwnerAnnotation
	// ScaleDownDisabledAnnotation makes the cluster autoscaler leave a node alone.
	ScaleDownDisabledAnnotation = object.ScaleDownDisabledAnnotation
	// NodeGroupLabel marks autoscaler-managed nodes.
	NodeGroupLabel = "sandbox.ghcrsync.dev/node-group"
	// DeletionCandidateTaint is the autoscaler's advisory scale-down candidate taint.
	DeletionCandidateTaint = taints.DeletionCandidate
	// ToBeDeletedTaint means the autoscaler has started deleting the node.
	ToBeDeletedTaint = taints.ToBeDeleted
)

// Fleet is the set of simulated machines and what they share: the Kubernetes API, the
// registry, the API endpoint and the counters tests read.
type Fleet struct {
	ctx   context.Context
	opts  Options
	log   hclog.Logger
	admin kubernetes.Interface
	cp    *controlPlane
	reg   *registry.Registry
	pub   *registry.Registry // anonymous: registry.k8s.io's stand-in
	net   subnet
	rng   *mrand.Rand // seeded: names, autoscaler decisions
	// rebootRNG draws reboot durations (RebootMax), seeded apart from rng so the names and the
	// autoscaler's decisions stay those of the seed.
	rebootRNG *mrand.Rand

	endpoint *endpointProxy
	talosCA  *authority // issues the Talos API's certificates (machine.ca)

	mu        sync.Mutex
	machines  map[string]*Machine
	byIP      map[string]*Machine
	nextIndex int
	servers   int64 // the last Hetzner server ID given out
	started   time.Time

	statsMu     sync.Mutex
	stats       Stats
	pullSources map[string]string   // pod -> where its last successful pull's credential came from
	pods        map[string]*podLife // by uid: the pods the kubelets ran (Disruption)

	processImages map[string]ProcessImage // images the kubelets run as processes (RunImage)

	// realNames are the machines that run a real containerd and kubelet (Options.RealNodes),
	// with the binaries they run.
	realNames              map[string]bool
	realKubelet, realPause string
}

// PullSource says where the credential of a pod's last successful pull came from: "node" (the
// runtime's own, from Talos) or "secret NS/NAME" (an image pull secret). "" if none succeeded.
func (f *Fleet) PullSource(namespace, pod string) string {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()

	return f.pullSources[namespace+"/"+pod]
}

// Stats are the counters `ghcrsync-sandbox ctl stats` reports.
type Stats struct {
	UnsafeWrites int            `json:"unsafe_writes"`
	TalosWrites  map[string]int `json:"talos_writes"`
	Reboots      map[string]int `json:"reboots"`
	Pulls        PullStats      `json:"pulls"`
	// EndpointOutages counts the times the kubeconfig's API endpoint went down.
	EndpointOutages int           `json:"endpoint_outages"`
	Unsafe          []UnsafeWrite `json:"unsafe,omitempty"`
	// InterleavedWrites counts Talos writes by ghcrsync's identity made outside its own Lease:
	// the run Lease free or expired, or the node fenced by a run the Lease does not name.
	InterleavedWrites int           `json:"interleaved_writes"`
	Interleaved       []UnsafeWrite `json:"interleaved,omitempty"`
	// LostAnswers counts the API answers the endpoint cut on their way back (lose-answers).
	LostAnswers int `json:"lost_answers"`
	// ThirdPartyReboots counts out-of-band reboots and power-offs (ctl): not ghcrsync's writes.
	ThirdPartyReboots int `json:"third_party_reboots"`
}

// PullStats counts image pulls by outcome.
type PullStats struct {
	OK     int `json:"ok"`
	Denied int `json:"denied"`
}

// UnsafeWrite is one reboot the safety witness judged unsafe.
type UnsafeWrite struct {
	Node    string    `json:"node"`
	Cause   string    `json:"cause"`
	Reasons []string  `json:"reasons"`
	At      time.Time `json:"at"`
}

func (f *Fleet) countTalosWrite(node string) {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()
	f.stats.TalosWrites[node]++
}

func (f *Fleet) countThirdPartyReboot() {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()
	f.stats.ThirdPartyReboots++
}

func (f *Fleet) countReboot(node string) {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()
	f.stats.Reboots[node]++
}

// Stats returns a copy of the counters.
func (f *Fleet) Stats() Stats {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()

	s := f.stats
	s.TalosWrites, s.Reboots = map[string]int{}, map[string]int{}

	for k, v := range f.stats.TalosWrites {
		s.TalosWrites[k] = v
	}

	for k, v := range f.stats.Reboots {
		s.Reboots[k] = v
	}

	s.Unsafe = append([]UnsafeWrite(nil), f.stats.Unsafe...)
	s.Interleaved = append([]UnsafeWrite(nil), f.stats.Interleaved...)

	return s
}

// witnessReboot is the safety witness: a reboot is safe only if the node is cordoned, carries
// a ghcrsync owner annotation, and runs no evictable pod. Anything else is counted and logged.
func (f *Fleet) witnessReboot(m *Machine, cause string) {
	f.countTalosWrite(m.Name)

	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()

	var reasons []string

	node, err := f.admin.CoreV1().Nodes().Get(ctx, m.Name, getOpts)

	switch {
	case apierrors.IsNotFound(err):
		reasons = append(reasons, "node object not found")
	case err != nil:
		reasons = append(reasons, "node unreadable: "+err.Error())
	default:
		if !node.Spec.Unschedulable {
			reasons = append(reasons, "not cordoned")
		}

		if node.Annotations[OwnerAnnotation] == "" {
			reasons = append(reasons, "no "+OwnerAnnotation+" annotation")
		}

		pods, err := f.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + m.Name})
		if err != nil {
			reasons = append(reasons, "pods unreadable: "+err.Error())
		} else {
			for i := range pods.Items {
				// The autoscaler's pod stands in for a process the simulation runs itself: its
				// start is the evidence of a restart, its loss costs nothing.
				if p := &pods.Items[i]; Evictable(p) && p.Labels["app"] != AutoscalerDeployment {
					reasons = append(reasons, "runs evictable pod "+p.Namespace+"/"+p.Name)
				}
			}
		}
	}

	if len(reasons) == 0 {
		return
	}

	f.statsMu.Lock()
	f.stats.UnsafeWrites++
	f.stats.Unsafe = append(f.stats.Unsafe, UnsafeWrite{Node: m.Name, Cause: cause, Reasons: reasons, At: time.Now().UTC()})
	f.statsMu.Unlock()

	f.log.Warn("UNSAFE WRITE: reboot of an unfenced node", "node", m.Name, "cause", cause, "reasons", strings.Join(reasons, "; "))
}

// leaseGrace is how long past its expiry a Lease still covers a write already on its way.
const leaseGrace = 2 * time.Second

// witnessLease is the interleaving witness: a Talos write by ghcrsync's identity must happen
// under the run Lease (held, not expired by more than leaseGrace), and on a node fenced by a
// run, that run must be the one the Lease names. Writes by other identities (an operator)
// are not ghcrsync's and are not judged.
func (f *Fleet) witnessLease(ctx context.Context, m *Machine, what string) {
	if clientIdentity(ctx) != GhcrsyncTalosIdentity {
		return
	}

	rctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()

	var reasons []string

	lease, err := f.admin.CoordinationV1().Leases(LeaseNamespace).Get(rctx, LeaseName, getOpts)

	holder := ""

	switch {
	case apierrors.IsNotFound(err):
		reasons = append(reasons, "no run Lease")
	case err != nil:
		reasons = append(reasons, "Lease unreadable: "+err.Error())
	default:
		holder = ptr.Deref(lease.Spec.HolderIdentity, "")
		if holder == "" {
			reasons = append(reasons, "run Lease free")
		} else if r := lease.Spec.RenewTime; r != nil && lease.Spec.LeaseDurationSeconds != nil &&
			time.Since(r.Add(time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second)) > leaseGrace {
			reasons = append(reasons, "run Lease expired at "+r.Add(time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second).UTC().Format(time.RFC3339Nano))
		}
	}

	if node, err := f.admin.CoreV1().Nodes().Get(rctx, m.Name, getOpts); err == nil {
		if owner := node.Annotations[OwnerAnnotation]; owner != "" && holder != "" && owner != holder {
			reasons = append(reasons, "node fenced by "+owner+" while the Lease names "+holder)
		}
	}

	if len(reasons) == 0 {
		return
	}

	f.statsMu.Lock()
	f.stats.InterleavedWrites++
	f.stats.Interleaved = append(f.stats.Interleaved, UnsafeWrite{Node: m.Name, Cause: what, Reasons: reasons, At: time.Now().UTC()})
	f.statsMu.Unlock()

	f.log.Warn("INTERLEAVED WRITE: Talos write outside the run's Lease", "node", m.Name, "write", what, "reasons", strings.Join(reasons, "; "))
}

// Evictable is the witness's own reading of what a drain must evict before a reboot, written
// from Kubernetes' rules (kubectl drain without --force) and not from ghcrsync's: a pod still
// running or pending, not a static pod's mirror, not a DaemonSet's. A witness that judged by the
// rule under test could not catch it wrong.
func Evictable(p *corev1.Pod) bool {
	switch {
	case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
		return false
	case p.Annotations["kubernetes.io/config.mirror"] != "":
		return false
	}

	ref := metav1.GetControllerOf(p)

	return ref == nil || ref.Kind != "DaemonSet"
}

// pullImage pulls as the machine's runtime does, trying creds in order; it returns the image's
// digest ("" for an image outside the registry).
func (f *Fleet) pullImage(ctx context.Context, m *Machine, pod, image string, creds []Credential) (string, Credential, error) {
	var (
		digest string
		used   Credential
		err    error
	)

	for _, c := range creds {
		if digest, err = f.reg.Pull(ctx, image, c.Username, c.Password); err == nil {
			used = c

			f.statsMu.Lock()
			f.pullSources[pod] = c.source
			f.statsMu.Unlock()

			break
		}
	}

	if !strings.HasPrefix(image, registry.RegistryHost+"/") {
		return digest, used, err
	}

	f.statsMu.Lock()
	if err == nil {
		f.stats.Pulls.OK++
	} else if errors.Is(err, registry.ErrPullDenied) {
		f.stats.Pulls.Denied++
	}
	f.statsMu.Unlock()

	if err != nil {
		f.log.Debug("image pull failed", "node", m.Name, "image", image, "error", err)
	}

	return digest, used, err
}

// Machine returns the machine with the given name or IP.
func (f *Fleet) Machine(nameOrIP string) (*Machine, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if m, ok := f.machines[nameOrIP]; ok {
		return m, true
	}

	m, ok := f.byIP[nameOrIP]

	return m, ok
}

// Machines lists the live machines: control planes, workers, then autoscaled, by name.
func (f *Fleet) Machines() []*Machine {
	f.mu.Lock()
	defer f.mu.Unlock()

	out := make([]*Machine, 0, len(f.machines))
	for _, m := range f.machines {
		out = append(out, m)
	}

	rank := func(m *Machine) int {
		switch {
		case m.Role == RoleControlPlane:
			return 0
		case !m.Autoscaled:
			return 1
		}

		return 2
	}

	sort.Slice(out, func(i, j int) bool {
		if rank(out[i]) != rank(out[j]) {
			return rank(out[i]) < rank(out[j])
		}

		return out[i].Name < out[j].Name
	})

	return out
}

func (f *Fleet) autoscaledName() string {
	f.mu.Lock()
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, f.rng.Uint64())
	f.mu.Unlock()

	return "autoscale-cx43-" + hex.EncodeToString(b)
}

// addMachine boots a new machine and registers its Node.
// addMachine boots a machine from the config given, or (nil) from one rendered with cred.
func (f *Fleet) addMachine(ctx context.Context, name string, role Role, autoscaled bool, cred Credential, config []byte) (*Machine, error) {
	f.mu.Lock()
	index := f.nextIndex
	ip := f.net.host(index)
	f.nextIndex++
	real := f.realNames[name]
	f.mu.Unlock()

	tag, err := talosTagFor(f.opts.TalosVersion, index)
	if err != nil {
		return nil, err
	}

	var (
		sl      slot
		realDir string // a real node's own folder (newRealNode)
		rootDir string // its kubelet's root directory, as its machine config says
	)

	if real {
		if sl, err = claimSlot(); err != nil {
			return nil, err
		}

		// The node's files live in a short path of their own, linked from the sandbox's
		// folder: the kubelet and containerd listen on unix sockets under them, whose paths may
		// not exceed 107 bytes (a test's temporary folder alone can).
		if realDir, err = os.MkdirTemp("", "ghcrsync-node-"); err != nil {
			sl.release()

			return nil, err
		}

		ip, rootDir = sl.ip(), filepath.Join(realDir, "kubelet", "root")
	}

	m := &Machine{
		Name: name, IP: ip, Role: role, Autoscaled: autoscaled, TalosTag: tag, ServerID: f.newServerID(),
		fleet: f, created: time.Now(), bootID: newBootID(), booted: time.Now(), effective: cred,
	}

	var idb [8]byte
	_, _ = rand.Read(idb[:])
	m.memberID = binary.BigEndian.Uint64(idb[:])

	data := config
	if data == nil {
		if data, err = renderMachineConfig(string(role), name, tag, f.endpoint.url(), machineCAs{talos: f.talosCA, kube: f.cp.kubeCA}, cred, rootDir); err != nil {
			return nil, err
		}
	}

	if real {
		// A real node's containerd reaches ghcr.io and registry.k8s.io through mirrors, as
		// its machine config says.
		data = append(data, mirrorDocuments(f.reg.URL(), f.pub.URL())...)
	}

	provider, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, err
	}

	m.effective = registryCredential(provider)

	if err := m.initConfig(ctx, data); err != nil {
		return nil, err
	}

	// At boot Talos loads the machine config before it starts the container runtime.
	m.criStarted = time.Now()

	kp, err := f.cp.kubeCA.client("system:node:"+name, "system:nodes")
	if err != nil {
		return nil, err
	}

	if real {
		r, err := f.newRealNode(m, sl, realDir, f.realKubelet, func(path string) error {
			return writeKubeconfig(path, f.endpoint.url(), f.cp.kubeCA.certPEM(), kp.CrtPEM, kp.KeyPEM)
		})
		if err != nil {
			sl.release()

			return nil, err
		}

		m.agent, m.real = r, r
	} else {
		cfg := rest.CopyConfig(f.cp.admin)
		cfg.CertData, cfg.KeyData = kp.CrtPEM, kp.KeyPEM
		cfg.QPS, cfg.Burst = 50, 100

		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}

		m.kubelet = &kubelet{m: m, client: client}
		m.agent = m.kubelet

		if err := m.kubelet.register(ctx); err != nil {
			return nil, fmt.Errorf("sandbox: register node %s: %w", name, err)
		}

		if err := f.labelNode(ctx, m); err != nil {
			return nil, err
		}
	}

	f.mu.Lock()
	f.machines[name] = m
	f.byIP[ip] = m
	f.mu.Unlock()

	m.bootEvents(ctx)
	m.agent.boot()

	return m, nil
}

// rebootTime is how long one reboot takes: Reboot, or a seeded draw up to RebootMax.
func (f *Fleet) rebootTime() time.Duration {
	lo, hi := f.opts.Reboot, f.opts.RebootMax
	if hi <= lo {
		return lo
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	if f.rebootRNG == nil {
		f.rebootRNG = mrand.New(mrand.NewPCG(uint64(f.opts.Seed), 0xb007))
	}

	return lo + time.Duration(f.rebootRNG.Int64N(int64(hi-lo)+1))
}

// newServerID gives out the next Hetzner server ID.
func (f *Fleet) newServerID() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.servers++

	return 4_000_000 + f.servers
}

// ccmDeleteNode deletes the Node of a deleted server after delay, as the hcloud
// cloud-controller-manager's node lifecycle controller does.
func (f *Fleet) ccmDeleteNode(name string, delay time.Duration) {
	go func() {
		select {
		case <-f.ctx.Done():
			return
		case <-time.After(delay):
		}

		err := f.admin.CoreV1().Nodes().Delete(f.ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			f.log.Warn("cloud-controller-manager: delete Node of a deleted server", "node", name, "error", err)
		}
	}()
}

// removeMachine stops a machine and forgets it; the caller deletes the Node if it should.
func (f *Fleet) removeMachine(m *Machine) {
	m.remove()

	f.mu.Lock()
	delete(f.machines, m.Name)
	delete(f.byIP, m.IP)
	f.mu.Unlock()
}

func (f *Fleet) endpointDown(m *Machine) { f.endpoint.machineDown(m) }
func (f *Fleet) endpointUp(m *Machine)   { f.endpoint.machineUp(m) }

// controlPlanesUp counts control planes not rebooting.
func (f *Fleet) controlPlanesUp() int {
	n := 0

	for _, m := range f.Machines() {
		if m.Role == RoleControlPlane && m.BootID() != "" {
			n++
		}
	}

	return n
}

func (f *Fleet) stop() {
	for _, m := range f.Machines() {
		m.agent.stop()
	}
}

func mergePatch(v map[string]any) []byte {
	b, _ := json.Marshal(v)

	return b
}

// adminKubeconfig is the cluster's admin kubeconfig, as Talos's Kubeconfig API hands it out:
// through the cluster's API endpoint.
func (f *Fleet) adminKubeconfig() ([]byte, error) {
	return kubeconfigBytes(f.endpoint.url(), f.cp.kubeCA.certPEM(), f.cp.admin.CertData, f.cp.admin.KeyData)
}

// labelNode gives the machine's Node the labels Talos sets with the cluster-admin identity, not
// the kubelet's (NodeRestriction forbids node-role labels to kubelets).
func (f *Fleet) labelNode(ctx context.Context, m *Machine) error {
	labels := map[string]string{}
	if m.Role == RoleControlPlane {
		labels["node-role.kubernetes.io/control-plane"] = ""
	}

	if m.Autoscaled { // the simulation's own label, and the one the Hetzner provider sets
		labels[NodeGroupLabel] = "autoscale-cx43"
		labels["hcloud/node-group"] = "autoscale-cx43"
	}

	if len(labels) == 0 {
		return nil
	}

	patch := mergePatch(map[string]any{"metadata": map[string]any{"labels": labels}})
	if _, err := f.admin.CoreV1().Nodes().Patch(ctx, m.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("sandbox: label node %s: %w", m.Name, err)
	}

	return nil
}
