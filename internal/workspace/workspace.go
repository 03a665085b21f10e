// Package workspace opens what a command works with, once each: the configuration, the
// Kubernetes connections (apply's, and the template identity's), the state (locked when the
// command writes it), the decrypted credential and the Talos client; and it observes the fleet
// into the planner's snapshot. It wires inputs — apply and the fence commands are handed theirs
// as plain structs (Apply, Fences) and never see the workspace. It never sequences a run (that is
// apply's) nor decides what a run does (that is plan's); the one check it owns is the permission
// preflight: whether the identities may run the command at all (Preflight).
package workspace

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fanout"
	"github.com/ghcrsync/ghcrsync/internal/fleet"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
	"github.com/ghcrsync/ghcrsync/internal/pin"
	"github.com/ghcrsync/ghcrsync/internal/planning"
	"github.com/ghcrsync/ghcrsync/internal/prover"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
	"github.com/ghcrsync/ghcrsync/state/kubestate"
)

// Options open a workspace.
type Options struct {
	ConfigPath string
	// Lock takes the state's lock for the workspace's lifetime (commands that write it).
	Lock bool
	// Preflight, if set, is the command class (CommandPlan, …) whose permissions are checked
	// before the state is read or locked: a missing permission is the first error, not a
	// forbidden read half-way.
	Preflight string
	// PreflightReads checks only what Preflight's command reads (PreflightReads): the command
	// checks its writes itself, later.
	PreflightReads bool
	// Overrides are the command line's connection flags.
	Overrides config.Overrides
	// Context bounds the preflight's calls.
	Context context.Context
	// Clock is the one clock every part of the command reads and waits on (nil: clock.System).
	Clock clock.Clock
	// Faults are a test's: they stand between the command and the cluster, as a flaky network
	// would (nil in production).
	Faults *Faults
	// UnreadableState, if set, lets the command go on when the state cannot be read (corrupt,
	// or of another format): it is told why (and may still refuse); the workspace then has an
	// empty state, Unreadable set, and a store that writes nothing.
	UnreadableState func(err error, u *state.UnreadableError) error
}

// Faults wrap the workspace's connections: Kube the Kubernetes client's transport, Talos the
// Talos client's calls.
type Faults struct {
	Kube  func(http.RoundTripper) http.RoundTripper
	Talos grpc.UnaryClientInterceptor
}

// Workspace is a command's inputs.
type Workspace struct {
	Config *config.Config
	Kube   *cluster.Connection
	Store  state.Store
	State  *state.State
	// Unreadable is why the state could not be read (Options.UnreadableState), else nil.
	Unreadable error

	clock  clock.Clock
	faults *Faults
	locked bool
	cred   *credential.Credential
	// tenants are the tenant credentials, decrypted once each (by name).
	tenants map[string]*credential.Credential
	talos   *talos.Client
	// templateKube is the template identity's connection (cluster.template_kubeconfig), once
	// opened.
	templateKube *cluster.Connection
	// templatesChecked: the template identity's preflight passed (it is checked once).
	templatesChecked bool
	// outside are the consumer namespaces the identity's roles do not cover (the preflight found
	// nothing granted there): their pull secrets are neither read nor written.
	outside map[string]bool
}

// Open reads the configuration, builds the Kubernetes client, checks the command's permissions
// if asked (the first contact with the cluster) and reads the state from its backend, locked if
// asked.
func Open(o Options) (*Workspace, error) {
	cfg, err := config.Load(o.ConfigPath)
	if err != nil {
		return nil, err
	}

	if err := cfg.Override(o.Overrides); err != nil {
		return nil, err
	}

	kube, err := connect(cfg)
	if err != nil {
		return nil, err
	}

	if o.Faults != nil && o.Faults.Kube != nil {
		if err := kube.Wrap(o.Faults.Kube); err != nil {
			return nil, err
		}
	}

	clk := clock.Or(o.Clock)
	w := &Workspace{Config: cfg, Kube: kube, Store: openStore(cfg, kube, clk), clock: clk, faults: o.Faults, outside: map[string]bool{}}
	kube.Clock = w.clock

	if err := w.checkAccess(o); err != nil {
		return nil, err
	}

	if o.Lock {
		if err := w.Store.Lock(); err != nil {
			return nil, err
		}

		w.locked = true
	}

	if err := w.readState(o); err != nil {
		w.Close()

		return nil, err
	}

	return w, nil
}

// checkAccess checks the command's permissions, if asked: the first contact with the cluster.
func (w *Workspace) checkAccess(o Options) error {
	if o.Preflight == "" {
		return nil
	}

	ctx := o.Context
	if ctx == nil {
		ctx = context.Background()
	}

	check := w.Preflight
	if o.PreflightReads {
		check = w.PreflightReads
	}

	return check(ctx, o.Preflight)
}

// readState reads the state from its backend. A command that repairs a wedge
// (o.UnreadableState) carries on from the cluster's own records when it cannot be read (the
// nodes' annotations), and never writes over what it could not read.
func (w *Workspace) readState(o Options) error {
	var err error
	if w.State, err = w.Store.Read(); err == nil {
		return nil
	}

	u, unreadable := state.Unreadable(err)
	if !unreadable || o.UnreadableState == nil {
		return err
	}

	if err := o.UnreadableState(err, u); err != nil {
		return err
	}

	w.State, w.Unreadable = &state.State{FormatVersion: state.FormatVersion}, err
	w.Store = keepOut{w.Store}

	return nil
}

// keepOut is a store whose state could not be read: reads give nothing, writes are dropped, so
// what is there (corrupt, or of a newer ghcrsync) is never overwritten by a repair.
type keepOut struct{ state.Store }

func (keepOut) Write(*state.State) error { return nil }

// PushOver writes src over a state that could not be read (Unreadable): a corrupt one always —
// it is what `state push` exists to repair — one of another format only with force (it may be a
// newer ghcrsync's, whose records this one cannot judge).
func (w *Workspace) PushOver(src *state.State, force bool) error {
	k, ok := w.Store.(keepOut)
	if !ok {
		return state.Push(w.Store, w.State, src, force)
	}

	if u, _ := state.Unreadable(w.Unreadable); u != nil && u.Newer && !force {
		return fmt.Errorf("%s holds a state this ghcrsync cannot read (%v): pass --force to replace it", k.Describe(), w.Unreadable)
	}

	return k.Store.Write(src)
}

func openStore(cfg *config.Config, kube *cluster.Connection, clk clock.Clock) state.Store {
	if cfg.State.Backend == "kubernetes" {
		return &kubestate.Store{Client: kube.Client, Namespace: cfg.State.Namespace, Name: cfg.State.Secret, Clock: clk}
	}

	return &state.Local{Path: cfg.State.Path}
}

// Close unlocks the state and closes the Talos connection.
func (w *Workspace) Close() {
	if w.locked {
		w.Store.Unlock()
		w.locked = false
	}

	if w.talos != nil {
		_ = w.talos.Close()
		w.talos = nil
	}
}

// TemplateKube is the connection node templates are written with: the template identity's
// (cluster.template_kubeconfig), or apply's own when none is configured.
func (w *Workspace) TemplateKube() (*cluster.Connection, error) {
	if w.Config.Cluster.TemplateKubeconfig == "" {
		return w.Kube, nil
	}

	if w.templateKube == nil {
		c, err := cluster.Connect(w.Config.Cluster.TemplateKubeconfig, "", w.Config.Cluster.Timeout)
		if err != nil {
			return nil, fmt.Errorf("cluster.template_kubeconfig: %w", err)
		}

		if w.faults != nil && w.faults.Kube != nil {
			if err := c.Wrap(w.faults.Kube); err != nil {
				return nil, err
			}
		}

		c.Clock = w.clock
		w.templateKube = c
	}

	return w.templateKube, nil
}

// Requests are the calls made so far: to the Kubernetes API, and to Talos (zero when no Talos
// client was opened), and both by the step that made them (requests.Steps).
func (w *Workspace) Requests() (kube, talos, steps string) {
	var tc *requests.Counter

	talos = "0"
	if w.talos != nil {
		tc = w.talos.Requests
		talos = tc.String()
	}

	return w.Kube.Requests.String(), talos, requests.Steps(w.Kube.Requests, tc)
}

// Now is the workspace's clock.
func (w *Workspace) Now() time.Time { return w.clock.Now() }

// Credential decrypts and validates the credential (once).
func (w *Workspace) Credential() (*credential.Credential, error) {
	if w.cred == nil {
		c := w.Config.Credential

		cred, err := credential.Load(c.SopsFile, c.Key, c.Registry)
		if err != nil {
			return nil, err
		}

		w.cred = cred
	}

	return w.cred, nil
}

// TenantCredential decrypts and validates the named tenant credential (once).
func (w *Workspace) TenantCredential(name string) (*credential.Credential, error) {
	t := w.Config.Tenant(name)
	if t == nil {
		return nil, fmt.Errorf("the configuration has no credential %q: the plan was made with another configuration; plan again", name)
	}

	if c, ok := w.tenants[name]; ok {
		return c, nil
	}

	c := t.Credential

	cred, err := credential.Load(c.SopsFile, c.Key, c.Registry)
	if err != nil {
		return nil, fmt.Errorf("credential %q: %w", name, err)
	}

	if w.tenants == nil {
		w.tenants = map[string]*credential.Credential{}
	}

	w.tenants[name] = cred

	return cred, nil
}

// Tenants are the tenant credentials, decrypted, by name (none: one credential).
func (w *Workspace) Tenants() (map[string]*credential.Credential, error) {
	out := map[string]*credential.Credential{}

	for _, t := range w.Config.Tenants {
		c, err := w.TenantCredential(t.Credential.Name)
		if err != nil {
			return nil, err
		}

		out[t.Credential.Name] = c
	}

	return out, nil
}

// Talos connects the Talos client (once).
func (w *Workspace) Talos(ctx context.Context) (*talos.Client, error) {
	if w.talos == nil {
		t := w.Config.Talos

		var extra []grpc.DialOption
		if w.faults != nil && w.faults.Talos != nil {
			extra = append(extra, grpc.WithChainUnaryInterceptor(w.faults.Talos))
		}

		tc, err := talos.Connect(ctx, t.Talosconfig, t.Context, t.Endpoints, t.Timeout, extra...)
		if err != nil {
			return nil, err
		}

		w.talos = tc
	}

	return w.talos, nil
}

// Fleet is the fleet reader on the workspace's clients: the Kubernetes connection, the Talos
// client (connected when a read first needs it), the consumer namespaces the preflight found
// outside the roles.
func (w *Workspace) Fleet() *fleet.Reader {
	return &fleet.Reader{Config: w.Config, Kube: w.Kube, Endpoint: w.Kube.Endpoint, Talos: w.facts, Clock: w.clock, OutsideRoles: w.outside}
}

func (w *Workspace) facts(ctx context.Context) (fleet.Facts, error) {
	tc, err := w.Talos(ctx)
	if err != nil {
		return nil, err // not a nil *talos.Client in a non-nil interface
	}

	return tc, nil
}

// Prover asks the registry about the configuration's credentials, decrypted by the workspace.
func (w *Workspace) Prover() *prover.Prover {
	return &prover.Prover{Config: w.Config, Credentials: w, Clock: w.clock}
}

// Planner is the plan operation on the workspace's reader, prover and clients.
func (w *Workspace) Planner() *planning.Planner {
	return &planning.Planner{Config: w.Config, State: w.State, Credentials: w, Clock: w.clock, Fleet: w.Fleet(), Prover: w.Prover(),
		Talos: w.dryRunner, Writes: writes{w}, Admission: w.Kube, Others: w.others()}
}

func (w *Workspace) dryRunner(ctx context.Context) (planning.Talos, error) {
	tc, err := w.Talos(ctx)
	if err != nil {
		return nil, err
	}

	return tc, nil
}

// writes are the fan-out's writes as server-side dry runs, on the clients apply makes them with:
// the node templates on the template identity's (TemplateKube).
type writes struct{ w *Workspace }

func (d writes) DryRun(ctx context.Context, p *plan.Plan, o secretwrite.Options) map[string]error {
	templates, err := d.w.TemplateKube()
	if err != nil { // apply's preflight connected it; plan's (the plan identity's) dry runs are its own
		templates = d.w.Kube
	}

	return fanout.DryRun(ctx, d.w.Kube.Client, templates.Client, p, o)
}

// Liveness is the configured liveness source, or nil.
func (w *Workspace) Liveness() liveness.Source {
	l := w.Config.Liveness
	if l == nil {
		return nil
	}

	return &liveness.GitHubActions{APIURL: l.APIURL, Repository: l.Repository, Token: os.Getenv(l.TokenEnv),
		TrustedHosts: append([]string{pin.Host(config.DefaultGitHubAPI)}, l.TrustedHosts...)}
}
