package workspace

import (
	"context"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Fences are the fence commands' inputs: what `fences`, `release` and an apply's reclaim read
// and write, the Kubernetes connection behind each of fence's ports.
func (w *Workspace) Fences() fence.Inputs {
	return fence.Inputs{
		Config: w.Config, Nodes: w.Kube, Leases: leases{w.Kube}, Flux: w.Kube, Events: w.Kube, Pods: liveness.Pod{Client: w.Kube.Client},
		Store: w.Store, State: w.State, Liveness: w.Liveness(), Clock: w.clock,
	}
}

// leases are the run Leases as fence reaches them: the connection's reads, and the release
// lease.ReleaseHolder makes.
type leases struct{ *cluster.Connection }

func (l leases) ReleaseLease(ctx context.Context, namespace, name, holder string) error {
	return lease.ReleaseHolder(ctx, l.Clock, l.Client, namespace, name, holder)
}

// Apply is a run's inputs: the fence commands', the credential decrypted once, the node this
// apply runs on, and the workspace as the run asks it (connecting Talos once, when a node is
// rotated).
func (w *Workspace) Apply() (apply.Inputs, error) {
	cred, err := w.Credential()
	if err != nil {
		return apply.Inputs{}, err
	}

	tenants, err := w.Tenants()
	if err != nil {
		return apply.Inputs{}, err
	}

	return apply.Inputs{Inputs: w.Fences(), Kube: w.Kube, Credential: cred, Tenants: tenants, Self: SelfNode(), Cluster: applyCluster{w}}, nil
}

// applyCluster is the workspace as a run asks it (apply.Cluster).
type applyCluster struct{ w *Workspace }

func (a applyCluster) Preflight(ctx context.Context) error { return a.w.Preflight(ctx, CommandApply) }

func (a applyCluster) Prove(ctx context.Context) error {
	if _, err := a.w.Prove(ctx); err != nil {
		return err
	}

	_, err := a.w.ProveTenants(ctx)

	return err
}

func (a applyCluster) Control(ctx context.Context, p *plan.Plan) error {
	return a.w.Control(ctx, a.w.Probe(p))
}

func (a applyCluster) Retry() credential.Retry { return a.w.Retry() }

func (a applyCluster) ProbeAdmissible(ctx context.Context, p *plan.Plan) error {
	return a.w.ProbeAdmissible(ctx, p)
}

func (a applyCluster) Probe(p *plan.Plan) plan.Probe { return a.w.Probe(p) }

func (a applyCluster) Talos(ctx context.Context) (apply.Talos, error) {
	tc, err := a.w.Talos(ctx)
	if err != nil {
		return nil, err // not a nil *talos.Client in a non-nil interface
	}

	return tc, nil
}

func (a applyCluster) HeldByNodes(ctx context.Context, desired string) (func(context.Context) []plan.CredentialInUse, error) {
	return a.w.HeldByNodes(ctx, desired)
}

// Observe reads the fleet into a snapshot and the planner's input, as plan does.
func (a applyCluster) Observe(ctx context.Context) (plan.Snapshot, plan.Input, error) {
	in, err := a.w.Input(PlanOptions{})
	if err != nil {
		return plan.Snapshot{}, plan.Input{}, err
	}

	snap, _, err := a.w.snapshot(ctx)

	return snap, in, err
}
