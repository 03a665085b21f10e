package workspace

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fanout"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
)

// PlanOptions are `ghcrsync plan`'s inputs.
type PlanOptions struct {
	SkipProof bool
	TTL       time.Duration
	// PreviousPlan, if set and readable, adds its nodes to those known to exist.
	PreviousPlan string
	// AllowPending lets evicted pods wait Pending rather than land on a node that cannot pull or
	// is drained later (--allow-pending).
	AllowPending bool
	// Within is the run's time budget (--within; 0: the configuration's run.budget).
	Within time.Duration
}

// Plan proves the credential, observes the fleet and plans. It writes nothing anywhere.
func (w *Workspace) Plan(ctx context.Context, o PlanOptions) (*plan.Plan, error) {
	in, err := w.Input(o)
	if err != nil {
		return nil, err
	}

	in.Probe = plan.Probe{Image: w.Config.Nodes.Probe.Image, Namespace: w.Config.Nodes.Probe.Namespace, ServiceAccount: w.Config.Nodes.Probe.ServiceAccount}

	if !o.SkipProof {
		proved, err := w.Prove(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w; nothing was planned", err)
		}

		pinned := proved.Probes
		in.CredentialExpires, in.ProofRetries, in.IsolatedFrom = proved.Expires, proved.Retries, proved.IsolatedFrom

		in.Probe.Image, in.Probe.Images = "", nil
		if len(pinned) > 0 {
			in.Probe.Image = pinned[0]
		}

		if len(pinned) > 1 {
			in.Probe.Images = pinned
		}

		if len(proved.Platforms) > 0 {
			in.Probe.Platforms = proved.Platforms
		}

		tenants, err := w.ProveTenants(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w; nothing was planned", err)
		}

		for i := range in.Tenants {
			t := &in.Tenants[i]
			t.ExpiresAt, t.IsolatedFrom = tenants[t.Name].Expires, tenants[t.Name].IsolatedFrom
		}
	}

	snap, mem, err := w.snapshot(ctx)
	if err != nil {
		return nil, err
	}

	if err := w.talosRoleSuffices(snap); err != nil {
		return nil, err
	}

	snap.InUse = w.CheckInUse(ctx, mem.held, in.AuthDigest, o.SkipProof)
	p := plan.Make(snap, in)

	if !o.SkipProof && w.dryRun(ctx, snap, mem.talos, p) > 0 {
		p = plan.Make(snap, in) // with Talos's answers: a refused change is deselected
	}

	if w.dryRunWrites(ctx, &snap, p) > 0 {
		p = plan.Make(snap, in) // with the API server's refusals: warned of, by object
	}

	if err := w.ProbeAdmissible(ctx, p); err != nil {
		return nil, err
	}

	return p, nil
}

// dryRunWrites makes every fan-out write of the plan as a server-side dry run (fanout.DryRun)
// and records, in the snapshot, each one admission or validation refused. It returns how many
// were refused. A dry run that could not be made (the plan identity may not, the API did not
// answer) says nothing about apply's write: it is not recorded as a refusal.
func (w *Workspace) dryRunWrites(ctx context.Context, snap *plan.Snapshot, p *plan.Plan) int {
	cred, err := w.Credential()
	if err != nil {
		return 0
	}

	tenants, err := w.Tenants()
	if err != nil {
		return 0
	}

	answers := fanout.DryRun(ctx, w.Kube.Client, p, fanout.Options{
		Data: cred.PullSecretJSON(), Tenants: credential.PullSecretJSONs(tenants), Registry: w.Config.Credential.Registry, Username: cred.Username, Password: cred.Password(),
		Templates: w.Config.NodeTemplates, Configuration: w.Config.Identity(), Credential: w.Config.Credential.Name,
	})

	refused := 0

	for key, err := range answers {
		if _, ok := answer.Refused(err); !ok {
			continue
		}

		// The answer's class only: its text is the API's (a policy's message can quote the
		// object, credential included), and the plan is read by others.
		why := redact.Class(err)
		refused++

		for i := range snap.Secrets {
			if x := &snap.Secrets[i]; x.Namespace+"/"+x.Name == key {
				x.WriteRefused = why
			}
		}

		for i := range snap.Templates {
			if x := &snap.Templates[i]; plan.TemplateRef(x.Namespace, x.Secret, x.Key) == key {
				x.WriteRefused = why
			}
		}
	}

	return refused
}

// dryRun asks the Talos of every node the plan acts on what it would do with exactly the change
// (ApplyConfiguration dry_run: no write), in parallel (talos.concurrency), and records each
// answer in the node's facts. It returns how many answered; a node that did not answer keeps no
// answer (its facts were read just before: apply meets what Talos says then).
func (w *Workspace) dryRun(ctx context.Context, snap plan.Snapshot, reads map[string]talos.Read, p *plan.Plan) int {
	cred, err := w.Credential()
	if err != nil {
		return 0
	}

	tc, err := w.Talos(ctx)
	if err != nil {
		return 0
	}

	byName := map[string]*plan.Node{}
	for i := range snap.Nodes {
		byName[snap.Nodes[i].Name] = &snap.Nodes[i]
	}

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered int
		slots    = make(chan struct{}, max(1, w.Config.Talos.Concurrency))
	)

	for _, np := range p.Nodes {
		n := byName[np.Name]
		if n == nil || n.Talos == nil || (np.Action != plan.ActionFence && np.Action != plan.ActionApplyLive) {
			continue
		}

		wg.Add(1)

		go func() {
			defer wg.Done()

			slots <- struct{}{}
			defer func() { <-slots }()

			mode, refused, err := tc.DryRun(ctx, n.InternalIP, reads[n.Name], w.Config.Credential.Registry, cred.Username, cred.Password(), np.Action == plan.ActionApplyLive)
			if err != nil {
				return
			}

			mu.Lock()
			n.Talos.DryRun, n.Talos.DryRunRefused = mode, refused
			answered++
			mu.Unlock()
		}()
	}

	wg.Wait()

	return answered
}

// Input is what, besides a snapshot, decides a plan and a verdict: the desired credential's
// digests, the configuration's rules, the state. The same for plan and for apply's re-listing.
func (w *Workspace) Input(o PlanOptions) (plan.Input, error) {
	cred, err := w.Credential()
	if err != nil {
		return plan.Input{}, err
	}

	ttl := o.TTL
	if ttl == 0 {
		ttl = time.Hour
	}

	cfg := w.Config

	tenants, err := w.tenantRotations(o.SkipProof)
	if err != nil {
		return plan.Input{}, err
	}

	name := ""
	if len(tenants) > 0 {
		name = cfg.Credential.Name
	}

	return plan.Input{
		Credential: name, Tenants: tenants,
		Now: w.clock.Now(), TTL: ttl, CredentialRevision: cred.Revision(), PullSecretRevision: cred.PullSecretRevision(), AuthDigest: cred.AuthDigest(),
		Registry: cfg.Credential.Registry, ProofSkipped: o.SkipProof, ConfigDigest: cfg.Digest,
		Exclude: cfg.Nodes.Exclude, SelfNode: SelfNode(), AutoscalerPolicy: cfg.Nodes.AutoscalerCandidates, AllowQuorumLoss: cfg.Nodes.AllowQuorumLoss,
		SelectedVerdict: cfg.Nodes.Verdict == config.VerdictSelected,
		State:           plan.StateRef{Lineage: w.State.Lineage, Serial: w.State.Serial}, Known: w.known(o.PreviousPlan),
		AllowPending: o.AllowPending, Timing: w.Timing(o.Within), Rotation: w.State.Rotation,
	}, nil
}

// tenantRotations are the tenant credentials' rotations, from their SOPS files (proved later,
// by plan).
func (w *Workspace) tenantRotations(skipped bool) ([]plan.TenantRotation, error) {
	var out []plan.TenantRotation

	for _, t := range w.Config.Tenants {
		cred, err := w.TenantCredential(t.Credential.Name)
		if err != nil {
			return nil, err
		}

		out = append(out, plan.TenantRotation{Name: t.Credential.Name, Revision: cred.PullSecretRevision(), AuthDigest: cred.AuthDigest(),
			Registry: t.Credential.Registry, ProofSkipped: skipped})
	}

	return out, nil
}

// Timing is the estimate's input: the state's recorded rotations, the configuration's defaults
// and parallelism, and the run's budget (within, or the configuration's run.budget).
func (w *Workspace) Timing(within time.Duration) plan.Timing {
	n := w.Config.Nodes

	budget := w.Config.Run.Budget
	if within > 0 {
		budget = within
	}

	return plan.Timing{Samples: w.State.Samples, ExpectedNodeTime: n.ExpectedNodeTime, ExpectedLiveTime: n.ExpectedLiveTime,
		WorkerParallelism: n.WorkerParallelism, LiveParallelism: n.LiveParallelism, DrainTimeout: n.DrainTimeout,
		Budget: budget, Reserve: w.Config.Run.Reserve}
}

// known lists the nodes the state or the previous plan say exist (name -> uid).
func (w *Workspace) known(previousPlan string) map[string]string {
	known := map[string]string{}

	for _, r := range w.State.Records {
		if r.Holds() {
			known[r.Node] = r.UID
		}
	}

	if previousPlan != "" {
		if prev, err := plan.Load(previousPlan); err == nil {
			for _, n := range prev.Nodes {
				if n.Action == plan.ActionFence || n.Action == plan.ActionApplyLive {
					known[n.Name] = n.UID
				}
			}
		}
	}

	return known
}

// Held is a registry credential the snapshot found in use, and where: a node's active config
// (Node) or a managed Secret (Secret, namespace/name). In memory only.
type Held struct {
	Node, Secret string
	// Credential is the tenant credential the Secret is a consumer of ("": the cluster's): what
	// the credential it holds is judged against.
	Credential string
	Cred       *credential.Credential
}

// memory is what a snapshot read that stays in memory, never in the snapshot (it goes into the
// plan file): the credentials in use, and each node's Talos read (the base of its dry run).
type memory struct {
	held  []Held
	talos map[string]talos.Read
}

// snapshot observes the fleet: one LIST of Nodes with each node's Talos facts and pods, the run
// Lease, the configured pull secrets, node templates and Flux Kustomizations; and, in memory,
// the credentials they hold.
func (w *Workspace) snapshot(ctx context.Context) (plan.Snapshot, memory, error) {
	cfg := w.Config

	uid, err := w.Kube.ClusterUID(ctx)
	if err != nil {
		return plan.Snapshot{}, memory{}, err
	}

	nodes, outside, refs, mem, err := w.nodes(ctx)
	if err != nil {
		return plan.Snapshot{}, memory{}, err
	}

	lease, err := w.Kube.Lease(ctx, cfg.Lease.Namespace, cfg.Lease.Name)
	if err != nil {
		return plan.Snapshot{}, memory{}, err
	}

	secrets, heldBySecrets, err := w.secrets(ctx)
	if err != nil {
		return plan.Snapshot{}, memory{}, err
	}

	mem.held = append(mem.held, heldBySecrets...)

	templates, err := w.Templates(ctx)
	if err != nil {
		return plan.Snapshot{}, memory{}, err
	}

	kustomizations, err := w.Kustomizations(ctx)
	if err != nil {
		return plan.Snapshot{}, memory{}, err
	}

	var autoscaler *plan.AutoscalerObs

	if len(cfg.NodeTemplates) > 0 { // machines it creates boot from a template ghcrsync rewrites
		if autoscaler, err = w.Kube.Provisioning(ctx); err != nil {
			return plan.Snapshot{}, memory{}, err
		}
	}

	return plan.Snapshot{TakenAt: w.clock.Now().UTC(), APIEndpoint: w.Kube.Endpoint, ClusterUID: uid, Nodes: nodes, OtherNodes: plan.Identities(outside),
		Outside: outside, Lease: lease, Secrets: secrets, Templates: templates, Kustomizations: kustomizations, PullSecretRefs: refs, Autoscaler: autoscaler}, mem, nil
}

// nodes observes the selected nodes — each with its Talos facts, its evictable pods and what
// would hold their eviction — the nodes outside the selector with their Talos facts too (the
// verdict judges every Node of the cluster), in one batched read, the pull secrets pods
// reference for the registry's images, and the credentials the selected nodes hold.
func (w *Workspace) nodes(ctx context.Context) (nodes, outside []plan.Node, refs []plan.PullSecretRef, mem memory, err error) {
	cfg := w.Config

	nodes, outside, err = w.Kube.Nodes(ctx, cfg.Nodes.Selector)
	if err != nil {
		return nil, nil, nil, memory{}, err
	}

	tc, err := w.Talos(ctx)
	if err != nil {
		return nil, nil, nil, memory{}, err
	}

	all := append(nodes, outside...) //nolint:gocritic // one batched read; split below
	mem.talos = tc.FillFacts(ctx, all, cfg.Credential.Registry, cfg.Talos.Concurrency)
	nodes, outside = all[:len(nodes):len(nodes)], all[len(nodes):]

	for _, n := range nodes {
		if c := mem.talos[n.Name].Credential; c != nil {
			mem.held = append(mem.held, Held{Node: n.Name, Cred: c})
		}
	}

	pods, err := w.Kube.Pods(ctx, cfg.Credential.Registry)
	if err != nil {
		return nil, nil, nil, memory{}, err
	}

	for i := range nodes {
		nodes[i].Pods, nodes[i].Blockers = pods.Evictable[nodes[i].Name], pods.Blockers[nodes[i].Name]
	}

	return nodes, outside, pods.Refs, mem, nil
}

// secrets observes every pull secret the run writes, and the credentials they hold.
func (w *Workspace) secrets(ctx context.Context) ([]plan.SecretObs, []Held, error) {
	targets, err := w.SecretTargets(ctx)
	if err != nil {
		return nil, nil, err
	}

	secrets := make([]plan.SecretObs, 0, len(targets))

	var held []Held

	for _, t := range targets {
		registry := w.Config.Credential.Registry
		if tenant := w.Config.Tenant(t.Credential); tenant != nil {
			registry = tenant.Credential.Registry
		}

		obs, cred, err := w.Kube.ObserveSecret(ctx, t, registry)
		if err != nil {
			return nil, nil, err
		}

		if cred != nil {
			held = append(held, Held{Secret: t.Namespace + "/" + t.Name, Credential: t.Credential, Cred: cred})
		}

		secrets = append(secrets, obs)
	}

	return secrets, held, nil
}

// Kustomizations reads every Flux Kustomization the flux block names. One that does not exist
// is an error: the GitOps controller it was meant to hold would switch the credential mid-run.
func (w *Workspace) Kustomizations(ctx context.Context) ([]plan.KustomizationObs, error) {
	out := make([]plan.KustomizationObs, 0, len(w.Config.FluxSuspend))

	for _, n := range w.Config.FluxSuspend {
		k, err := w.Kube.Kustomization(ctx, n.Namespace, n.Name)
		if err != nil {
			return nil, err
		}

		if !k.Exists {
			return nil, fmt.Errorf("flux.suspend names the Kustomization %s, which does not exist (or Flux's Kustomization CRD, "+
				"kustomize.toolkit.fluxcd.io/v1, is not installed); nothing was planned: fix the name (kubectl get kustomizations -A) "+
				"or remove it from the flux block", n)
		}

		out = append(out, k)
	}

	return out, nil
}

// Templates reads every configured node template and the credential digest of each of its
// configs. A template that cannot be read or decoded is an error: nothing is planned.
func (w *Workspace) Templates(ctx context.Context) ([]plan.TemplateObs, error) {
	var out []plan.TemplateObs

	for _, t := range w.Config.NodeTemplates {
		value, meta, err := w.Kube.TemplateValue(ctx, t.Namespace, t.Secret, t.Key)

		var reader *plan.ReaderObs
		if err == nil && t.RestartDeployment != "" {
			reader, err = w.Kube.TemplateReader(ctx, t.RestartDeployment)
		}

		if err == nil {
			var pools []nodetemplate.Pool

			// Every pool that carries a machine config is judged; t.Pools limits what is written.
			if err = checkPools(t, value); err == nil {
				pools, err = nodetemplate.Read(t.Format, value, nil, w.Config.Credential.Registry)
			}

			for _, p := range pools {
				out = append(out, plan.TemplateObs{Name: t.Name, Namespace: t.Namespace, Secret: t.Secret, Key: t.Key, Format: t.Format,
					Pool: p.Name, Form: p.Form, Digest: p.Digest, Restart: t.RestartDeployment, WrittenAt: meta.Written, Reader: reader,
					Foreign: meta.Foreign, Writers: meta.Writers, OutsidePools: len(t.Pools) > 0 && !slices.Contains(t.Pools, p.Name)})
			}
		}

		if err != nil {
			return nil, TemplateError(t, err)
		}
	}

	return out, nil
}

// checkPools: every pool the block names carries a machine config (a Read of just those).
func checkPools(t config.NodeTemplate, value []byte) error {
	if len(t.Pools) == 0 {
		return nil
	}

	_, err := nodetemplate.Read(t.Format, value, t.Pools, "")

	return err
}

// TemplateError names the node template whose Secret could not be used, and what to do.
func TemplateError(t config.NodeTemplate, err error) error {
	return fmt.Errorf("node_template %q (Secret %s/%s, key %s, format %s): %w; nothing was changed. "+
		"Fix the template, or the block's format/pools (docs/node-templates.md)", t.Name, t.Namespace, t.Secret, t.Key, t.Format, err)
}

// SecretTargets lists the configured pull secrets: consumers (explicit and by namespace label),
// then the root Flux secret. A consumer in a namespace the roles do not cover (found by the
// preflight) is marked OutsideRoles: it is neither read nor written.
func (w *Workspace) SecretTargets(ctx context.Context) ([]cluster.SecretTarget, error) {
	targets, err := w.secretTargets(ctx)

	for i := range targets {
		targets[i].OutsideRoles = w.outside[targets[i].Namespace]
	}

	return targets, err
}

func (w *Workspace) secretTargets(ctx context.Context) ([]cluster.SecretTarget, error) {
	selected := map[string][]string{}

	for _, sel := range w.Config.Selectors() {
		names, err := w.Kube.SelectedNamespaces(ctx, sel)
		if err != nil {
			return nil, err
		}

		selected[sel] = names
	}

	return Targets(w.Config, selected)
}

// Targets are the pull secrets the configuration names, each credential's consumer selector's
// secret in every namespace it matches (selected, by selector): consumers by namespace and name,
// the root last. A pull secret two credentials would write is an error: it can hold only one.
func Targets(cfg *config.Config, selected map[string][]string) ([]cluster.SecretTarget, error) {
	var consumers []cluster.SecretTarget

	for _, set := range cfg.PullSecretSets() {
		explicit := make([]cluster.SecretTarget, 0, len(set.Consumers))
		for _, c := range set.Consumers {
			explicit = append(explicit, cluster.SecretTarget{Namespace: c.Namespace, Name: c.Secret, Role: plan.RoleConsumer, ServiceAccounts: c.ServiceAccounts,
				Credential: set.Credential})
		}

		var (
			secret string
			sas    []string
			nss    []string
		)

		if cs := set.Selector; cs != nil {
			secret, sas, nss = cs.Secret, cs.ServiceAccounts, selected[cs.Selector]
		}

		consumers = append(consumers, cluster.ConsumerTargets(explicit, nss, secret, sas, set.Credential)...)
	}

	if err := claimedOnce(cfg, consumers); err != nil {
		return nil, err
	}

	targets := cluster.ConsumerTargets(consumers, nil, "", nil, "")

	if r := cfg.FluxRoot; r != nil {
		targets = append(targets, cluster.SecretTarget{Namespace: r.Namespace, Name: r.Secret, Role: plan.RoleRoot})
	}

	for i := range targets {
		targets[i].Configuration = cfg.Identity()
	}

	return targets, nil
}

// claimedOnce refuses a pull secret two credentials' consumers name (a namespace two consumer
// selectors match, with the same secret name): which credential it should hold is the
// configuration's to say.
func claimedOnce(cfg *config.Config, targets []cluster.SecretTarget) error {
	by := map[string]string{}

	name := func(t cluster.SecretTarget) string {
		if t.Credential == "" {
			return cfg.Credential.Name
		}

		return t.Credential
	}

	for _, t := range targets {
		key := t.Namespace + "/" + t.Name
		if prev, ok := by[key]; ok && prev != name(t) {
			return fmt.Errorf("pull secret %s is a consumer of credential %q and of credential %q (their consumer selectors both match namespace %s): "+
				"a pull secret holds one credential; nothing was planned. Change a namespace's labels or a selector so one credential names it",
				key, prev, name(t), t.Namespace)
		}

		by[key] = name(t)
	}

	return nil
}

// SelfNode is the node this ghcrsync runs on (plan.SelfNodeEnv), "" when it does not run in
// the cluster.
func SelfNode() string { return os.Getenv(plan.SelfNodeEnv) }

// Probe is the plan's runtime proof: its images by the digests plan proved (the configuration's,
// for a plan made without a proof).
func (w *Workspace) Probe(p *plan.Plan) plan.Probe {
	if p.Probe.Image != "" {
		return p.Probe
	}

	cfg := w.Config.Nodes.Probe

	return plan.Probe{Image: cfg.Image, Images: cfg.Images, Namespace: cfg.Namespace, ServiceAccount: cfg.ServiceAccount}
}

// ProbeAdmissible checks, with a server-side dry run, that the plan's runtime probe pod is
// admitted as it is on the first node the plan acts on (any node when it acts on none): a probe
// that PodSecurity, a webhook or a policy would deny, or that admission would give a pull
// secret, fails here, before any node is touched.
func (w *Workspace) ProbeAdmissible(ctx context.Context, p *plan.Plan) error {
	pr := w.Probe(p)
	if pr.Image == "" || len(p.Nodes) == 0 {
		return nil
	}

	node := p.Nodes[0].Name // the plan's order: the first node acted on, if any

	err := w.Kube.ProbeAdmissible(ctx, node, pr)
	if err != nil {
		return fmt.Errorf("%w. Nothing was changed: fix the probe's namespace or the policy, or set nodes.runtime_probe (docs/apply.md)", err)
	}

	return nil
}

// talosRoleSuffices fails the plan when Talos refused this identity a read of any node's facts
// (PermissionDenied): a plan that could not read the fleet is not a plan — it would leave every
// such node alone and still say "changes", a green check on nothing read. Reading a machine
// config is os:admin on Talos (os:reader sees the version only).
func (w *Workspace) talosRoleSuffices(snap plan.Snapshot) error {
	var denied []string

	for _, n := range snap.Nodes {
		if n.TalosDenied {
			denied = append(denied, n.Name)
		}
	}

	if len(denied) == 0 {
		return nil
	}

	where := "the talosconfig"
	if t := w.Config.Talos.Talosconfig; t != "" {
		where = "talosconfig " + t
	}

	shown := denied
	if len(shown) > 5 {
		shown = append(shown[:5:5], fmt.Sprintf("and %d more", len(denied)-5))
	}

	return fmt.Errorf("the Talos identity of %s may not read what plan needs on %d node(s) (PermissionDenied: %s): plan and apply read each node's "+
		"machine config, which Talos allows only the os:admin role (os:reader sees the version, not the config); use a talosconfig whose "+
		"certificate carries os:admin (docs/rbac.md, \"Talos\"); nothing was planned", where, len(denied), strings.Join(shown, ", "))
}
