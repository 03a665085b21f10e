package workspace

import (
	"context"
	"strings"

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

	needs := []cluster.Access{
		access("get", "", "nodes", "", ""), access("list", "", "nodes", "", ""),
		access("get", "", "namespaces", "", "kube-system"),
		access("get", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
	}

	kubeState := cfg.State.Backend == "kubernetes"
	if kubeState {
		needs = append(needs, access("get", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	var targets []cluster.SecretTarget

	if command == CommandPlan || command == CommandApply {
		if cfg.ConsumerSelector != nil {
			needs = append(needs, access("list", "", "namespaces", "", ""))

			if denied, err := w.Kube.Denied(ctx, needs[len(needs)-1:]); err != nil || len(denied) > 0 {
				return needs, err // the targets cannot be listed: report that first
			}
		}

		var err error
		if targets, err = w.SecretTargets(ctx); err != nil {
			return nil, err
		}

		for _, t := range cfg.NodeTemplates {
			needs = append(needs, access("get", "", "secrets", t.Namespace, t.Secret))
		}

		for _, t := range targets {
			needs = append(needs, access("get", "", "secrets", t.Namespace, t.Name))

			for _, sa := range t.ServiceAccounts {
				needs = append(needs, access("get", "", "serviceaccounts", t.Namespace, sa))
			}
		}
	}

	switch command {
	case CommandApply:
		needs = append(needs, w.applyNeeds(targets, kubeState)...)
	case CommandRelease:
		needs = append(needs,
			access("patch", "", "nodes", "", ""),
			access("patch", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
			access("create", "", "events", "default", ""))

		if kubeState {
			needs = append(needs, access("update", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
		}
	}

	return needs, nil
}

func (w *Workspace) applyNeeds(targets []cluster.SecretTarget, kubeState bool) []cluster.Access {
	cfg := w.Config

	probe := cfg.Nodes.Probe.Namespace
	needs := []cluster.Access{
		access("patch", "", "nodes", "", ""), access("watch", "", "nodes", "", ""),
		access("get", "", "pods", "", ""), access("list", "", "pods", "", ""),
		access("create", "", "pods/eviction", "", ""),
		access("get", "apps", "daemonsets", "", ""),
		access("list", "policy", "poddisruptionbudgets", "", ""),
		access("create", "", "pods", probe, ""), access("delete", "", "pods", probe, ""), access("watch", "", "pods", probe, ""),
		access("create", "coordination.k8s.io", "leases", cfg.Lease.Namespace, ""),
		access("update", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		access("patch", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		access("create", "", "events", "default", ""),
	}

	for _, t := range targets {
		needs = append(needs, access("create", "", "secrets", t.Namespace, ""), access("update", "", "secrets", t.Namespace, t.Name))

		for _, sa := range t.ServiceAccounts {
			needs = append(needs, access("update", "", "serviceaccounts", t.Namespace, sa))
		}
	}

	for _, t := range cfg.NodeTemplates {
		needs = append(needs, access("update", "", "secrets", t.Namespace, t.Secret))

		if ns, name, ok := strings.Cut(t.RestartDeployment, "/"); ok {
			needs = append(needs, access("patch", "apps", "deployments", ns, name))
		}
	}

	if r := cfg.FluxRoot; r != nil && r.OCIRepository != "" {
		needs = append(needs, access("patch", "source.toolkit.fluxcd.io", "ocirepositories", r.Namespace, r.OCIRepository))
	}

	if kubeState {
		needs = append(needs, access("create", "", "secrets", cfg.State.Namespace, ""), access("update", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	return needs
}

// access is one permission: verb on resource (of group), in namespace ns ("" cluster-wide),
// named name ("" any).
func access(verb, group, resource, ns, name string) cluster.Access {
	return cluster.Access{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name}
}
