// The run's ports, and the executor's: what a run reaches the cluster, the machines, the registry
// and the other tools through, each as small as its use (the workspace wires them; the run's and
// the transaction's fakes stand in for all of them).

package apply

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Inputs are what a run works with, opened once by the command (workspace.Apply): the fence
// commands' inputs (configuration, state and its store, liveness, clock, and fence's ports), the
// run's own ports onto the cluster, the credential decrypted once, and the node this apply runs
// on ("" outside the cluster).
type Inputs struct {
	fence.Inputs // the fences' reclaim is handed them as they are

	// The run's ports (the workspace wires the Kubernetes connection, the Talos client and the
	// registry behind them).
	Fleet       Fleet
	Registry    Registry
	Admission   Admission
	NodeAPI     Nodes
	Workloads   Workloads
	Watches     Watches
	Suspensions Suspensions
	PullSecrets PullSecrets
	Leasing     Leasing
	// Keyrings write the kubelets' node keyrings (nil: nodes.kubelet_keyring is not configured).
	Keyrings KeyringWriters
	// Others are the other maintenance tools sharing the fleet (nil: none are asked).
	Others Others
	// Server is the Kubernetes API's URL, a plan is bound to it (with the cluster's uid).
	Server string

	Credential *credential.Credential
	// Tenants are the tenant credentials, decrypted once, by name (none: one credential).
	Tenants map[string]*credential.Credential
	Self    string
}

// The run's ports.

// Fleet is the fleet as it is read: as plan reads it, the machines the autoscaler is creating,
// the cluster's identity, and the machines' Talos API.
type Fleet interface {
	// Read reads the fleet as plan does (fleet.Reader): the snapshot and the planner's input.
	Read(ctx context.Context) (plan.Snapshot, plan.Input, error)
	// ReadJudged is Read with the credentials in use judged by the registry, as plan judges
	// them (none asked when skipProof): what a node that joined mid-run is planned on.
	ReadJudged(ctx context.Context, skipProof bool) (plan.Snapshot, plan.Input, error)
	// Provisioning is what the autoscaler is creating now (nil: no autoscaler status).
	Provisioning(ctx context.Context) (*plan.AutoscalerObs, error)
	// ClusterUID identifies the cluster (its kube-system namespace's uid).
	ClusterUID(ctx context.Context) (string, error)
	// Talos connects the Talos client (once); the one client answers both ports.
	Talos(ctx context.Context) (Talos, Etcd, error)
}

// Registry is the registry as the run asks it.
type Registry interface {
	// Prove proves the credentials against the registry (waiting out its passing trouble): the
	// cluster's and each tenant's, with their isolation.
	Prove(ctx context.Context) error
	// Control asks the registry once, now, for the probe's images with the new credential: the
	// control that tells a node's refused credential from a registry refusing everyone.
	Control(ctx context.Context, p *plan.Plan) error
	// Retry is how the registry's passing trouble is waited out.
	Retry() credential.Retry
	// HeldByNodes reads the credentials the nodes hold, for the drains to ask again.
	HeldByNodes(ctx context.Context, desired string) (func(context.Context) []plan.CredentialInUse, error)
}

// KeyringWriters are the kubelet keyrings' writer: the Secret it reads the credential from, put
// in place before the nodes and taken away after the run, and the writer pod on a node.
type KeyringWriters interface {
	Keyrings
	Prepare(ctx context.Context, dockerconfigjson []byte) error
	Retire(ctx context.Context) error
}

// Admission is what the cluster will let the run do: its permissions, and its runtime probe.
type Admission interface {
	// Preflight checks apply's permissions (its writes) once the plan stands.
	Preflight(ctx context.Context) error
	// ProbeAdmissible dry-runs the plan's runtime probe pod; Probe is that proof.
	ProbeAdmissible(ctx context.Context, p *plan.Plan) error
	Probe(p *plan.Plan) plan.Probe
}

// Watches are the run's watches (watched): its Nodes, its probe pods, and the compare-and-swap
// that starts from a Node the watch served.
type Watches interface {
	WatchNodes(ctx context.Context, timeout time.Duration) (NodeWatch, error)
	WatchProbes(ctx context.Context, namespace string, timeout time.Duration) (ProbeWatch, error)
	CASPatchFrom(ctx context.Context, first *corev1.Node, name string, attempts int, check func(*corev1.Node) error,
		build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error)
}

// NodeWatch is the run's one watch of every Node (cluster.NodeWatch): each Node as last seen, how
// recent that is, a wake-up when one changes, and every Node as a drain's destination.
type NodeWatch interface {
	// Fresh reports whether the watch saw a change within d (a quiet watch may be cut off).
	Fresh(d time.Duration) bool
	// Get is the Node as the watch last saw it; ok is false for a Node it does not hold.
	Get(name string) (n *corev1.Node, ok bool)
	Changes(ctx context.Context, name string) <-chan struct{}
	Destinations(ctx context.Context) ([]plan.Destination, error)
}

// ProbeWatch is the run's one watch of its probe pods and their Events (cluster.ProbeWatch).
type ProbeWatch interface {
	ProveRuntime(ctx context.Context, node string, probe plan.Probe, timeout time.Duration) error
	// Wait returns once the watch has ended and deleted the last proofs' pods.
	Wait()
}

// Suspensions are the Flux Kustomizations the run suspends, and resumes.
type Suspensions interface {
	// Suspend suspends it for holder's run; request, when not "", is a reconcile request
	// written with the suspension, which kustomize-controller answers once it has taken it.
	Suspend(ctx context.Context, namespace, name, holder, request string) (ours bool, err error)
	// Kustomization reads it as it is now: whether it is suspended and by whom, and the last
	// reconcile request kustomize-controller answered (a suspension's request answered: no
	// reconcile begun before the suspension is still in flight).
	Kustomization(ctx context.Context, namespace, name string) (plan.KustomizationObs, error)
	Resume(ctx context.Context, namespace, name, holder string) (gone bool, err error)
}

// PullSecrets are the fan-out's writes (internal/fanout on the cluster's clients).
type PullSecrets interface {
	Templates(ctx context.Context, p *plan.Plan, o secretwrite.Options) []secretwrite.Result
	Consumers(ctx context.Context, p *plan.Plan, o secretwrite.Options) []secretwrite.Result
	// Root writes the root Flux secret unless heldBack says why not.
	Root(ctx context.Context, p *plan.Plan, o secretwrite.Options, heldBack string) []secretwrite.Result
}

// Leasing takes the run Lease (lease.Acquire, on a client of its own) and starts its heartbeat,
// which lasts until the Lease is released or ctx is done.
type Leasing interface {
	Acquire(ctx context.Context, t LeaseTerms) (RunLease, error)
}

// LeaseTerms are the run Lease's terms: where it is, whose, how long it lasts and how often it is
// renewed; where its warnings go, and the run's clock.
type LeaseTerms struct {
	Namespace, Name, Holder string
	Duration, Heartbeat     time.Duration
	Logf                    func(format string, args ...any)
	Clock                   clock.Clock
}

// RunLease is the run Lease as the run holds it: the executor's checks, the fan-out's fresh check
// before each write, and its release.
type RunLease interface {
	Lease
	Verify(ctx context.Context) error
	Release(ctx context.Context) error
}

// The executor's ports (the run wires them).

// Nodes are the Kubernetes Nodes: read, changed by compare-and-swap, watched for changes.
type Nodes interface {
	Get(ctx context.Context, name string) (*corev1.Node, error)
	// ControlPlanes lists every control-plane Node of the cluster (not only the plan's).
	ControlPlanes(ctx context.Context) ([]corev1.Node, error)
	CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
		build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error)
	// Changes signals, best effort, when the Node changes: a wait then reads and judges at once
	// instead of at its next poll. nil (never signals) is allowed.
	Changes(ctx context.Context, name string) <-chan struct{}
	// StaticPodsReady reports an error unless every static (mirror) pod on the node is Ready.
	StaticPodsReady(ctx context.Context, node string) error
}

// Workloads are the pods on the Nodes: drained, placed, and the runtime probe that proves a
// node's container runtime.
type Workloads interface {
	Drain(ctx context.Context, node string, timeout time.Duration, report progress.Func, check drain.Check) error
	// Destinations are every Node as an evicted pod's scheduler sees it.
	Destinations(ctx context.Context) ([]plan.Destination, error)
	ProveRuntime(ctx context.Context, node string, probe plan.Probe, timeout time.Duration) error
}

// Talos is what the executor needs from a machine's Talos API.
type Talos interface {
	// ConfigFacts reads the credential digests of the active and staged configs at
	// at.InternalIP; naming the Node (at.Name, uid, boot id, at.Talos) vouches that the machine
	// there just said it is that Node on this boot, and the read then stands for a whole read.
	ConfigFacts(ctx context.Context, at plan.Node, registry string) (*plan.TalosFacts, error)
	// Configure writes the credential and returns when the config changed, as Talos recorded it.
	Configure(ctx context.Context, node, registry, username, password string, live bool) (time.Time, error)
	Reboot(ctx context.Context, node string) error
	// RuntimeStarted is when the node's container runtime last started.
	RuntimeStarted(ctx context.Context, node string) (time.Time, error)
	// Nodename is the Kubernetes node name the machine at an address says it is.
	Nodename(ctx context.Context, node string) (string, error)
}

// Keyrings are the kubelets' node keyrings, each written, read or awaited by ghcrsync's writer pod
// on its node (internal/keyring): nil when nodes.kubelet_keyring is not configured.
type Keyrings interface {
	Run(ctx context.Context, node string, mode keyring.Mode, rootDir string, timeout time.Duration) (keyring.Report, error)
}

// Etcd is the control planes' etcd, as their Talos API reports it (the etcd gate).
type Etcd interface {
	// Etcd reads a control plane's etcd member: members, alarms, its status.
	Etcd(ctx context.Context, node string) (*plan.EtcdView, error)
}

// Lease is the run's Lease, as the executor uses it.
type Lease interface {
	Assert() error
	WaitLive(ctx context.Context) error
	// Done is closed when the Lease is lost for good.
	Done() <-chan struct{}
}

// Store persists the state.
type Store interface {
	Write(*state.State) error
}

var _ Store = (state.Store)(nil)

// ports are the executor's ports, wired together.
type ports struct {
	nodes     Nodes
	workloads Workloads
	talos     Talos
	etcd      Etcd
	keyrings  Keyrings
	lease     Lease
	store     Store
	// others and stages are the other maintenance tools and the machines' stages (nil: not asked).
	others Others
	stages Stages
}

// Others are the other maintenance tools sharing the fleet (cluster.Others, wired by the workspace): what holds a node
// now, and kured's lock, taken for ghcrsync's reboot of a node and dropped after it.
type Others interface {
	Holds(ctx context.Context, node string) ([]maintenance.Hold, error)
	// TakeKuredLock returns the hold when another holds kured's lock (nil: taken, or no kured).
	TakeKuredLock(ctx context.Context, node, holder string, cordoned bool) (*maintenance.Hold, error)
	DropKuredLock(ctx context.Context, node string) error
}

// Stages are the machines' stages as their Talos API reports them (talos.Client).
type Stages interface {
	Stage(ctx context.Context, node string) (string, error)
}

// Recorder writes Kubernetes Events (best effort: an Event that cannot be written is logged).
type Recorder interface {
	Record(ctx context.Context, ref object.Ref, reason, message string, warning bool) error
}
