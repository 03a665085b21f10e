// Package operation runs ghcrsync's operations end to end: it owns the I/O edges (config,
// credential, registry, Kubernetes, Talos, state) and hands the decisions to the pure packages.
package operation

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
)

// PlanOptions are `ghcrsync plan`'s inputs.
type PlanOptions struct {
	ConfigPath string
	SkipProof  bool
	TTL        time.Duration
	// PreviousPlan, if set and readable, adds its nodes to those known to exist.
	PreviousPlan string
	Now          func() time.Time
}

// PlanResult is a plan with what was loaded to make it.
type PlanResult struct {
	Config *config.Config
	Plan   *plan.Plan
}

// Plan loads the configuration and the credential, proves the credential, observes the fleet
// and plans. It writes nothing anywhere.
func Plan(ctx context.Context, o PlanOptions) (*PlanResult, error) {
	cfg, err := config.Load(o.ConfigPath)
	if err != nil {
		return nil, err
	}

	cred, err := credential.Load(cfg.Credential.SopsFile, cfg.Credential.Key, cfg.Credential.Registry)
	if err != nil {
		return nil, err
	}

	if !o.SkipProof {
		if len(cfg.Credential.Prove) == 0 {
			return nil, fmt.Errorf("credential %q has no prove targets: list a private image in credential.prove so the credential is proved before anything is planned (or pass --skip-proof)", cfg.Credential.Name)
		}

		if err := prove(ctx, cfg, cred); err != nil {
			return nil, fmt.Errorf("%w; nothing was planned", err)
		}
	}

	kube, err := cluster.Connect(cfg.Cluster.Kubeconfig, cfg.Cluster.Context)
	if err != nil {
		return nil, err
	}

	prior, err := OpenStore(cfg, kube).Read()
	if err != nil {
		return nil, err
	}

	tc, err := talos.Connect(ctx, cfg.Talos.Talosconfig, cfg.Talos.Context, cfg.Talos.Endpoints)
	if err != nil {
		return nil, err
	}
	defer tc.Close()

	now := time.Now
	if o.Now != nil {
		now = o.Now
	}

	snap, err := Observe(ctx, kube, tc, cfg, now())
	if err != nil {
		return nil, err
	}

	known := map[string]string{}

	for _, r := range prior.Records {
		if r.Holds() {
			known[r.Node] = r.UID
		}
	}

	if o.PreviousPlan != "" {
		if prev, err := plan.Load(o.PreviousPlan); err == nil {
			for _, n := range prev.Nodes {
				if n.Action == plan.ActionFence || n.Action == plan.ActionApplyLive {
					known[n.Name] = n.UID
				}
			}
		}
	}

	ttl := o.TTL
	if ttl == 0 {
		ttl = time.Hour
	}

	p := plan.Make(snap, plan.Input{
		Now: now(), TTL: ttl, CredentialRevision: cred.Revision(), AuthDigest: cred.AuthDigest(),
		Registry: cfg.Credential.Registry, ProofSkipped: o.SkipProof, ConfigDigest: cfg.Digest,
		Exclude: cfg.Nodes.Exclude, AutoscalerPolicy: cfg.Nodes.AutoscalerCandidates,
		State: plan.StateRef{Lineage: prior.Lineage, Serial: prior.Serial}, Known: known,
	})

	return &PlanResult{Config: cfg, Plan: p}, nil
}

// prove proves the credential against the registry's token flow for every prove target.
func prove(ctx context.Context, cfg *config.Config, cred *credential.Credential) error {
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	if err := credential.Prove(pctx, &http.Client{Timeout: 30 * time.Second}, cfg.Credential.Endpoint, cred, cfg.Credential.Prove); err != nil {
		return fmt.Errorf("credential %q (%s): %w", cfg.Credential.Name, cfg.Credential.SopsFile, err)
	}

	return nil
}

// Observe takes the snapshot: one LIST of Nodes, the run Lease, and each node's Talos facts.
func Observe(ctx context.Context, kube *cluster.Connection, tc *talos.Client, cfg *config.Config, now time.Time) (plan.Snapshot, error) {
	nodes, err := kube.Nodes(ctx, cfg.Nodes.Selector)
	if err != nil {
		return plan.Snapshot{}, err
	}

	lease, err := kube.Lease(ctx, cfg.Lease.Namespace, cfg.Lease.Name)
	if err != nil {
		return plan.Snapshot{}, err
	}

	tc.FillFacts(ctx, nodes, cfg.Credential.Registry, 8, 15*time.Second)

	targets, err := SecretTargets(ctx, kube, cfg)
	if err != nil {
		return plan.Snapshot{}, err
	}

	var secrets []plan.SecretObs

	for _, t := range targets {
		obs, err := kube.ObserveSecret(ctx, t)
		if err != nil {
			return plan.Snapshot{}, err
		}

		secrets = append(secrets, obs)
	}

	return plan.Snapshot{TakenAt: now.UTC(), APIEndpoint: kube.Endpoint, Nodes: nodes, Lease: lease, Secrets: secrets}, nil
}

// SecretTargets lists the configured pull secrets: consumers (explicit and by namespace label),
// then the root Flux secret.
func SecretTargets(ctx context.Context, kube *cluster.Connection, cfg *config.Config) ([]cluster.SecretTarget, error) {
	var explicit []cluster.SecretTarget
	for _, c := range cfg.Consumers {
		explicit = append(explicit, cluster.SecretTarget{Namespace: c.Namespace, Name: c.Secret, Role: plan.RoleConsumer, ServiceAccounts: c.ServiceAccounts})
	}

	var selector, secret string

	var sas []string

	if cs := cfg.ConsumerSelector; cs != nil {
		selector, secret, sas = cs.Selector, cs.Secret, cs.ServiceAccounts
	}

	targets, err := kube.ConsumerTargets(ctx, explicit, selector, secret, sas)
	if err != nil {
		return nil, err
	}

	if r := cfg.FluxRoot; r != nil {
		targets = append(targets, cluster.SecretTarget{Namespace: r.Namespace, Name: r.Secret, Role: plan.RoleRoot})
	}

	return targets, nil
}
