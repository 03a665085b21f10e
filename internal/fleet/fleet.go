// Package fleet reads the cluster and its machines into the planner's types: the one place that
// turns a LIST of Nodes, each node's Talos answers, the pods, the run Lease, the pull secrets, the
// node templates and the Flux Kustomizations into a plan.Snapshot — for plan, for apply's re-read
// of the fleet (late nodes, the verdict) and for the credentials a run re-checks; and the control
// planes as the etcd gate reads them before each control plane is taken down. The objects'
// conversion is internal/cluster's and internal/talos's; what is read, and in which order, is
// fleet's. It decides nothing.
package fleet

import (
	"context"
	"fmt"
	"slices"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Facts are the Talos answers the reader asks for: each node's facts, batched (talos.Client).
type Facts interface {
	FillFacts(ctx context.Context, nodes []plan.Node, registry string, parallel int) map[string]talos.Read
}

// Cluster is the Kubernetes API as the fleet reader reads it (cluster.Connection): its Nodes and
// what runs on them, the secrets it writes and watches, and the run's own objects.
type Cluster interface {
	NodeReader
	SecretReader
	RunReader
}

// NodeReader reads the Nodes (those the selector picks, and the rest), the pods' image pull
// secrets, the machines being provisioned, and the cluster's identity.
type NodeReader interface {
	ClusterUID(ctx context.Context) (string, error)
	Nodes(ctx context.Context, selector string) (fleet, outside []plan.Node, err error)
	Pods(ctx context.Context, registry string) (cluster.PodsObs, error)
	Provisioning(ctx context.Context) (*plan.AutoscalerObs, error)
}

// SecretReader reads the pull secrets and node templates, and the namespaces a selector picks.
type SecretReader interface {
	ObserveSecret(ctx context.Context, t cluster.SecretTarget, registry string) (plan.SecretObs, *credential.Credential, error)
	SelectedNamespaces(ctx context.Context, selector string) ([]string, error)
	TemplateReader(ctx context.Context, nsName string) (*plan.ReaderObs, error)
	TemplateValue(ctx context.Context, namespace, name, key string) ([]byte, cluster.TemplateMeta, error)
}

// RunReader reads the run Lease and the Flux Kustomizations a run suspends.
type RunReader interface {
	Lease(ctx context.Context, namespace, name string) (*plan.Lease, error)
	Kustomization(ctx context.Context, ns, name string) (plan.KustomizationObs, error)
}

var _ Cluster = (*cluster.Connection)(nil)

// Reader reads the fleet the configuration names, on the clients it is handed.
type Reader struct {
	Config *config.Config
	Kube   Cluster
	// Endpoint is the API server's host the snapshot names.
	Endpoint string
	// Talos connects the Talos client when a read first needs it.
	Talos func(ctx context.Context) (Facts, error)
	Clock clock.Clock
	// OutsideRoles are the consumer namespaces the identity's roles do not cover (the
	// preflight's finding): their pull secrets are neither read nor written.
	OutsideRoles map[string]bool
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
type Memory struct {
	Held  []Held
	Talos map[string]talos.Read
}

// Read observes the fleet: one LIST of Nodes with each node's Talos facts and pods, the run
// Lease, the configured pull secrets, node templates and Flux Kustomizations; and, in memory,
// the credentials they hold.
func (r *Reader) Read(ctx context.Context) (plan.Snapshot, Memory, error) {
	cfg := r.Config

	uid, err := r.Kube.ClusterUID(ctx)
	if err != nil {
		return plan.Snapshot{}, Memory{}, err
	}

	nodes, outside, refs, mem, err := r.nodes(ctx)
	if err != nil {
		return plan.Snapshot{}, Memory{}, err
	}

	lease, err := r.Kube.Lease(ctx, cfg.Lease.Namespace, cfg.Lease.Name)
	if err != nil {
		return plan.Snapshot{}, Memory{}, err
	}

	secrets, heldBySecrets, err := r.secrets(ctx)
	if err != nil {
		return plan.Snapshot{}, Memory{}, err
	}

	mem.Held = append(mem.Held, heldBySecrets...)

	templates, err := r.Templates(ctx)
	if err != nil {
		return plan.Snapshot{}, Memory{}, err
	}

	kustomizations, err := r.Kustomizations(ctx)
	if err != nil {
		return plan.Snapshot{}, Memory{}, err
	}

	var autoscaler *plan.AutoscalerObs

	if len(cfg.NodeTemplates) > 0 { // machines it creates boot from a template ghcrsync rewrites
		if autoscaler, err = r.Kube.Provisioning(ctx); err != nil {
			return plan.Snapshot{}, Memory{}, err
		}
	}

	return plan.Snapshot{TakenAt: r.Clock.Now().UTC(), APIEndpoint: r.Endpoint, ClusterUID: uid, Nodes: nodes, OtherNodes: plan.Identities(outside),
		Outside: outside, Lease: lease, Secrets: secrets, Templates: templates, Kustomizations: kustomizations, PullSecretRefs: refs, Autoscaler: autoscaler}, mem, nil
}

// nodes observes the selected nodes — each with its Talos facts, its evictable pods and what
// would hold their eviction — the nodes outside the selector with their Talos facts too (the
// verdict judges every Node of the cluster), in one batched read, the pull secrets pods
// reference for the registry's images, and the credentials the selected nodes hold.
func (r *Reader) nodes(ctx context.Context) (nodes, outside []plan.Node, refs []plan.PullSecretRef, mem Memory, err error) {
	cfg := r.Config

	nodes, outside, err = r.Kube.Nodes(ctx, cfg.Nodes.Selector)
	if err != nil {
		return nil, nil, nil, Memory{}, err
	}

	tc, err := r.Talos(ctx)
	if err != nil {
		return nil, nil, nil, Memory{}, err
	}

	all := append(nodes, outside...) //nolint:gocritic // one batched read; split below
	mem.Talos = tc.FillFacts(ctx, all, cfg.Credential.Registry, cfg.Talos.Concurrency)
	nodes, outside = all[:len(nodes):len(nodes)], all[len(nodes):]

	for _, n := range nodes {
		if c := mem.Talos[n.Name].Credential; c != nil {
			mem.Held = append(mem.Held, Held{Node: n.Name, Cred: c})
		}
	}

	pods, err := r.Kube.Pods(ctx, cfg.Credential.Registry)
	if err != nil {
		return nil, nil, nil, Memory{}, err
	}

	for i := range nodes {
		nodes[i].Pods, nodes[i].Blockers = pods.Evictable[nodes[i].Name], pods.Blockers[nodes[i].Name]
	}

	return nodes, outside, pods.Refs, mem, nil
}

// secrets observes every pull secret the run writes, and the credentials they hold.
func (r *Reader) secrets(ctx context.Context) ([]plan.SecretObs, []Held, error) {
	targets, err := r.SecretTargets(ctx)
	if err != nil {
		return nil, nil, err
	}

	secrets := make([]plan.SecretObs, 0, len(targets))

	var held []Held

	for _, t := range targets {
		registry := r.Config.Credential.Registry
		if tenant := r.Config.Tenant(t.Credential); tenant != nil {
			registry = tenant.Credential.Registry
		}

		obs, cred, err := r.Kube.ObserveSecret(ctx, t, registry)
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
func (r *Reader) Kustomizations(ctx context.Context) ([]plan.KustomizationObs, error) {
	out := make([]plan.KustomizationObs, 0, len(r.Config.FluxSuspend))

	for _, n := range r.Config.FluxSuspend {
		k, err := r.Kube.Kustomization(ctx, n.Namespace, n.Name)
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
func (r *Reader) Templates(ctx context.Context) ([]plan.TemplateObs, error) {
	var out []plan.TemplateObs

	for _, t := range r.Config.NodeTemplates {
		value, meta, err := r.Kube.TemplateValue(ctx, t.Namespace, t.Secret, t.Key)

		var reader *plan.ReaderObs
		if err == nil && t.RestartDeployment != "" {
			reader, err = r.Kube.TemplateReader(ctx, t.RestartDeployment)
		}

		if err == nil {
			var pools []nodetemplate.Pool

			// Every pool that carries a machine config is judged; t.Pools limits what is written.
			if err = checkPools(t, value); err == nil {
				pools, err = nodetemplate.Read(t.Format, value, nil, r.Config.Credential.Registry)
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
func (r *Reader) SecretTargets(ctx context.Context) ([]cluster.SecretTarget, error) {
	targets, err := r.Targets(ctx)

	for i := range targets {
		targets[i].OutsideRoles = r.OutsideRoles[targets[i].Namespace]
	}

	return targets, err
}

// Targets are the configured pull secrets as the cluster's namespaces select them now, none
// marked (the preflight's list, before it knows which namespaces the roles cover).
func (r *Reader) Targets(ctx context.Context) ([]cluster.SecretTarget, error) {
	selected := map[string][]string{}

	for _, sel := range r.Config.Selectors() {
		names, err := r.Kube.SelectedNamespaces(ctx, sel)
		if err != nil {
			return nil, err
		}

		selected[sel] = names
	}

	return PullSecrets(r.Config, selected), nil
}

// PullSecrets are the pull secrets the configuration names, each credential's consumer selector's
// secret in every namespace it matches (selected, by selector): consumers by namespace and name,
// the root last. A pull secret two credentials' consumers name is contested (it can hold only
// one): it is neither read nor written, and counts as unknown in each one's verdict — a
// namespace relabelled by mistake does not stop every run, an emergency's included.
func PullSecrets(cfg *config.Config, selected map[string][]string) []cluster.SecretTarget {
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

	contested := contestedSecrets(consumers)
	var targets []cluster.SecretTarget

	for _, t := range consumers { // a contested one once, as its first credential names it
		if !slices.ContainsFunc(targets, func(x cluster.SecretTarget) bool { return x.Namespace == t.Namespace && x.Name == t.Name }) {
			targets = append(targets, t)
		}
	}

	targets = cluster.ConsumerTargets(targets, nil, "", nil, "") // sorted

	if r := cfg.FluxRoot; r != nil {
		targets = append(targets, cluster.SecretTarget{Namespace: r.Namespace, Name: r.Secret, Role: plan.RoleRoot})
	}

	marks := []string{cfg.Credential.Name}
	for _, t := range cfg.Tenants {
		marks = append(marks, t.Credential.Name)
	}

	for i := range targets {
		targets[i].Configuration, targets[i].Marks = cfg.Identity(), marks
		targets[i].Contested = contested[targets[i].Namespace+"/"+targets[i].Name]
	}

	return targets
}

// contestedSecrets are the pull secrets (namespace/name) two credentials' consumers name, with
// those credentials (the cluster's as ""), in the configuration's order.
func contestedSecrets(consumers []cluster.SecretTarget) map[string][]string {
	by := map[string][]string{}

	for _, t := range consumers {
		key := t.Namespace + "/" + t.Name
		if !slices.Contains(by[key], t.Credential) {
			by[key] = append(by[key], t.Credential)
		}
	}

	out := map[string][]string{}

	for key, creds := range by {
		if len(creds) > 1 {
			out[key] = creds
		}
	}

	return out
}

// HeldByNodes reads the credentials the selected nodes' active configs hold now: one LIST of the
// Nodes, one Talos read each. The credentials stay in memory.
func (r *Reader) HeldByNodes(ctx context.Context) ([]Held, error) {
	nodes, _, err := r.Kube.Nodes(ctx, r.Config.Nodes.Selector)
	if err != nil {
		return nil, err
	}

	tc, err := r.Talos(ctx)
	if err != nil {
		return nil, err
	}

	var held []Held

	for name, read := range tc.FillFacts(ctx, nodes, r.Config.Credential.Registry, r.Config.Talos.Concurrency) {
		if read.Credential != nil {
			held = append(held, Held{Node: name, Cred: read.Credential})
		}
	}

	return held, nil
}
