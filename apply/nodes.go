package apply

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/window"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// nodes runs every node's transaction.
func (r *run) nodes(ctx context.Context) error {
	tc, etcd, err := r.in.Fleet.Talos(ctx)
	if err != nil {
		return err
	}

	r.announce(ctx)

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
		others: r.in.Others, stages: stages}, r.in.State, r.execOptions(w, recheck))

	r.res.Nodes = r.exec.run(ctx, r.p)

	if w != nil && slices.ContainsFunc(r.res.Nodes, func(n NodeResult) bool { return n.Outcome == state.OutcomeDeferred }) {
		r.res.WindowOpens = w.Next(r.in.Clock.Now())
	}

	return nil
}

// announce says, before the nodes, that the node serving the API endpoint goes last, and records
// each planned deselection on its Node.
func (r *run) announce(ctx context.Context) {
	if n, ok := r.p.Node(r.p.EndpointNode); ok && n.Action == plan.ActionFence {
		r.log.Warn("the node serving the kubeconfig's API endpoint is fenced last; the API is unreachable while it reboots and ghcrsync waits for it",
			"node", n.Name, "endpoint", r.in.Server)
	}

	for _, n := range r.p.Nodes {
		if n.Action == plan.ActionDeselect && n.UID != "" {
			r.event(ctx, object.NodeRef(n.Name, types.UID(n.UID)), "GhcrsyncDeselect",
				"run "+r.res.Holder+" leaves the node alone, as planned: "+n.Sentence, false)
		}
	}
}

// execOptions are the executor's options: the configuration's, the run's budget and window (w),
// and the registry's recheck, retry and control.
func (r *run) execOptions(w *window.Window, recheck func(context.Context) []plan.CredentialInUse) execOptions {
	cfg := r.in.Config

	return execOptions{
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
	}
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
