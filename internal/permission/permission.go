// Package permission is the one list of the Kubernetes permissions each command needs with a
// configuration (Needs), and its rendering as RBAC (Render): the preflight checks exactly what
// `ghcrsync rbac` grants, so a role can hold nothing the command does not use, and a command
// can need nothing its role lacks.
package permission

import (
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
)

// The command classes, each with its own identity.
const (
	CommandPlan    = "plan"
	CommandFences  = "fences"
	CommandApply   = "apply"
	CommandRelease = "release"
	// CommandTemplate is the node templates' writer: apply uses it for that step only
	// (cluster.template_kubeconfig), so that no one token both writes the machine config new
	// nodes boot from and forces a node to reboot into it.
	CommandTemplate = "template"
)

// Needs lists the Kubernetes permissions command needs with cfg, for the secret targets the
// consumers resolve to (every namespace is named: nothing is granted cluster-wide that a name
// or a namespace can bound).
func Needs(cfg *config.Config, command string, targets []cluster.SecretTarget) []cluster.Access {
	if command == CommandTemplate {
		return dedupe(templateNeeds(cfg))
	}

	needs := []cluster.Access{
		access("get", "", "nodes", "", ""), access("list", "", "nodes", "", ""),
		access("get", "", "namespaces", "", "kube-system"),
		access("get", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
	}

	kubeState := cfg.State.Backend == "kubernetes"
	if kubeState {
		needs = append(needs, access("get", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	if command == CommandPlan || command == CommandApply {
		needs = append(needs, readTargets(cfg, targets)...)
	}

	if command == CommandPlan { // the pods each drain would evict (the seed is the emptiest worker); apply lists pods to drain
		needs = append(needs, access("list", "", "pods", "", ""), access("list", "policy", "poddisruptionbudgets", "", ""))
	}

	if command == CommandPlan {
		// The server-side dry runs of the fan-out's writes (fanout.DryRun): the admission policy
		// lets the plan identity make dry runs only (PlanDryRunPolicy).
		needs = append(needs, dryRunWrites(cfg, targets)...)
	}

	if command == CommandPlan && cfg.Nodes.Probe.Image != "" {
		// The probe pod's server-side dry run; the admission policy lets the plan identity make
		// dry runs only (PlanDryRunPolicy).
		needs = append(needs, access("create", "", "pods", cfg.Nodes.Probe.Namespace, ""))
	}

	switch command {
	case CommandApply:
		needs = append(needs, applyNeeds(cfg, targets, kubeState)...)
	case CommandRelease:
		needs = append(needs, releaseNeeds(cfg, kubeState)...)
	}

	needs = append(needs, othersNeeds(cfg, command)...)
	needs = append(needs, fluxNeeds(cfg, command)...)

	return dedupe(needs)
}

// releaseNeeds are release's own: the fences' undo, the state, what a killed run left.
func releaseNeeds(cfg *config.Config, kubeState bool) []cluster.Access {
	needs := []cluster.Access{
		// The pod a run in the cluster ran in: ended or gone, its fences are releasable
		// without --holder (cluster.PodLiveness). plan and apply list pods already.
		access("list", "", "pods", "", ""),
		access("patch", "", "nodes", "", ""),
		access("patch", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		access("create", "", "events", "default", ""), access("create", "", "events", cfg.Lease.Namespace, ""),
	}

	if kubeState {
		needs = append(needs, access("update", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	if k := cfg.Nodes.Keyring; k != nil { // what a killed run left: writer pods, the writer's Secret
		needs = append(needs, access("list", "", "pods", k.Namespace, ""), access("delete", "", "pods", k.Namespace, ""),
			access("delete", "", "secrets", k.Namespace, k.Secret))
	}

	return needs
}

// fluxNeeds are the flux block's Kustomizations': read by every command (plan, and the fences a
// suspension leaves), suspended and resumed by apply, resumed by release.
func fluxNeeds(cfg *config.Config, command string) []cluster.Access {
	var needs []cluster.Access

	for _, k := range cfg.FluxSuspend {
		needs = append(needs, access("get", cluster.Kustomizations.Group, cluster.Kustomizations.Resource, k.Namespace, k.Name))

		if command == CommandApply || command == CommandRelease {
			needs = append(needs, access("patch", cluster.Kustomizations.Group, cluster.Kustomizations.Resource, k.Namespace, k.Name))
		}
	}

	return needs
}

// othersNeeds are the maintenance block's: kured's DaemonSet read (its lock, by every command
// that shows or releases fences) and its lock annotation written (apply takes it, apply and
// release give it back — the admission policy bounds the write to that annotation:
// DaemonSetsPolicy); the system-upgrade-controller's Plans listed before a node is fenced.
func othersNeeds(cfg *config.Config, command string) []cluster.Access {
	var needs []cluster.Access

	if k := cfg.Others.Kured; k.Name != "" {
		needs = append(needs, access("get", "apps", "daemonsets", k.Namespace, k.Name))

		if command == CommandApply || command == CommandRelease {
			needs = append(needs, access("patch", "apps", "daemonsets", k.Namespace, k.Name))
		}
	}

	if ns := cfg.Others.UpgradePlans; ns != "" && (command == CommandApply || command == CommandPlan) {
		needs = append(needs, access("list", cluster.UpgradePlans.Group, cluster.UpgradePlans.Resource, ns, ""))
	}

	return needs
}

// ListNamespaces is what resolving a consumer selector needs, before the targets are known.
func ListNamespaces() cluster.Access { return access("list", "", "namespaces", "", "") }

func readTargets(cfg *config.Config, targets []cluster.SecretTarget) []cluster.Access {
	var needs []cluster.Access

	if len(cfg.Selectors()) > 0 {
		needs = append(needs, ListNamespaces())
	}

	if len(cfg.NodeTemplates) > 0 { // the autoscaler's status: machines it is still creating
		needs = append(needs, access("get", "", "configmaps", cluster.AutoscalerStatusNamespace, cluster.AutoscalerStatusName))
	}

	for _, t := range cfg.NodeTemplates {
		needs = append(needs, access("get", "", "secrets", t.Namespace, t.Secret))

		// Whether the deployment that reads it once, at its start, restarted since it changed.
		if ns, name, ok := strings.Cut(t.RestartDeployment, "/"); ok {
			needs = append(needs, access("get", "apps", "deployments", ns, name))
		}
	}

	for _, t := range targets {
		needs = append(needs, access("get", "", "namespaces", "", t.Namespace), access("get", "", "secrets", t.Namespace, t.Name))

		for _, sa := range t.ServiceAccounts {
			needs = append(needs, access("get", "", "serviceaccounts", t.Namespace, sa))
		}
	}

	return needs
}

// dryRunWrites are the pull secret and template writes plan makes as server-side dry runs.
func dryRunWrites(cfg *config.Config, targets []cluster.SecretTarget) []cluster.Access {
	var needs []cluster.Access

	for _, t := range targets {
		needs = append(needs, access("create", "", "secrets", t.Namespace, ""), access("update", "", "secrets", t.Namespace, t.Name))
	}

	for _, t := range cfg.NodeTemplates {
		needs = append(needs, access("update", "", "secrets", t.Namespace, t.Secret))
	}

	return needs
}

func applyNeeds(cfg *config.Config, targets []cluster.SecretTarget, kubeState bool) []cluster.Access {
	probe := cfg.Nodes.Probe.Namespace
	needs := []cluster.Access{
		access("patch", "", "nodes", "", ""), access("watch", "", "nodes", "", ""),
		access("get", "", "pods", "", ""), access("list", "", "pods", "", ""),
		access("create", "", "pods/eviction", "", ""),
		access("get", "apps", "daemonsets", "", ""),
		access("list", "policy", "poddisruptionbudgets", "", ""),
		access("get", "", "namespaces", "", probe),
		access("create", "", "pods", probe, ""), access("delete", "", "pods", probe, ""), access("watch", "", "pods", probe, ""),
		// The finished proofs' pods, deleted a batch per request (their attempts' label).
		access("deletecollection", "", "pods", probe, ""),
		// The kubelet's Pulled event on the probe pod: the proof is a pull, not a copy on the node.
		// One watch of the probe pods' Events serves every proof of the run.
		access("list", "", "events", probe, ""), access("watch", "", "events", probe, ""),
		access("create", "coordination.k8s.io", "leases", cfg.Lease.Namespace, ""),
		access("update", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		access("patch", "coordination.k8s.io", "leases", cfg.Lease.Namespace, cfg.Lease.Name),
		// Events on the Nodes (in default) and on the Lease.
		access("create", "", "events", "default", ""), access("create", "", "events", cfg.Lease.Namespace, ""),
	}

	for _, t := range targets {
		needs = append(needs, access("create", "", "secrets", t.Namespace, ""), access("update", "", "secrets", t.Namespace, t.Name),
			access("create", "", "events", t.Namespace, ""))

		for _, sa := range t.ServiceAccounts {
			needs = append(needs, access("patch", "", "serviceaccounts", t.Namespace, sa))
		}
	}

	// The node templates are the template identity's to write (templateNeeds); apply records
	// their outcome as Events on them.
	for _, t := range cfg.NodeTemplates {
		needs = append(needs, access("create", "", "events", t.Namespace, ""))
	}

	if r := cfg.FluxRoot; r != nil && r.OCIRepository != "" {
		needs = append(needs, access("patch", "source.toolkit.fluxcd.io", "ocirepositories", r.Namespace, r.OCIRepository))
	}

	if kubeState {
		needs = append(needs, access("create", "", "secrets", cfg.State.Namespace, ""), access("update", "", "secrets", cfg.State.Namespace, cfg.State.Secret))
	}

	if k := cfg.Nodes.Keyring; k != nil {
		// The writer pods on the nodes (created, followed, deleted; a create whose answer was lost
		// is found by listing), and the Secret they read the credential from, written at the run's
		// start and deleted at its end. What the pods and the Secret may be is the admission
		// policy's (KeyringPolicy): the namespace holds nothing else.
		needs = append(needs,
			access("create", "", "pods", k.Namespace, ""), access("delete", "", "pods", k.Namespace, ""),
			access("list", "", "pods", k.Namespace, ""), access("watch", "", "pods", k.Namespace, ""),
			access("get", "", "secrets", k.Namespace, k.Secret), access("create", "", "secrets", k.Namespace, ""),
			access("update", "", "secrets", k.Namespace, k.Secret), access("delete", "", "secrets", k.Namespace, k.Secret))
	}

	return needs
}

// templateNeeds are the template identity's: read and update each node template Secret, and
// restart the deployment that reads it (then follow its rollout). No node, no eviction, no pull
// secret: a token that writes what new machines boot from cannot also reboot one into it.
func templateNeeds(cfg *config.Config) []cluster.Access {
	if len(cfg.NodeTemplates) == 0 {
		return nil
	}

	// The cluster's identity: the template connection must reach the cluster apply's does.
	needs := []cluster.Access{access("get", "", "namespaces", "", "kube-system")}

	for _, t := range cfg.NodeTemplates {
		needs = append(needs, access("get", "", "secrets", t.Namespace, t.Secret), access("update", "", "secrets", t.Namespace, t.Secret))

		if ns, name, ok := strings.Cut(t.RestartDeployment, "/"); ok {
			needs = append(needs, access("get", "apps", "deployments", ns, name), access("patch", "apps", "deployments", ns, name))
		}
	}

	return needs
}

// access is one permission: verb on resource (of group), in namespace ns ("" cluster-wide),
// named name ("" any).
func access(verb, group, resource, ns, name string) cluster.Access {
	return cluster.Access{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name}
}

// dedupe keeps the first of equal permissions, in order.
func dedupe(needs []cluster.Access) []cluster.Access {
	seen := map[cluster.Access]bool{}
	out := needs[:0:0]

	for _, a := range needs {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}

	return out
}

// Classes are the command classes that get an identity each: plan (which also runs fences,
// show and state list), apply and release (also destroy), and the node templates' writer.
var Classes = []string{CommandPlan, CommandApply, CommandRelease, CommandTemplate}

// Identities are the classes' identities with what each needs with cfg and targets (the
// template identity only when node templates are configured).
func Identities(cfg *config.Config, targets []cluster.SecretTarget) []Identity {
	out := make([]Identity, 0, len(Classes))

	for _, class := range Classes {
		if class == CommandTemplate && len(cfg.NodeTemplates) == 0 {
			continue
		}

		needs := Needs(cfg, class, targets)
		if class == CommandPlan {
			needs = dedupe(append(needs, Needs(cfg, CommandFences, targets)...))
		}

		out = append(out, Identity{Class: class, Account: AccountFor(class), Needs: needs})
	}

	return out
}
