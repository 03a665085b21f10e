// Package apply executes a saved plan: it owns the whole run, as a short sequence of named
// steps — check the plan, prove the credential, reclaim fences of terminated runs, take the
// Lease, write the node templates (machines created during the run boot with the new
// credential), rotate the nodes (live updates several at a time, then fenced workers, then
// fenced control planes one at a time, the API endpoint's node last), re-list the fleet and
// rotate the nodes the plan did not know or left alone (late nodes), write the consumer pull
// secrets, judge the cluster as it is (the verdict) and write the root Flux secret only if
// nothing else uses the old credential, judge it again, record the run, release the Lease.
//
// Each node's rotation is a transaction whose phases are exactly the state file's phases
// (state.Phase): before every mutation the node is judged (plan.Judge), the phase is written to
// the state, and then the mutation runs and is mirrored on the node.
package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fanout"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/internal/window"
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

// The run's ports, each as small as its use.

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
	WatchNodes(ctx context.Context, timeout time.Duration) (*cluster.NodeWatch, error)
	WatchProbes(ctx context.Context, namespace string, timeout time.Duration) (*cluster.ProbeWatch, error)
	CASPatchFrom(ctx context.Context, first *corev1.Node, name string, attempts int, check func(*corev1.Node) error,
		build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error)
}

// Suspensions are the Flux Kustomizations the run suspends, and resumes.
type Suspensions interface {
	Suspend(ctx context.Context, namespace, name, holder string) (ours bool, err error)
	Resume(ctx context.Context, namespace, name, holder string) (gone bool, err error)
}

// PullSecrets are the fan-out's writes (internal/fanout on the cluster's clients).
type PullSecrets interface {
	Templates(ctx context.Context, p *plan.Plan, o fanout.Options) []fanout.Result
	Consumers(ctx context.Context, p *plan.Plan, o fanout.Options) []fanout.Result
	// Root writes the root Flux secret unless heldBack says why not.
	Root(ctx context.Context, p *plan.Plan, o fanout.Options, heldBack string) []fanout.Result
}

// Leasing takes the run Lease (lease.Acquire, on a client of its own).
type Leasing interface {
	Acquire(ctx context.Context, o lease.Options) (*lease.Lease, error)
}

// Options are a run's choices besides its inputs and the plan.
type Options struct {
	// Within is the run's time budget (apply --within; 0: the configuration's run.budget).
	Within      time.Duration
	PlanPath    string // where the plan came from ("" when planned in this command), for messages
	RunRef      string
	Logger      hclog.Logger
	Progress    progress.Func // what long steps report as they go (view.Progress words it)
	Hooks       Hooks
	SecretHooks fanout.Hooks
	// Observe, if set, sees every Event the run records (apply --json streams them).
	Observe func(Event)
}

// Event is one step of the run as recorded on its object: the Kubernetes Event's content.
type Event struct {
	Time    time.Time
	Object  cluster.Ref
	Reason  string
	Message string
	Warning bool
}

// recorder records the run's Events in the cluster and shows each to Observe.
type recorder struct {
	kube    Recorder
	observe func(Event)
	clock   clock.Clock
}

func (r recorder) Record(ctx context.Context, ref cluster.Ref, reason, msg string, warning bool) error {
	if r.observe != nil {
		r.observe(Event{Time: r.clock.Now(), Object: ref, Reason: reason, Message: msg, Warning: warning})
	}

	return r.kube.Record(ctx, ref, reason, msg, warning)
}

// Result is what a run did.
type Result struct {
	Plan       *plan.Plan
	Holder     string
	Nodes      []NodeResult
	Secrets    []fanout.Result
	Reclaimed  []fence.Outcome // fences of terminated runs released before the run
	ReleaseErr error           // the Lease could not be released after the run
	// Cancelled is true when a signal stopped the run; MaxFailures is the failure budget it ran
	// with; ConfigPath names the configuration, for the release command a person is given.
	Cancelled   bool
	MaxFailures int
	ConfigPath  string
	// Verdict is who uses which credential at the end of the run, read from the cluster: exit 0
	// only when it is safe to revoke the old credential. VerdictErr is why it could not be had.
	Verdict    *plan.Revocation
	VerdictErr error
	// Flux is what the run did with each Kustomization of the flux block.
	Flux []FluxResult
	// Budget is the run's time budget (0: none) and Deadline when it ends.
	Budget   time.Duration
	Deadline time.Time
	// WindowOpens is the maintenance window's next opening when it deferred a node (zero: it
	// deferred none).
	WindowOpens time.Time
}

// Deferred lists the nodes the run did not start because they did not fit in its time budget
// or its maintenance window: the next run rotates them.
func (r *Result) Deferred() []string {
	var out []string

	for _, n := range r.Nodes {
		if n.Outcome == state.OutcomeDeferred {
			out = append(out, n.Node)
		}
	}

	return out
}

// Progressed reports whether the run stopped on its time budget with nothing failed: it did what
// fitted, released what it took, and the next run continues the rotation (exit 6). The root
// Flux secret held back is what a progressed run leaves by design, not a failure.
func (r *Result) Progressed() bool {
	c := r.Counts()

	return len(r.Deferred()) > 0 && !r.Cancelled && c.Failed()-c.Secrets[fanout.HeldBack] == 0
}

// SafeToRevoke reports whether the run ended with the old credential used by nothing.
func (r *Result) SafeToRevoke() bool { return r.Verdict != nil && r.Verdict.Clean() }

// Held lists the nodes the run left fenced (failed or cancelled after its claim landed).
func (r *Result) Held() []string {
	var out []string

	for _, n := range r.Nodes {
		if n.Fenced {
			out = append(out, n.Node)
		}
	}

	return out
}

// Counts are a run's outcomes counted once: the human view, the Markdown summary and the exit
// code all read them.
type Counts struct {
	Nodes     map[state.Outcome]int
	Secrets   map[fanout.Outcome]int // consumer and root pull secrets
	Templates map[fanout.Outcome]int // node templates
	FluxLeft  int                    // Flux Kustomizations left suspended
}

// Counts counts the run's outcomes.
func (r *Result) Counts() Counts {
	c := Counts{Nodes: map[state.Outcome]int{}, Secrets: map[fanout.Outcome]int{}, Templates: map[fanout.Outcome]int{}}

	for _, n := range r.Nodes {
		c.Nodes[n.Outcome]++
	}

	for _, s := range r.Secrets {
		if s.Role == plan.RoleTemplate {
			c.Templates[s.Outcome]++
		} else {
			c.Secrets[s.Outcome]++
		}
	}

	for _, f := range r.Flux {
		if f.Held() {
			c.FluxLeft++
		}
	}

	return c
}

// Failed counts the parts of the run that failed: nodes, pull secrets and node templates, a
// held-back root (the rotation is not done), Flux Kustomizations left suspended.
func (c Counts) Failed() int {
	return c.Nodes[state.OutcomeFailed] + c.Secrets[fanout.Failed] + c.Secrets[fanout.HeldBack] +
		c.Templates[fanout.Failed] + c.Templates[fanout.HeldBack] + c.FluxLeft
}

// Failed counts the parts of the run that failed (Counts.Failed).
func (r *Result) Failed() int { return r.Counts().Failed() }

// run is one execution of a plan.
type run struct {
	in    Inputs
	p     *plan.Plan
	o     Options
	log   hclog.Logger
	cred  *credential.Credential
	lease *lease.Lease
	exec  *executor
	done  map[string]bool // the nodes the run has acted on (lateNodes)
	fleet string          // the fleet's last listing (fleetOf): the plan's, then each relist's
	res   *Result

	stopWatch func() // ends the run's Node and probe watches (watched)
}

// Run executes the plan under the Lease, writing the state before every mutation.
func Run(ctx context.Context, in Inputs, p *plan.Plan, o Options) (*Result, error) {
	if in.Config == nil || in.Store == nil || in.State == nil || in.Credential == nil || in.Clock == nil || in.Nodes == nil || in.Events == nil || in.Fleet == nil ||
		in.Registry == nil || in.Admission == nil || in.NodeAPI == nil || in.Workloads == nil || in.Watches == nil || in.Suspensions == nil ||
		in.PullSecrets == nil || in.Leasing == nil {
		return nil, errors.New("apply: incomplete inputs (build them with workspace.Apply); nothing was changed")
	}

	r := &run{in: in, p: p, o: o, log: o.Logger, cred: in.Credential, res: &Result{Plan: p, MaxFailures: in.Config.Nodes.MaxFailures, ConfigPath: in.Config.Path}}
	if r.log == nil {
		r.log = hclog.NewNullLogger()
	}

	// The time budget runs from the start of the run: what does not fit in it is left to the
	// next run (each node's estimate, the plan's, is checked before it starts).
	if r.res.Budget = o.Within; r.res.Budget == 0 {
		r.res.Budget = in.Config.Run.Budget
	}

	if r.res.Budget > 0 {
		r.res.Deadline = in.Clock.Now().Add(r.res.Budget)
		p.Rebudget(r.res.Budget, in.Config.Run.Reserve)
	}

	if err := r.checkPlan(requests.WithStep(ctx, "run: check")); err != nil {
		return nil, err
	}

	if !p.Changes() { // nothing to write: the verdict says whether revoking is safe already
		r.verdict(requests.WithStep(ctx, "run: verdict"))

		return r.res, nil
	}

	if err := in.Admission.Preflight(requests.WithStep(ctx, "run: check")); err != nil {
		return nil, err
	}

	for _, step := range []func(context.Context) error{r.prove, r.reclaim, r.acquire} {
		if err := step(requests.WithStep(ctx, "run: begin")); err != nil {
			return nil, err
		}
	}

	defer r.releaseLease(ctx)
	defer r.resume(ctx)    // before the Lease goes: a suspension is never left by a finished run
	defer r.stopWatching() // the run's watches serve its late nodes and its undoes too

	if err := r.suspend(requests.WithStep(ctx, "run: begin")); err != nil {
		return nil, err
	}

	if err := r.write(ctx); err != nil {
		return nil, err
	}

	r.settleSecrets()
	r.verdict(requests.WithStep(ctx, "run: verdict"))
	r.record()

	return r.res, nil
}

// write makes the run's writes, in their order: the node templates, the nodes (and those that
// joined meanwhile), the consumer pull secrets, then — unless the run was cancelled — the root.
// In an emergency the old credential no longer pulls: the consumer pull secrets go first, so
// the pods using them can pull again at once, before any node is drained. Under a time budget
// or a maintenance window they go first too: they are cheap, restart nothing, and a run
// stopped by its budget or its window has then done them.
// (Ordinarily they follow the nodes.) The root stays last, after the verdict.
func (r *run) write(ctx context.Context) error {
	r.templates(ctx)

	early := r.p.Emergency() || r.res.Budget > 0 || r.in.Config.Run.Window != nil
	if early {
		r.consumers(ctx)
	}

	if err := r.nodes(ctx); err != nil {
		return err
	}

	r.lateNodes(ctx)

	if r.res.Cancelled = ctx.Err() != nil; !r.res.Cancelled {
		if !early {
			r.consumers(ctx)
		}

		r.settleProvisioning(ctx)
		r.lateNodes(ctx) // a node that joined while the consumers were written, or was still being created

		r.root(ctx)
	}

	return nil
}

// checkPlan refuses a plan that no longer matches the world, or was made for another cluster.
func (r *run) checkPlan(ctx context.Context) error {
	uid, err := r.in.Fleet.ClusterUID(ctx)
	if err != nil {
		return fmt.Errorf("%w; nothing was changed", err)
	}

	if err := checkStale(r.p, r.o.PlanPath, r.in.Config, r.cred, r.in.State, clusterRef{uid, r.in.Server}, r.in.Clock.Now()); err != nil {
		return err
	}

	if err := checkTenants(r.p, r.o.PlanPath, r.in.Config, r.in.Tenants); err != nil {
		return err
	}

	if err := checkSelf(r.p, r.o.PlanPath, r.in.Self); err != nil {
		return err
	}

	return checkSteering(r.p)
}

// checkSteering refuses an emergency plan whose first drain would have nowhere to send its pods
// that can pull (plan.Steering.Blocked), before anything is written.
func checkSteering(p *plan.Plan) error {
	if p.Steering.Blocked == "" {
		return nil
	}

	return fmt.Errorf("this plan is not applied: %s; nothing was changed", p.Steering.Blocked)
}

// checkSelf refuses a plan (made elsewhere) that would fence the node this apply runs on: the
// drain would evict this very run.
func checkSelf(p *plan.Plan, path, self string) error {
	if n, ok := p.Node(self); self != "" && ok && n.Action == plan.ActionFence {
		if path == "" {
			path = "PLANFILE"
		}

		return &StaleError{PlanPath: path, Why: fmt.Sprintf("it fences %s, the node this apply runs on (%s): its drain would evict this very run; "+
			"a plan made here leaves that node for a run from another node", self, plan.SelfNodeEnv)}
	}

	return nil
}

// prove proves the credential against the registry, when the configuration lists targets, and
// that the runtime probe pod is admitted as it is (a server-side dry run) before any node is
// touched.
func (r *run) prove(ctx context.Context) error {
	if len(r.in.Config.Credential.Prove) > 0 {
		if err := r.in.Registry.Prove(ctx); err != nil {
			return fmt.Errorf("%w; nothing was changed", err)
		}
	}

	if err := r.in.Admission.ProbeAdmissible(ctx, r.p); err != nil {
		return fmt.Errorf("%w; nothing was changed", err)
	}

	return nil
}

// probe is the runtime proof of the plan (Cluster.Probe).
func (r *run) probe() cluster.Probe { return r.in.Admission.Probe(r.p) }

// window is the maintenance window fenced nodes wait for: run.window, unless the old
// credential is already refused (an emergency ignores it, and the run says so).
func (r *run) window() *window.Window {
	w := r.in.Config.Run.Window
	if w != nil && r.p.Emergency() {
		r.log.Warn("an emergency: the old credential is refused, so nodes are rebooted outside the maintenance window", "window", w.String())

		return nil
	}

	return w
}

// reclaim releases the fences of runs that are provably over (never on mere expiry).
func (r *run) reclaim(ctx context.Context) error {
	var handover []string
	for _, n := range steered(r.p, r.res.Budget > 0) {
		handover = append(handover, n.Name)
	}

	reclaimed, err := fence.Reclaim(ctx, r.in.Inputs, r.o.Progress, handover)
	if err != nil {
		return fmt.Errorf("reclaim fences of terminated runs: %w; nothing was changed", err)
	}

	for _, x := range reclaimed {
		r.log.Warn("reclaimed a fence of a terminated run", "fence", x.Fence.Kind+" "+x.Fence.Name, "holder", x.Fence.Holder,
			"evidence", x.Fence.Evidence, "result", x.Message)
	}

	r.res.Reclaimed = reclaimed

	return nil
}

// acquire takes the Lease (never over another holder) and records the run in the state.
func (r *run) acquire(ctx context.Context) error {
	cfg := r.in.Config
	r.res.Holder = holder.New(r.cred.Revision(), r.o.RunRef).String()

	l, err := r.in.Leasing.Acquire(ctx, lease.Options{
		Namespace: cfg.Lease.Namespace, Name: cfg.Lease.Name, Holder: r.res.Holder,
		Duration: cfg.Lease.Duration, Heartbeat: cfg.Lease.Heartbeat,
		Logf:  func(f string, a ...any) { r.log.Warn(fmt.Sprintf(f, a...)) },
		Clock: r.in.Clock,
	})
	if err != nil {
		return err
	}

	l.Start(requests.WithStep(ctx, "run: lease")) // --verbose: its renewals, apart from the run's start
	r.lease = l
	r.log.Info("lease acquired", "lease", cfg.Lease.Namespace+"/"+cfg.Lease.Name, "holder", r.res.Holder)
	r.event(ctx, cluster.LeaseRef(cfg.Lease.Namespace, cfg.Lease.Name), "GhcrsyncLeaseAcquired",
		"run "+r.res.Holder+" rotates the registry credential to revision "+human.Short(r.p.CredentialRevision), false)

	r.in.State.Run = &state.Run{Holder: r.res.Holder, CredentialRevision: r.p.CredentialRevision, Started: r.in.Clock.Now().UTC()}
	r.in.State.Begin(r.p.CredentialRevision, r.res.Holder, r.in.Clock.Now())

	if err := r.in.Store.Write(r.in.State); err != nil {
		r.releaseLease(ctx)

		return fmt.Errorf("write state (%s): %w; nothing was changed", r.in.Store.Describe(), err)
	}

	return nil
}

// nodes runs every node's transaction.
func (r *run) nodes(ctx context.Context) error {
	cfg := r.in.Config

	tc, etcd, err := r.in.Fleet.Talos(ctx)
	if err != nil {
		return err
	}

	if n, ok := r.p.Node(r.p.EndpointNode); ok && n.Action == plan.ActionFence {
		r.log.Warn("the node serving the kubeconfig's API endpoint is fenced last; the API is unreachable while it reboots and ghcrsync waits for it",
			"node", n.Name, "endpoint", r.in.Server)
	}

	for _, n := range r.p.Nodes {
		if n.Action == plan.ActionDeselect && n.UID != "" {
			r.event(ctx, cluster.NodeRef(n.Name, types.UID(n.UID)), "GhcrsyncDeselect",
				"run "+r.res.Holder+" leaves the node alone, as planned: "+n.Sentence, false)
		}
	}

	recheck, err := r.recheck(ctx)
	if err != nil {
		return err
	}

	keyrings, err := r.keyrings(ctx)
	if err != nil {
		return err
	}

	if keyrings != nil {
		defer func() {
			if err := r.in.Keyrings.Retire(context.WithoutCancel(ctx)); err != nil {
				r.log.Warn("the keyring writer's Secret was not removed: `ghcrsync release` removes it", "error", err)
			}
		}()
	}

	w := r.window()
	nodes, workloads := r.watched(ctx)
	stages, _ := tc.(Stages) // the Talos client reads the machines' stages; a client that cannot is not asked
	r.exec = newExecutor(ports{nodes: nodes, workloads: workloads, talos: tc, etcd: etcd, keyrings: keyrings, lease: r.lease, store: r.in.Store,
		others: r.in.Others, stages: stages}, r.in.State, execOptions{
		Holder: r.res.Holder, Registry: cfg.Credential.Registry, Username: r.cred.Username, Password: r.cred.Password(),
		DrainTimeout: cfg.Nodes.DrainTimeout, ReadyTimeout: cfg.Nodes.ReadyTimeout, WorkerParallelism: cfg.Nodes.WorkerParallelism,
		LiveParallelism: cfg.Nodes.LiveParallelism, KeyringWindow: keyringWindow(cfg.Nodes.Keyring),
		MaxFailures: cfg.Nodes.MaxFailures, AllowQuorumLoss: cfg.Nodes.AllowQuorumLoss,
		Deadline: r.res.Deadline, Budget: r.res.Budget, Reserve: cfg.Run.Reserve, Window: w,
		Probe:  r.probe(),
		Logger: r.log.Named("apply"), Progress: r.o.Progress, Hooks: r.o.Hooks, Events: r.events(),
		Recheck: recheck,
		Retry:   r.in.Registry.Retry(),
		Control: func(ctx context.Context) error { return r.in.Registry.Control(ctx, r.p) },
		Clock:   r.in.Clock,
	})

	r.res.Nodes = r.exec.run(ctx, r.p)

	if w != nil && slices.ContainsFunc(r.res.Nodes, func(n NodeResult) bool { return n.Outcome == state.OutcomeDeferred }) {
		r.res.WindowOpens = w.Next(r.in.Clock.Now())
	}

	return nil
}

// keyrings puts the keyring writer's Secret in place when a node's kubelet keyring is to be
// written or emptied, and returns the writer (nil when none is, or none is configured).
func (r *run) keyrings(ctx context.Context) (Keyrings, error) {
	if r.in.Keyrings == nil {
		return nil, nil
	}

	needed := slices.ContainsFunc(r.p.Nodes, func(n plan.NodePlan) bool {
		return n.Order > 0 && (n.Action == plan.ActionKeyring || n.Keyring != "" && n.Keyring != r.p.AuthDigest)
	})
	if !needed {
		return nil, nil
	}

	if err := r.in.Keyrings.Prepare(ctx, r.cred.PullSecretJSON()); err != nil {
		return nil, fmt.Errorf("%w; nothing was changed on the nodes", err)
	}

	return r.in.Keyrings, nil
}

// keyringWindow is how long after a keyring write its kubelet may take to read it.
func keyringWindow(k *config.Keyring) time.Duration {
	if k == nil {
		return 0
	}

	return k.Window
}

// recheck is how the drains ask the registry again about the credentials the nodes hold
// (Cluster.HeldByNodes): read once, when the plan drains a worker and was proved (a plan made
// with --skip-proof asks the registry nothing).
func (r *run) recheck(ctx context.Context) (func(context.Context) []plan.CredentialInUse, error) {
	drains := false

	for _, n := range r.p.Nodes {
		drains = drains || n.Order > 0 && n.Action == plan.ActionFence && n.Role == plan.RoleWorker
	}

	if !drains || r.p.ProofSkipped {
		return nil, nil
	}

	recheck, err := r.in.Registry.HeldByNodes(ctx, r.p.AuthDigest)
	if err != nil {
		return nil, fmt.Errorf("read the credentials the nodes hold: %w; nothing was changed on the nodes", err)
	}

	return recheck, nil
}

// fanoutOptions are the fan-out's inputs: what it writes, and the state write before each write.
func (r *run) fanoutOptions() fanout.Options {
	root := ""
	if fr := r.in.Config.FluxRoot; fr != nil {
		root = fr.OCIRepository
	}

	st, store := r.in.State, r.in.Store

	return fanout.Options{
		Data: r.cred.PullSecretJSON(), Tenants: credential.PullSecretJSONs(r.in.Tenants), OCIRepository: root, Assert: r.lease.Verify, Hooks: r.o.SecretHooks, Log: r.log,
		Configuration: r.in.Config.Identity(), Credential: r.in.Config.Credential.Name, Clock: r.in.Clock,
		Registry: r.in.Config.Credential.Registry, Username: r.cred.Username, Password: r.cred.Password(), Templates: r.in.Config.NodeTemplates,
		Record: func(ns, name, role, outcome string) error {
			cred, revision := r.desired(ns, name)
			st.PutSecret(state.SecretRecord{Namespace: ns, Name: name, Role: role, Credential: cred, DesiredRevision: revision, Outcome: outcome, Updated: r.in.Clock.Now().UTC()})

			return store.Write(st)
		},
	}
}

// desired is the credential a pull secret of the plan receives ("": the cluster's) and its
// revision: the cluster credential's revision, or the tenant's.
func (r *run) desired(namespace, name string) (credential, revision string) {
	for _, sp := range r.p.Secrets {
		if sp.Namespace == namespace && sp.Secret == name && sp.Credential != "" {
			t, _ := r.p.Tenant(sp.Credential)

			return sp.Credential, t.Revision
		}
	}

	return "", r.p.CredentialRevision
}

// templates writes the node templates before any node is fenced: a machine the autoscaler
// creates while the run goes on boots with the new credential.
func (r *run) templates(ctx context.Context) {
	for _, s := range r.in.PullSecrets.Templates(ctx, r.p, r.fanoutOptions()) {
		r.res.Secrets = append(r.res.Secrets, s)
		r.templateOutcome(ctx, s)
	}
}

// consumers writes the consumer pull secrets.
func (r *run) consumers(ctx context.Context) {
	ctx = requests.WithStep(ctx, "run: secrets")

	for _, s := range r.in.PullSecrets.Consumers(ctx, r.p, r.fanoutOptions()) {
		r.res.Secrets = append(r.res.Secrets, s)
		r.secretOutcome(ctx, s)
	}
}

// root judges the cluster as it is — every node, consumer and template read again — and writes
// the root Flux secret only when nothing but the root itself still uses the old credential.
func (r *run) root(ctx context.Context) {
	ctx = requests.WithStep(ctx, "run: root")

	if h := r.o.Hooks.BeforeRoot; h != nil {
		h()
	}

	held := ""

	switch v, err := r.rootInventory(ctx); {
	case r.res.Failed() > 0:
		held = fmt.Sprintf("%d part(s) of this run failed", r.res.Failed())
	case err != nil:
		held = "the cluster could not be read again to verify nothing else uses the old credential (" + redact.Logged(r.log, err) + ")"
	case !v.Except(plan.UseRoot).SafeToRevoke:
		held = "the old credential is still used by " + v.Except(plan.UseRoot).StillUsedBy()
	}

	for _, s := range r.in.PullSecrets.Root(ctx, r.p, r.fanoutOptions(), held) {
		r.res.Secrets = append(r.res.Secrets, s)
		r.secretOutcome(ctx, s)
	}
}

// secretOutcome logs a pull secret's outcome and records it as an Event on the Secret.
func (r *run) secretOutcome(ctx context.Context, s fanout.Result) {
	r.log.Info("pull secret", "secret", s.Namespace+"/"+s.Secret, "role", s.Role, "outcome", s.Outcome, "detail", s.Message)

	switch s.Outcome {
	case fanout.Written:
		what := "credential revision " + human.Short(r.p.CredentialRevision) + " (" + r.in.Config.Credential.Registry + " entry only)"
		if cred, revision := r.desired(s.Namespace, s.Secret); cred != "" {
			what = "credential " + cred + " at revision " + human.Short(revision)
		}

		r.event(ctx, cluster.SecretRef(s.Namespace, s.Secret), "GhcrsyncPullSecretWritten", "run "+r.res.Holder+" wrote "+what, false)
	case fanout.Failed:
		r.event(ctx, cluster.SecretRef(s.Namespace, s.Secret), "GhcrsyncPullSecretFailed", "run "+r.res.Holder+": "+s.Message, true)
	}
}

// inventory reads the cluster as it is now and judges who uses which credential.
func (r *run) inventory(ctx context.Context) (plan.Revocation, error) {
	snap, in, err := r.in.Fleet.Read(ctx)
	if err != nil {
		return plan.Revocation{}, err
	}

	return plan.Inventory(snap, in), nil
}

// rootInventory is the inventory the root is judged on. A node template whose one objection is
// its reader still rolling out (the last drain evicted the autoscaler's pod; a restart under way)
// is waited for, the cluster read again every readersPoll, for up to nodes.ready_timeout — only
// while such rollouts are all that keeps the old credential in use; then the inventory stands
// as it is (a rollout that never ends holds the root back). Under a time budget the wait never
// runs past its end.
func (r *run) rootInventory(ctx context.Context) (plan.Revocation, error) {
	bound := r.in.Config.Nodes.ReadyTimeout
	start := r.in.Clock.Now()

	if !r.res.Deadline.IsZero() {
		bound = max(0, min(bound, r.res.Deadline.Sub(start)))
	}

	var (
		v       plan.Revocation
		readErr error
	)

	// Until's own answer (timed out, cancelled) leaves the last inventory standing.
	_ = clock.Until(ctx, r.in.Clock, bound, readersPoll, func() (bool, error) {
		snap, in, err := r.in.Fleet.Read(ctx)
		if err != nil {
			readErr = err

			return true, nil
		}

		v = plan.Inventory(snap, in)
		rolling := snap.ReadersRollingOut(in.AuthDigest)

		if !onlyRollouts(v.Except(plan.UseRoot), rolling) {
			return true, nil
		}

		names := make([]string, 0, len(rolling))
		for _, t := range rolling {
			names = append(names, t.Restart)
		}

		r.log.Info("the root waits for node template readers to roll out", "deployments", names,
			"waited", clock.Since(r.in.Clock, start).Round(time.Second), "bound", bound)

		return false, nil
	})

	if readErr != nil {
		return plan.Revocation{}, readErr
	}

	return v, nil
}

// readersPoll is how often the root's wait for rolling readers reads the cluster again.
const readersPoll = 2 * time.Second

// onlyRollouts reports whether v keeps the old credential only through templates whose readers
// are rolling out (waiting may end it); false when v is safe, or anything else holds it.
func onlyRollouts(v plan.Revocation, rolling []plan.TemplateObs) bool {
	still := v.Still() // none when v is safe
	if len(still) == 0 {
		return false
	}

	for _, u := range still {
		if u.Kind != plan.UseTemplate || !slices.ContainsFunc(rolling, func(t plan.TemplateObs) bool { return t.Where() == u.Name }) {
			return false
		}
	}

	return true
}

// verdict is the run's last word, from the cluster at the end: is the old credential still used?
func (r *run) verdict(ctx context.Context) {
	vctx, cancel := r.in.Clock.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute) // read-only, even after a cancel
	defer cancel()

	v, err := r.inventory(vctx)
	if err != nil {
		r.res.VerdictErr = fmt.Errorf("the cluster could not be read to judge whether the old credential is still used: %s", redact.Logged(r.log, err))
		r.log.Error("no verdict", "error", r.res.VerdictErr)

		return
	}

	r.res.Verdict = &v

	if v.Clean() {
		r.log.Info(v.Sentence())
	} else {
		r.log.Warn(v.Sentence())
	}
}

// templateOutcome logs a node template's outcome and records it as an Event on its Secret.
func (r *run) templateOutcome(ctx context.Context, s fanout.Result) {
	r.log.Info("node template", "secret", s.Namespace+"/"+s.Secret, "key", s.Key, "outcome", s.Outcome, "detail", s.Message)

	switch s.Outcome {
	case fanout.Written:
		r.event(ctx, cluster.SecretRef(s.Namespace, s.Secret), "GhcrsyncNodeTemplateWritten",
			"run "+r.res.Holder+" wrote credential revision "+human.Short(r.p.CredentialRevision)+" into node template key "+s.Key, false)
	case fanout.Failed:
		r.event(ctx, cluster.SecretRef(s.Namespace, s.Secret), "GhcrsyncNodeTemplateFailed", "run "+r.res.Holder+": "+s.Message, true)
	}
}

// settleSecrets closes the records of pull secrets and node templates an earlier run was killed
// while writing (state.SecretWriting), or saw fail, that this run found already in sync: whatever
// that write became, nothing is in flight and the target holds the credential. One state write
// for all of them.
func (r *run) settleSecrets() {
	st, settled := r.in.State, 0

	for _, res := range r.res.Secrets {
		if res.Outcome != fanout.Unchanged {
			continue
		}

		for _, rec := range st.Secrets {
			unsettled := rec.Outcome == state.SecretWriting || rec.Outcome == string(fanout.Failed)
			if rec.Namespace == res.Namespace && rec.Name == res.RecordName() && unsettled {
				_, revision := r.desired(rec.Namespace, rec.Name)
				rec.Outcome, rec.DesiredRevision, rec.Updated = string(fanout.Unchanged), revision, r.in.Clock.Now().UTC()
				st.PutSecret(rec)
				settled++
			}
		}
	}

	if settled == 0 {
		return
	}

	if err := r.in.Store.Write(st); err != nil {
		r.log.Warn("could not record that in-flight pull secret writes are settled", "error", err)
	}
}

// events is where the run records its Events: the cluster, and Options.Observe.
func (r *run) events() Recorder {
	return recorder{kube: r.in.Events, observe: r.o.Observe, clock: r.in.Clock}
}

// event records an Event on the run's objects (the Lease, the pull secrets); best effort.
func (r *run) event(ctx context.Context, ref cluster.Ref, reason, msg string, warning bool) {
	if err := r.events().Record(context.WithoutCancel(ctx), ref, reason, msg, warning); err != nil {
		r.log.Debug("event not written", "error", err)
	}
}

// record writes the run's outcome into the state.
func (r *run) record() {
	st := r.in.State
	finished := r.in.Clock.Now().UTC()
	st.Run.Finished = &finished

	switch {
	case r.res.Cancelled:
		st.Run.Outcome = "cancelled"
	case r.res.Failed() > 0:
		st.Run.Outcome = "failed"
	case r.res.Progressed():
		st.Run.Outcome = "progressed"
	default:
		st.Run.Outcome = "succeeded"
	}

	if rot := st.Rotation; rot != nil && rot.Finished == nil && r.res.Verdict != nil && r.res.Verdict.Clean() {
		rot.Finished = &finished
	}

	if err := r.in.Store.Write(st); err != nil {
		r.log.Error("write final state", "error", err)
	}
}

// releaseLease releases the Lease, bounded, even when the run's context is done.
func (r *run) releaseLease(ctx context.Context) {
	rctx, cancel := r.in.Clock.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()

	r.res.ReleaseErr = r.lease.Release(rctx)
	if r.res.ReleaseErr == nil {
		cfg := r.in.Config
		r.event(rctx, cluster.LeaseRef(cfg.Lease.Namespace, cfg.Lease.Name), "GhcrsyncLeaseReleased",
			"run "+r.res.Holder+" released the Lease"+r.rotatedLive(), false)
	}
}

// rotatedLive says how many nodes the run rotated live: they have no Event of their own (a live
// update disrupts nothing, and 1,000 Events would double the run's requests); each Node carries
// its verified marker, and the state file names each.
func (r *run) rotatedLive() string {
	live, keyring := 0, 0

	for _, res := range r.res.Nodes {
		switch {
		case res.Outcome != state.OutcomeDone:
		case res.Action == plan.ActionApplyLive:
			live++
		case res.Action == plan.ActionKeyring:
			keyring++
		}
	}

	var out string

	if live > 0 {
		out += fmt.Sprintf("; %d node(s) rotated live", live)
	}

	if keyring > 0 {
		out += fmt.Sprintf("; %d node(s) rotated through the kubelet keyring", keyring)
	}

	if out != "" {
		out += " (no cordon, no reboot; each Node carries its verified marker)"
	}

	return out
}
