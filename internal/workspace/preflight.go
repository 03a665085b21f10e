package workspace

import (
	"context"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
)

// The command classes, each with its own identity and RBAC manifest (deploy/rbac).
const (
	CommandPlan    = "plan"
	CommandFences  = "fences"
	CommandApply   = "apply"
	CommandRelease = "release"
)

var manifests = map[string]string{
	CommandPlan: "deploy/rbac/read.yaml", CommandFences: "deploy/rbac/read.yaml",
	CommandApply: "deploy/rbac/apply.yaml", CommandRelease: "deploy/rbac/release.yaml",
}

// Preflight checks, before anything is written, that the cluster grants every permission the
// command needs with this configuration: a command RBAC would stop half-way fails here, naming
// what is missing.
func (w *Workspace) Preflight(ctx context.Context, command string) error {
	needs, err := w.Needs(ctx, command)
	if err != nil {
		return err
	}

	denied, err := w.Kube.Denied(ctx, needs)
	if err != nil || len(denied) == 0 {
		return err
	}

	return &cluster.PermissionError{Command: command, Identity: w.Kube.Identity(ctx), Manifest: manifests[command], Denied: denied}
}

// Needs lists the Kubernetes permissions a command needs with this configuration.
func (w *Workspace) Needs(ctx context.Context, command string) ([]cluster.Access, error) {
	cfg := w.Config
	a := func(verb, group, resource, ns, name string) cluster.Access {
		return cluster.Access{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name}
	}

	needs := []cluster.Access{
		a("get", "", "nodes", "", ""), a("list", "", "nodes", "", ""),
		a("get", "", "namespaces", "", "kube-system"),
		a("get", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
	}

	kubeState := cfg.State.Backend == "kubernetes"
	if kubeState {
		needs = append(needs, a("get", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	var targets []cluster.SecretTarget

	if command == CommandPlan || command == CommandApply {
		if cfg.ConsumerSelector != nil {
			needs = append(needs, a("list", "", "namespaces", "", ""))

			if denied, err := w.Kube.Denied(ctx, needs[len(needs)-1:]); err != nil || len(denied) > 0 {
				return needs, err // the targets cannot be listed: report that first
			}
		}

		var err error
		if targets, err = w.SecretTargets(ctx); err != nil {
			return nil, err
		}

		for _, t := range targets {
			needs = append(needs, a("get", "", "secrets", t.Namespace, t.Name))

			for _, sa := range t.ServiceAccounts {
				needs = append(needs, a("get", "", "serviceaccounts", t.Namespace, sa))
			}
		}
	}

	switch command {
	case CommandApply:
		needs = append(needs, w.applyNeeds(targets, kubeState)...)
	case CommandRelease:
		needs = append(needs,
			a("patch", "", "nodes", "", ""),
			a("patch", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
			a("create", "", "events", "default", ""))

		if kubeState {
			needs = append(needs, a("update", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
		}
	}

	return needs, nil
}

func (w *Workspace) applyNeeds(targets []cluster.SecretTarget, kubeState bool) []cluster.Access {
	cfg := w.Config
	a := func(verb, group, resource, ns, name string) cluster.Access {
		return cluster.Access{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name}
	}

	probe := cfg.Nodes.Probe.Namespace
	needs := []cluster.Access{
		a("patch", "", "nodes", "", ""),
		a("get", "", "pods", "", ""), a("list", "", "pods", "", ""),
		a("create", "", "pods/eviction", "", ""),
		a("get", "apps", "daemonsets", "", ""),
		a("list", "policy", "poddisruptionbudgets", "", ""),
		a("create", "", "pods", probe, ""), a("delete", "", "pods", probe, ""),
		a("create", "coordination.k8s.io", "leases", cfg.Lease.Namespace, ""),
		a("update", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		a("patch", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		a("create", "", "events", "default", ""),
	}

	for _, t := range targets {
		needs = append(needs, a("create", "", "secrets", t.Namespace, ""), a("update", "", "secrets", t.Namespace, t.Name))

		for _, sa := range t.ServiceAccounts {
			needs = append(needs, a("update", "", "serviceaccounts", t.Namespace, sa))
		}
	}

	if r := cfg.FluxRoot; r != nil && r.OCIRepository != "" {
		needs = append(needs, a("patch", "source.toolkit.fluxcd.io", "ocirepositories", r.Namespace, r.OCIRepository))
	}

	if kubeState {
		needs = append(needs, a("create", "", "secrets", cfg.State.Namespace, ""), a("update", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	return needs
}
