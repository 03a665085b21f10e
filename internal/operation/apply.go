package operation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/dynamic"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fanout"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// ApplyOptions are `ghcrsync apply`'s inputs.
type ApplyOptions struct {
	ConfigPath  string
	PlanPath    string // empty: plan now (--auto-approve)
	RunRef      string
	Logger      hclog.Logger
	Progress    io.Writer
	Hooks       apply.Hooks
	SecretHooks fanout.Hooks
	OnPlan      func(*plan.Plan) // called with the plan before anything is written
	Now         func() time.Time
}

// ApplyResult is what a run did.
type ApplyResult struct {
	Plan       *plan.Plan
	Holder     string
	Results    []apply.Result
	Secrets    []fanout.Result
	Reclaimed  []fence.Outcome // fences of terminated runs released before the run
	ReleaseErr error           // the Lease could not be released after the run
}

// Failed counts failed nodes and pull secrets (a held-back root counts: the rotation is not done).
func (r *ApplyResult) Failed() int {
	n := 0

	for _, x := range r.Results {
		if x.Failed() {
			n++
		}
	}

	for _, s := range r.Secrets {
		if s.Outcome == fanout.Failed || s.Outcome == fanout.HeldBack {
			n++
		}
	}

	return n
}

// StaleError is a saved plan that no longer matches the world.
type StaleError struct{ Why, PlanPath string }

func (e *StaleError) Error() string {
	return fmt.Sprintf("Saved plan is stale — %s. Run `ghcrsync plan --out %s` again, review it, and apply the new plan. Nothing was changed.", e.Why, e.PlanPath)
}

// Apply executes a saved plan (or plans first), under the Lease, writing the state before
// every mutation.
func Apply(ctx context.Context, o ApplyOptions) (*ApplyResult, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}

	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}

	// Configuration, cluster connection and the state, locked for the whole run.
	r, err := openRecovery(FencesOptions{ConfigPath: o.ConfigPath}, true)
	if err != nil {
		return nil, err
	}
	defer r.store.Unlock()

	cfg, kube, store, st := r.cfg, r.kube, r.store, r.st

	var p *plan.Plan

	if o.PlanPath != "" {
		if p, err = plan.Load(o.PlanPath); err != nil {
			return nil, err
		}
	} else {
		res, err := Plan(ctx, PlanOptions{ConfigPath: o.ConfigPath, Now: o.Now})
		if err != nil {
			return nil, err
		}

		p = res.Plan
	}

	if o.OnPlan != nil {
		o.OnPlan(p)
	}

	cred, err := credential.Load(cfg.Credential.SopsFile, cfg.Credential.Key, cfg.Credential.Registry)
	if err != nil {
		return nil, err
	}

	if err := checkStale(p, o.PlanPath, cfg, cred, st, now()); err != nil {
		return nil, err
	}

	result := &ApplyResult{Plan: p}
	if !p.Changes() {
		return result, nil
	}

	if len(cfg.Credential.Prove) > 0 {
		if err := prove(ctx, cfg, cred); err != nil {
			return nil, fmt.Errorf("%w; nothing was changed", err)
		}
	}

	// Fences of runs that are provably over are reclaimed first (never on mere expiry).
	reclaimed, err := reclaim(ctx, cfg, kube, store, st, o.Progress)
	if err != nil {
		return nil, fmt.Errorf("reclaim fences of terminated runs: %w; nothing was changed", err)
	}

	for _, r := range reclaimed {
		log.Warn("reclaimed a fence of a terminated run", "fence", r.Fence.Kind+" "+r.Fence.Name, "holder", r.Fence.Holder,
			"evidence", r.Fence.Evidence, "result", r.Message)
	}

	result.Reclaimed = reclaimed

	tc, err := talos.Connect(ctx, cfg.Talos.Talosconfig, cfg.Talos.Context, cfg.Talos.Endpoints)
	if err != nil {
		return nil, err
	}
	defer tc.Close()

	holder := lease.Holder(cred.Revision(), lease.RunRef(o.RunRef))
	result.Holder = holder

	l, err := lease.Acquire(ctx, kube.Client, lease.Options{
		Namespace: cfg.Lease.Namespace, Name: cfg.Lease.Name, Holder: holder,
		Duration: cfg.Lease.Duration, Heartbeat: cfg.Lease.Heartbeat,
		Logf: func(f string, a ...any) { log.Warn(fmt.Sprintf(f, a...)) },
	})
	if err != nil {
		return nil, err
	}

	l.Start(ctx)
	log.Info("lease acquired", "lease", cfg.Lease.Namespace+"/"+cfg.Lease.Name, "holder", holder)

	st.Run = &state.Run{Holder: holder, CredentialRevision: p.CredentialRevision, Started: now().UTC()}
	if err := store.Write(st); err != nil {
		result.ReleaseErr = l.Release(context.WithoutCancel(ctx))

		return nil, fmt.Errorf("write state %s: %w; nothing was changed", cfg.State.Path, err)
	}

	if p.EndpointNode != "" {
		for _, n := range p.Nodes {
			if n.Name == p.EndpointNode && n.Action == plan.ActionFence {
				log.Warn("the node serving the kubeconfig's API endpoint is fenced last; the API is unreachable while it reboots and ghcrsync waits for it",
					"node", n.Name, "endpoint", kube.Server)
			}
		}
	}

	exec := apply.New(kube, tc, l, store, st, apply.Options{
		Holder: holder, Registry: cfg.Credential.Registry, Username: cred.Username, Password: cred.Password(),
		DrainTimeout: cfg.Nodes.DrainTimeout, ReadyTimeout: cfg.Nodes.ReadyTimeout, WorkerParallelism: cfg.Nodes.WorkerParallelism,
		ProbeImage: cfg.Nodes.Probe.Image, ProbeNamespace: cfg.Nodes.Probe.Namespace,
		Logger: log.Named("apply"), Progress: o.Progress, Hooks: o.Hooks,
	})

	result.Results = exec.Run(ctx, p)

	nodesOK := result.Failed() == 0

	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		return nil, err
	}

	root := ""
	if cfg.FluxRoot != nil {
		root = cfg.FluxRoot.OCIRepository
	}

	result.Secrets = fanout.Run(ctx, kube.Client, dyn, p, fanout.Options{
		Data: cred.DockerConfigJSON(), NodesOK: nodesOK, OCIRepository: root, Assert: l.Assert, Hooks: o.SecretHooks,
		Record: func(ns, name, role, outcome string) error {
			st.PutSecret(state.SecretRecord{Namespace: ns, Name: name, Role: role, DesiredRevision: p.CredentialRevision, Outcome: outcome, Updated: now().UTC()})

			return store.Write(st)
		},
	})

	for _, s := range result.Secrets {
		log.Info("pull secret", "secret", s.Namespace+"/"+s.Secret, "role", s.Role, "outcome", s.Outcome, "detail", s.Message)
	}

	finished := now().UTC()
	st.Run.Finished = &finished
	st.Run.Outcome = "succeeded"

	if result.Failed() > 0 {
		st.Run.Outcome = "failed"
	}

	if err := store.Write(st); err != nil {
		log.Error("write final state", "error", err)
	}

	// The run's own context may be cancelled (SIGINT): release regardless, bounded.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()

	result.ReleaseErr = l.Release(rctx)

	return result, nil
}

func checkStale(p *plan.Plan, path string, cfg *config.Config, cred *credential.Credential, st *state.State, now time.Time) error {
	stale := func(why string, args ...any) error {
		return &StaleError{Why: fmt.Sprintf(why, args...), PlanPath: orDefault(path, "PLANFILE")}
	}

	switch {
	case now.After(p.ExpiresAt):
		return stale("it expired at %s", p.ExpiresAt.Format(time.RFC3339))
	case p.ConfigDigest != cfg.Digest:
		return stale("it was made from another configuration (%s changed since)", cfg.Path)
	case p.CredentialRevision != cred.Revision():
		return stale("it was made for another credential revision (%s now holds %.12s…, the plan %.12s…)", cfg.Credential.SopsFile, cred.Revision(), p.CredentialRevision)
	case p.State.Lineage != "" && p.State.Lineage != st.Lineage:
		return stale("it was made against another state (lineage %q, now %q)", p.State.Lineage, st.Lineage)
	case p.State.Serial != st.Serial || p.State.Lineage != st.Lineage:
		return stale("the state was changed by another operation after the plan was created (serial %d, now %d)", p.State.Serial, st.Serial)
	}

	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}

	return s
}

// IsStale reports whether err is a stale plan.
func IsStale(err error) bool {
	var s *StaleError

	return errors.As(err, &s)
}
