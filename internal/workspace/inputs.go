package workspace

import (
	"context"
	"os"
	"time"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fanout"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/planning"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Fences are the fence commands' inputs: what `fences`, `release` and an apply's reclaim read
// and write, the Kubernetes connection behind each of fence's ports.
func (w *Workspace) Fences() fence.Inputs {
	return fence.Inputs{
		Config: w.Config, Nodes: w.Kube, Leases: leases{w.Kube}, Flux: w.Kube, Events: w.Kube, Pods: cluster.PodLiveness{Client: w.Kube.Client},
		Store: w.Store, State: w.State, Liveness: w.Liveness(), Clock: w.clock, Writers: w.Kube, Kured: w.others(),
	}
}

// leases are the run Leases as fence reaches them: the connection's reads, and the release
// lease.ReleaseHolder makes.
type leases struct{ *cluster.Connection }

func (l leases) ReleaseLease(ctx context.Context, namespace, name, holder string) (gone bool, err error) {
	err = lease.ReleaseHolder(ctx, l.Clock, l.Client, namespace, name, holder)
	if lease.IsDeleted(err) {
		return true, nil
	}

	return false, err
}

// Apply is a run's inputs: the fence commands', the credential decrypted once, the node this
// apply runs on, and the run's ports — the Kubernetes connection behind most, the workspace as
// the run asks it (connecting Talos once, when a node is rotated) behind the rest.
func (w *Workspace) Apply() (apply.Inputs, error) {
	cred, err := w.Credential()
	if err != nil {
		return apply.Inputs{}, err
	}

	tenants, err := w.Tenants()
	if err != nil {
		return apply.Inputs{}, err
	}

	templates, err := w.TemplateKube()
	if err != nil {
		return apply.Inputs{}, err
	}

	in := apply.Inputs{
		Inputs: w.Fences(), Credential: cred, Tenants: tenants, Self: os.Getenv(plan.SelfNodeEnv),
		Fleet: applyCluster{w}, Registry: applyCluster{w}, Admission: applyCluster{w},
		NodeAPI: w.Kube, Workloads: w.Kube, Watches: watches{w.Kube}, Suspensions: w.Kube, PullSecrets: pullSecrets{w.Kube, templates}, Leasing: leasing{w.Kube},
		Server: w.Kube.Server, Others: w.others(),
	}

	if k, ok := w.KeyringWriter(); ok {
		in.Keyrings = keyringWriters{w.Kube, k}
	}

	return in, nil
}

// others are the other maintenance tools of the maintenance block, on the connection.
func (w *Workspace) others() *cluster.Others {
	return cluster.NewOthers(w.Kube, w.Config.Others, w.clock.Now)
}

// KeyringWriter is nodes.kubelet_keyring's writer, for the credential's registry (false: not
// configured).
func (w *Workspace) KeyringWriter() (keyring.Writer, bool) {
	k := w.Config.Nodes.Keyring
	if k == nil {
		return keyring.Writer{}, false
	}

	return keyring.Writer{Image: k.Image, Namespace: k.Namespace, Secret: k.Secret, Registry: w.Config.Credential.Registry, Window: k.Window}, true
}

// keyringWriters run the keyring writer on the connection.
type keyringWriters struct {
	c *cluster.Connection
	w keyring.Writer
}

func (k keyringWriters) Prepare(ctx context.Context, data []byte) error {
	return k.c.PutKeyringSecret(ctx, k.w, data)
}

func (k keyringWriters) Retire(ctx context.Context) error { return k.c.DeleteKeyringSecret(ctx, k.w) }

func (k keyringWriters) Run(ctx context.Context, node string, mode keyring.Mode, rootDir string, timeout time.Duration) (keyring.Report, error) {
	return k.c.RunKeyringWriter(ctx, node, k.w, mode, rootDir, timeout)
}

// pullSecrets are the fan-out's writes on the connection's clients; the node templates on the
// template identity's (Workspace.TemplateKube).
type pullSecrets struct {
	*cluster.Connection
	templates *cluster.Connection
}

func (p pullSecrets) Templates(ctx context.Context, pl *plan.Plan, o secretwrite.Options) []secretwrite.Result {
	return fanout.Templates(ctx, p.templates.Client, pl, o)
}

func (p pullSecrets) Consumers(ctx context.Context, pl *plan.Plan, o secretwrite.Options) []secretwrite.Result {
	return fanout.Consumers(ctx, p.Client, pl, o)
}

func (p pullSecrets) Root(ctx context.Context, pl *plan.Plan, o secretwrite.Options, heldBack string) []secretwrite.Result {
	dyn, err := p.Dynamic()
	if err != nil && heldBack == "" {
		heldBack = "dynamic client: " + redact.Error(err)
	}

	return fanout.Root(ctx, p.Client, dyn, pl, o, heldBack)
}

// leasing takes the run Lease on a client of its own (LeaseClient: a renewal never queues behind
// the run's other requests).
type leasing struct{ *cluster.Connection }

func (l leasing) Acquire(ctx context.Context, t apply.LeaseTerms) (apply.RunLease, error) {
	client, err := l.LeaseClient()
	if err != nil {
		return nil, err
	}

	held, err := lease.Acquire(ctx, client, lease.Options(t))
	if err != nil {
		return nil, err
	}

	held.Start(ctx)

	return held, nil
}

// watches are the run's watches on the cluster's connection, handed out as the run's ports.
type watches struct{ *cluster.Connection }

func (c watches) WatchNodes(ctx context.Context, timeout time.Duration) (apply.NodeWatch, error) {
	w, err := c.Connection.WatchNodes(ctx, timeout)
	if err != nil {
		return nil, err
	}

	return w, nil
}

func (c watches) WatchProbes(ctx context.Context, namespace string, timeout time.Duration) (apply.ProbeWatch, error) {
	w, err := c.Connection.WatchProbes(ctx, namespace, timeout)
	if err != nil {
		return nil, err
	}

	return w, nil
}

// applyCluster is the workspace's reader, prover and planner as a run asks them (apply.Fleet,
// apply.Registry, apply.Admission).
type applyCluster struct{ w *Workspace }

func (a applyCluster) Preflight(ctx context.Context) error { return a.w.Preflight(ctx, CommandApply) }

func (a applyCluster) Prove(ctx context.Context) error {
	pr := a.w.Prover()
	if _, err := pr.Prove(ctx); err != nil {
		return err
	}

	_, err := pr.ProveTenants(ctx)

	return err
}

func (a applyCluster) Control(ctx context.Context, p *plan.Plan) error {
	return a.w.Prover().Control(ctx, a.w.Planner().Probe(p))
}

func (a applyCluster) Retry() credential.Retry { return a.w.Prover().Retry() }

func (a applyCluster) ProbeAdmissible(ctx context.Context, p *plan.Plan) error {
	return a.w.Planner().ProbeAdmissible(ctx, p)
}

func (a applyCluster) Probe(p *plan.Plan) plan.Probe { return a.w.Planner().Probe(p) }

func (a applyCluster) Talos(ctx context.Context) (apply.Talos, apply.Etcd, error) {
	tc, err := a.w.Talos(ctx)
	if err != nil {
		return nil, nil, err // not a nil *talos.Client in a non-nil interface
	}

	return tc, tc, nil
}

// HeldByNodes reads the credentials the nodes' active configs hold now and returns how to ask
// the registry about them again (a credential revoked since the plan shows as refused).
func (a applyCluster) HeldByNodes(ctx context.Context, desired string) (func(context.Context) []plan.CredentialInUse, error) {
	held, err := a.w.Fleet().HeldByNodes(ctx)
	if err != nil {
		return nil, err
	}

	pr := a.w.Prover()

	return func(ctx context.Context) []plan.CredentialInUse { return pr.CheckInUse(ctx, held, desired, false) }, nil
}

func (a applyCluster) Provisioning(ctx context.Context) (*plan.AutoscalerObs, error) {
	return a.w.Kube.Provisioning(ctx)
}

func (a applyCluster) ClusterUID(ctx context.Context) (string, error) {
	return a.w.Kube.ClusterUID(ctx)
}

// ReadJudged is Read with the credentials in use judged by the registry, as the plan judges them.
func (a applyCluster) ReadJudged(ctx context.Context, skipProof bool) (plan.Snapshot, plan.Input, error) {
	in, err := a.w.Planner().Input(planning.Options{SkipProof: skipProof})
	if err != nil {
		return plan.Snapshot{}, plan.Input{}, err
	}

	snap, mem, err := a.w.Fleet().Read(ctx)
	if err != nil {
		return plan.Snapshot{}, plan.Input{}, err
	}

	snap.InUse = a.w.Prover().CheckInUse(ctx, mem.Held, in.AuthDigest, skipProof)

	return snap, in, nil
}

// Read reads the fleet into a snapshot and the planner's input, as plan does.
func (a applyCluster) Read(ctx context.Context) (plan.Snapshot, plan.Input, error) {
	in, err := a.w.Planner().Input(planning.Options{})
	if err != nil {
		return plan.Snapshot{}, plan.Input{}, err
	}

	snap, _, err := a.w.Fleet().Read(ctx)

	return snap, in, err
}
