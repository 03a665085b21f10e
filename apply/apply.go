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
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/internal/window"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// run is one execution of a plan.
type run struct {
	in    Inputs
	p     *plan.Plan
	o     Options
	log   hclog.Logger
	cred  *credential.Credential
	lease RunLease
	exec  *executor
	done  map[string]bool // the nodes the run has acted on (lateNodes)
	fleet string          // the fleet's last listing (fleetOf): the plan's, then each relist's
	res   *Result

	stopWatch func() // ends the run's Node and probe watches (watched)

	written []gitWrite // the writes of what Git also holds made so far (underSuspension)
}

// Run executes the plan under the Lease, writing the state before every mutation.
func Run(ctx context.Context, in Inputs, p *plan.Plan, o Options) (*Result, error) {
	if missing := in.missing(); len(missing) > 0 {
		return nil, fmt.Errorf("apply: incomplete inputs, no %s (build them with workspace.Apply); nothing was changed", strings.Join(missing, ", "))
	}

	r := start(in, p, o)

	if err := r.checkPlan(requests.WithStep(ctx, "run: check")); err != nil {
		return nil, err
	}

	if !p.Changes() { // nothing to write: the verdict says whether revoking is safe already
		r.verdict(requests.WithStep(ctx, "run: verdict"))

		return r.res, nil
	}

	if err := r.begin(ctx); err != nil {
		return nil, err
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

// missing names the inputs a run cannot go without that in lacks.
func (in Inputs) missing() []string {
	var out []string

	for _, x := range []struct {
		name   string
		absent bool
	}{
		{"configuration", in.Config == nil}, {"state store", in.Store == nil}, {"state", in.State == nil}, {"credential", in.Credential == nil},
		{"clock", in.Clock == nil}, {"Nodes port", in.Nodes == nil}, {"Events port", in.Events == nil}, {"Fleet port", in.Fleet == nil},
		{"Registry port", in.Registry == nil}, {"Admission port", in.Admission == nil}, {"NodeAPI port", in.NodeAPI == nil},
		{"Workloads port", in.Workloads == nil}, {"Watches port", in.Watches == nil}, {"Suspensions port", in.Suspensions == nil},
		{"PullSecrets port", in.PullSecrets == nil}, {"Leasing port", in.Leasing == nil},
	} {
		if x.absent {
			out = append(out, x.name)
		}
	}

	return out
}

// start is the run of p, its result begun: the time budget runs from now (what does not fit in
// it is left to the next run; each node's estimate, the plan's, is checked before it starts).
func start(in Inputs, p *plan.Plan, o Options) *run {
	r := &run{in: in, p: p, o: o, log: o.Logger, cred: in.Credential, res: &Result{Plan: p, MaxFailures: in.Config.Nodes.MaxFailures, ConfigPath: in.Config.Path}}
	if r.log == nil {
		r.log = hclog.NewNullLogger()
	}

	if r.res.Budget = o.Within; r.res.Budget == 0 {
		r.res.Budget = in.Config.Run.Budget
	}

	if r.res.Budget > 0 {
		r.res.Deadline = in.Clock.Now().Add(r.res.Budget)
		p.Rebudget(r.res.Budget, in.Config.Run.Reserve)
	}

	return r
}

// begin is what a run does before its first write: the permission preflight, the credential's
// proof, the reclaim of a dead run's fences, the Lease.
func (r *run) begin(ctx context.Context) error {
	if err := r.in.Admission.Preflight(requests.WithStep(ctx, "run: check")); err != nil {
		return err
	}

	for _, step := range []func(context.Context) error{r.prove, r.reclaim, r.acquire} {
		if err := step(requests.WithStep(ctx, "run: begin")); err != nil {
			return err
		}
	}

	return nil
}

// write makes the run's writes, in their order: the node templates, the nodes (and those that
// joined meanwhile), the consumer pull secrets, then — unless the run was cancelled — the root.
// In an emergency the old credential no longer pulls: the consumer pull secrets go first, so
// the pods using them can pull again at once, before any node is drained. Under a time budget
// or a maintenance window they go first too: they are cheap, restart nothing, and a run
// stopped by its budget or its window has then done them.
// (Ordinarily they follow the nodes.) The root stays last, after the verdict.
func (r *run) write(ctx context.Context) error {
	templates, consumers := gitWrite{"the node templates", r.templates}, gitWrite{"the consumer pull secrets", r.consumers}
	r.underSuspension(ctx, templates)

	early := r.p.Emergency() || r.res.Budget > 0 || r.in.Config.Run.Window != nil
	if early {
		r.underSuspension(ctx, consumers)
	}

	if err := r.nodes(ctx); err != nil {
		return err
	}

	r.lateNodes(ctx)

	if r.res.Cancelled = ctx.Err() != nil; !r.res.Cancelled {
		if !early {
			r.underSuspension(ctx, consumers)
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
func (r *run) probe() plan.Probe { return r.in.Admission.Probe(r.p) }

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

	// --verbose: its heartbeat's renewals apart from the run's start
	l, err := r.in.Leasing.Acquire(requests.WithStep(ctx, "run: lease"), LeaseTerms{
		Namespace: cfg.Lease.Namespace, Name: cfg.Lease.Name, Holder: r.res.Holder,
		Duration: cfg.Lease.Duration, Heartbeat: cfg.Lease.Heartbeat,
		Logf:  func(f string, a ...any) { r.log.Warn(fmt.Sprintf(f, a...)) },
		Clock: r.in.Clock,
	})
	if err != nil {
		return err
	}

	r.lease = l
	r.log.Info("lease acquired", "lease", cfg.Lease.Namespace+"/"+cfg.Lease.Name, "holder", r.res.Holder)
	r.event(ctx, object.LeaseRef(cfg.Lease.Namespace, cfg.Lease.Name), "GhcrsyncLeaseAcquired",
		"run "+r.res.Holder+" rotates the registry credential to revision "+human.Short(r.p.CredentialRevision), false)

	r.in.State.Run = &state.Run{Holder: r.res.Holder, CredentialRevision: r.p.CredentialRevision, Started: r.in.Clock.Now().UTC()}
	r.in.State.Begin(r.p.CredentialRevision, r.res.Holder, r.in.Clock.Now())

	if err := r.in.Store.Write(r.in.State); err != nil {
		r.releaseLease(ctx)

		return fmt.Errorf("write state (%s): %w; nothing was changed", r.in.Store.Describe(), err)
	}

	return nil
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
