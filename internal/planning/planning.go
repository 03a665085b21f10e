// Package planning is the plan operation, beside apply.Run: it proves the credential, reads the
// fleet, asks the registry about every credential the fleet holds, makes the plan (plan.Make,
// pure), asks each node's Talos and the API server what they would do with exactly the change
// (dry runs: nothing is written), plans again with their answers, and checks the runtime probe
// would be admitted. It writes nothing anywhere; every client is handed in as a port.
package planning

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fleet"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/pool"
	"github.com/ghcrsync/ghcrsync/internal/prover"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/internal/window"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Options are `ghcrsync plan`'s inputs.
type Options struct {
	SkipProof bool
	TTL       time.Duration
	// PreviousPlan, if set and readable, adds its nodes to those known to exist.
	PreviousPlan string
	// AllowPending lets evicted pods wait Pending rather than land on a node that cannot pull or
	// is drained later (--allow-pending).
	AllowPending bool
	// Within is the run's time budget (--within; 0: the configuration's run.budget).
	Within time.Duration
	// AllowUnreachable plans when more than half of the nodes' Talos APIs could not be read
	// (--allow-unreachable); otherwise that is an error (plan.CheckReachable).
	AllowUnreachable bool
}

// Fleet reads the cluster and its machines into a snapshot (fleet.Reader).
type Fleet interface {
	Read(ctx context.Context) (plan.Snapshot, fleet.Memory, error)
}

// Prover asks the registry (prover.Prover).
type Prover interface {
	Prove(ctx context.Context) (prover.Proved, error)
	ProveTenants(ctx context.Context) (map[string]prover.Proved, error)
	CheckInUse(ctx context.Context, held []fleet.Held, desired string, skipped bool) []plan.CredentialInUse
}

// Credentials are the decrypted credentials, each decrypted once.
type Credentials interface {
	Credential() (*credential.Credential, error)
	TenantCredential(name string) (*credential.Credential, error)
	Tenants() (map[string]*credential.Credential, error)
}

// Talos is a node's Talos asked for a dry run of the change (talos.Client).
type Talos interface {
	DryRun(ctx context.Context, node string, read talos.Read, registry, username, password string, live bool) (mode, refused string, err error)
}

// Writes are the fan-out's writes made as server-side dry runs (fanout.DryRun on a client).
type Writes interface {
	DryRun(ctx context.Context, p *plan.Plan, o secretwrite.Options) map[string]error
}

// Admission is the API server asked whether the runtime probe's pod would be admitted on a node.
type Admission interface {
	ProbeAdmissible(ctx context.Context, node string, probe plan.Probe) error
}

// Planner makes plans from what it is handed: the configuration, the state, the credentials and
// the ports it reads and asks through.
type Planner struct {
	Config      *config.Config
	State       *state.State
	Credentials Credentials
	Clock       clock.Clock
	Fleet       Fleet
	Prover      Prover
	// Talos connects the Talos client when a dry run first needs it.
	Talos     func(ctx context.Context) (Talos, error)
	Writes    Writes
	Admission Admission
	// Others are the other maintenance tools (nil: not asked).
	Others Others
}

// Plan proves the credential, observes the fleet and plans. It writes nothing anywhere.
func (pl *Planner) Plan(ctx context.Context, o Options) (*plan.Plan, error) {
	in, err := pl.Input(o)
	if err != nil {
		return nil, err
	}

	in.Probe = plan.Probe{Image: pl.Config.Nodes.Probe.Image, Namespace: pl.Config.Nodes.Probe.Namespace, ServiceAccount: pl.Config.Nodes.Probe.ServiceAccount}

	if !o.SkipProof {
		if err := pl.prove(ctx, &in); err != nil {
			return nil, fmt.Errorf("%w; nothing was planned", err)
		}
	}

	snap, mem, err := pl.Fleet.Read(ctx)
	if err != nil {
		return nil, err
	}

	if err := pl.talosRoleSuffices(snap); err != nil {
		return nil, err
	}

	snap.InUse = pl.Prover.CheckInUse(ctx, mem.Held, in.AuthDigest, o.SkipProof)
	p := plan.Make(snap, in)

	if !o.SkipProof && pl.dryRun(ctx, snap, mem.Talos, p) > 0 {
		p = plan.Make(snap, in) // with Talos's answers: a refused change is deselected
	}

	if pl.dryRunWrites(ctx, &snap, p) > 0 {
		p = plan.Make(snap, in) // with the API server's refusals: warned of, by object
	}

	if err := pl.ProbeAdmissible(ctx, p); err != nil {
		return nil, err
	}

	if gone := p.Unreachable(); o.AllowUnreachable && len(gone) > 0 {
		p.Warnings = append(p.Warnings, fmt.Sprintf("The Talos API of %d of the nodes could not be read: they are left alone (--allow-unreachable).", len(gone)))
	} else if err := p.CheckReachable(strings.Join(pl.Config.Talos.Endpoints, ", ")); err != nil {
		return nil, err
	}

	p.Warnings = append(p.Warnings, WindowWarning(pl.Config.Run.Window, p, pl.Clock.Now())...)
	p.Warnings = append(p.Warnings, pl.othersWarnings(ctx, p)...)

	return p, nil
}

// prove proves the credentials against the registry, and records in in what the proof found: the
// expiry, the passing trouble waited out, the images the credential is isolated from, the probe's
// images by digest and their platforms, each tenant's expiry and isolation.
func (pl *Planner) prove(ctx context.Context, in *plan.Input) error {
	proved, err := pl.Prover.Prove(ctx)
	if err != nil {
		return err
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

	tenants, err := pl.Prover.ProveTenants(ctx)
	if err != nil {
		return err
	}

	for i := range in.Tenants {
		t := &in.Tenants[i]
		t.ExpiresAt, t.IsolatedFrom = tenants[t.Name].Expires, tenants[t.Name].IsolatedFrom
	}

	return nil
}

// WindowWarning says what the maintenance window does to the plan's fenced nodes if apply ran
// now (the estimate's part of it): closed, it defers them all until it opens; open, it defers
// those expected to end after it closes; in an emergency it holds nothing. Nothing when every
// node fits, or none is fenced.
func WindowWarning(w *window.Window, p *plan.Plan, now time.Time) []string {
	if w == nil {
		return nil
	}

	fenced, fit := 0, 0

	_, closes, open := w.Span(now)

	for _, np := range p.Nodes {
		if np.Order > 0 && np.Action == plan.ActionFence {
			fenced++

			if open && !now.Add(np.Ends).After(closes) {
				fit++
			}
		}
	}

	nodes := fmt.Sprintf("%d %s to fence", fenced, human.Plural(fenced, "node", "nodes"))

	switch {
	case fenced == 0, fit == fenced:
		return nil
	case p.Emergency():
		return []string{fmt.Sprintf("The maintenance window (run.window %q) does not hold this rotation: the old credential is refused (an emergency), "+
			"and apply reboots the %s at once.", w, nodes)}
	case !open:
		return []string{fmt.Sprintf("The maintenance window (run.window %q) is closed now: apply writes what restarts nothing and defers the %s "+
			"until it opens (%s).", w, nodes, w.Next(now).UTC().Format(time.RFC3339))}
	}

	return []string{fmt.Sprintf("The maintenance window (run.window %q) closes at %s: about %d of the %s are expected to end before it; "+
		"apply defers the rest to the next window (%s).", w, closes.UTC().Format(time.RFC3339), fit, nodes, w.Next(closes).UTC().Format(time.RFC3339))}
}

// dryRunWrites makes every fan-out write of the plan as a server-side dry run (fanout.DryRun)
// and records, in the snapshot, each one admission or validation refused. It returns how many
// were refused. A dry run that could not be made (the plan identity may not, the API did not
// answer) says nothing about apply's write: it is not recorded as a refusal.
func (pl *Planner) dryRunWrites(ctx context.Context, snap *plan.Snapshot, p *plan.Plan) int {
	cred, err := pl.Credentials.Credential()
	if err != nil {
		return 0
	}

	tenants, err := pl.Credentials.Tenants()
	if err != nil {
		return 0
	}

	answers := pl.Writes.DryRun(ctx, p, secretwrite.Options{
		Data: cred.PullSecretJSON(), Tenants: credential.PullSecretJSONs(tenants), Registry: pl.Config.Credential.Registry, Username: cred.Username, Password: cred.Password(),
		Templates: pl.Config.NodeTemplates, Configuration: pl.Config.Identity(), Credential: pl.Config.Credential.Name,
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
func (pl *Planner) dryRun(ctx context.Context, snap plan.Snapshot, reads map[string]talos.Read, p *plan.Plan) int {
	cred, err := pl.Credentials.Credential()
	if err != nil {
		return 0
	}

	tc, err := pl.Talos(ctx)
	if err != nil {
		return 0
	}

	byName := map[string]*plan.Node{}
	for i := range snap.Nodes {
		byName[snap.Nodes[i].Name] = &snap.Nodes[i]
	}

	var acted []plan.NodePlan

	for _, np := range p.Nodes {
		if n := byName[np.Name]; n != nil && n.Talos != nil && np.Action.Acts() {
			acted = append(acted, np)
		}
	}

	var (
		mu       sync.Mutex
		answered int
	)

	pool.Each(len(acted), pl.Config.Talos.Concurrency, func(i int) {
		np := acted[i]
		n := byName[np.Name]

		mode, refused, err := tc.DryRun(ctx, n.InternalIP, reads[n.Name], pl.Config.Credential.Registry, cred.Username, cred.Password(), np.Action.InPlace())
		if err != nil {
			return
		}

		mu.Lock()
		n.Talos.DryRun, n.Talos.DryRunRefused = mode, refused
		answered++
		mu.Unlock()
	})

	return answered
}

// Input is what, besides a snapshot, decides a plan and a verdict: the desired credential's
// digests, the configuration's rules, the state. The same for plan and for apply's re-listing.
func (pl *Planner) Input(o Options) (plan.Input, error) {
	cred, err := pl.Credentials.Credential()
	if err != nil {
		return plan.Input{}, err
	}

	ttl := o.TTL
	if ttl == 0 {
		ttl = time.Hour
	}

	cfg := pl.Config

	tenants, err := pl.tenantRotations(o.SkipProof)
	if err != nil {
		return plan.Input{}, err
	}

	name := ""
	if len(tenants) > 0 {
		name = cfg.Credential.Name
	}

	return plan.Input{
		Credential: name, Tenants: tenants,
		Now: pl.Clock.Now(), TTL: ttl, CredentialRevision: cred.Revision(), PullSecretRevision: cred.PullSecretRevision(), AuthDigest: cred.AuthDigest(),
		Registry: cfg.Credential.Registry, ProofSkipped: o.SkipProof, ConfigDigest: cfg.Digest,
		Exclude: cfg.Nodes.Exclude, SelfNode: SelfNode(), AutoscalerPolicy: cfg.Nodes.AutoscalerCandidates, AllowQuorumLoss: cfg.Nodes.AllowQuorumLoss,
		WaitHeldDrains:  cfg.Others.HeldDrain == config.HeldDrainWait,
		SelectedVerdict: cfg.Nodes.Verdict == config.VerdictSelected,
		State:           plan.StateRef{Lineage: pl.State.Lineage, Serial: pl.State.Serial}, Known: pl.known(o.PreviousPlan),
		AllowPending: o.AllowPending, Timing: pl.Timing(o.Within), Rotation: pl.State.Rotation,
		Keyring: pl.keyringPolicy(cred.Revision()),
	}, nil
}

// keyringPolicy is how the kubelet keyring may be used (nil: nodes.kubelet_keyring is not
// configured): its trusted mirrors, and the nodes an earlier run of this revision wrote a
// keyring on and could not prove (the writer did not run, or the proof failed within its
// window) — a reboot loads the credential there instead.
func (pl *Planner) keyringPolicy(revision string) *plan.KeyringPolicy {
	k := pl.Config.Nodes.Keyring
	if k == nil {
		return nil
	}

	p := &plan.KeyringPolicy{TrustedMirrors: k.TrustedMirrors, RootDirs: k.RootDirs}

	for _, r := range pl.State.Records {
		if r.Action == state.ActionKeyring && r.Outcome == state.OutcomeFailed && r.DesiredRevision == revision && r.Phase.AtOrAfter(state.PhaseKeyring) {
			if p.Failed == nil {
				p.Failed = map[string]string{}
			}

			p.Failed[r.Node] = r.LastError
		}
	}

	return p
}

// tenantRotations are the tenant credentials' rotations, from their SOPS files (proved later,
// by plan).
func (pl *Planner) tenantRotations(skipped bool) ([]plan.TenantRotation, error) {
	var out []plan.TenantRotation

	for _, t := range pl.Config.Tenants {
		cred, err := pl.Credentials.TenantCredential(t.Credential.Name)
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
func (pl *Planner) Timing(within time.Duration) plan.Timing {
	n := pl.Config.Nodes

	budget := pl.Config.Run.Budget
	if within > 0 {
		budget = within
	}

	keyringTime := config.DefaultKeyringWindow
	if n.Keyring != nil {
		keyringTime = n.Keyring.Window
	}

	return plan.Timing{Samples: pl.State.Samples, ExpectedNodeTime: n.ExpectedNodeTime, ExpectedLiveTime: n.ExpectedLiveTime, ExpectedKeyringTime: keyringTime,
		WorkerParallelism: n.WorkerParallelism, LiveParallelism: n.LiveParallelism, DrainTimeout: n.DrainTimeout,
		Budget: budget, Reserve: pl.Config.Run.Reserve}
}

// known lists the nodes the state or the previous plan say exist (name -> uid).
func (pl *Planner) known(previousPlan string) map[string]string {
	known := map[string]string{}

	for _, r := range pl.State.Records {
		if r.Holds() {
			known[r.Node] = r.UID
		}
	}

	if previousPlan != "" {
		if prev, err := plan.Load(previousPlan); err == nil {
			for _, n := range prev.Nodes {
				if n.Action.Acts() {
					known[n.Name] = n.UID
				}
			}
		}
	}

	return known
}

// SelfNode is the node this ghcrsync runs on (plan.SelfNodeEnv), "" when it does not run in
// the cluster.
func SelfNode() string { return os.Getenv(plan.SelfNodeEnv) }

// Probe is the plan's runtime proof: its images by the digests plan proved (the configuration's,
// for a plan made without a proof).
func (pl *Planner) Probe(p *plan.Plan) plan.Probe {
	if p.Probe.Image != "" {
		return p.Probe
	}

	cfg := pl.Config.Nodes.Probe

	return plan.Probe{Image: cfg.Image, Images: cfg.Images, Namespace: cfg.Namespace, ServiceAccount: cfg.ServiceAccount}
}

// ProbeAdmissible checks, with a server-side dry run, that the plan's runtime probe pod is
// admitted as it is on the first node the plan acts on (any node when it acts on none): a probe
// that PodSecurity, a webhook or a policy would deny, or that admission would give a pull
// secret, fails here, before any node is touched.
func (pl *Planner) ProbeAdmissible(ctx context.Context, p *plan.Plan) error {
	pr := pl.Probe(p)
	if pr.Image == "" || len(p.Nodes) == 0 {
		return nil
	}

	node := p.Nodes[0].Name // the plan's order: the first node acted on, if any

	err := pl.Admission.ProbeAdmissible(ctx, node, pr)
	if err != nil {
		return fmt.Errorf("%w. Nothing was changed: fix the probe's namespace or the policy, or set nodes.runtime_probe (docs/apply.md)", err)
	}

	return nil
}

// talosRoleSuffices fails the plan when Talos refused this identity a read of any node's facts
// (PermissionDenied): a plan that could not read the fleet is not a plan — it would leave every
// such node alone and still say "changes", a green check on nothing read. Reading a machine
// config is os:admin on Talos (os:reader sees the version only).
func (pl *Planner) talosRoleSuffices(snap plan.Snapshot) error {
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
	if t := pl.Config.Talos.Talosconfig; t != "" {
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
