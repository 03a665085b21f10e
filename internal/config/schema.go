// The HCL schema ghcrsync.hcl is decoded into: one struct a block, durations and strings that
// need a range kept as expressions so that errors point at them.

package config

import "github.com/hashicorp/hcl/v2"

// file mirrors the HCL schema. Durations are expressions so that errors point at them.
type file struct {
	Cluster     *clusterBlock     `hcl:"cluster,block"`
	Talos       *talosBlock       `hcl:"talos,block"`
	Credentials []credentialBlock `hcl:"credential,block"`
	Nodes       *nodesBlock       `hcl:"nodes,block"`
	Consumers   []consumerBlock   `hcl:"consumer,block"`
	Selected    *consumersBlock   `hcl:"consumers,block"`
	FluxRoot    *fluxRootBlock    `hcl:"flux_root,block"`
	Flux        *fluxBlock        `hcl:"flux,block"`
	Templates   []templateBlock   `hcl:"node_template,block"`
	Lease       *leaseBlock       `hcl:"lease,block"`
	State       *stateBlock       `hcl:"state,block"`
	Liveness    []livenessBlock   `hcl:"liveness,block"`
	Run         *runBlock         `hcl:"run,block"`
	Maintenance *maintenanceBlock `hcl:"maintenance,block"`
}

type maintenanceBlock struct {
	Kured        hcl.Expression `hcl:"kured,optional"`
	UpgradePlans hcl.Expression `hcl:"upgrade_plans,optional"`
	HeldDrain    hcl.Expression `hcl:"held_drain,optional"`
}

type runBlock struct {
	Budget  hcl.Expression `hcl:"budget,optional"`
	Reserve hcl.Expression `hcl:"reserve,optional"`
	Window  hcl.Expression `hcl:"window,optional"`
}

type livenessBlock struct {
	Kind         string   `hcl:"kind,label"`
	Repository   string   `hcl:"repository"`
	APIURL       *string  `hcl:"api_url,optional"`
	TokenEnv     *string  `hcl:"token_env,optional"`
	TrustedHosts []string `hcl:"trusted_hosts,optional"`
}

type clusterBlock struct {
	Kubeconfig        *string        `hcl:"kubeconfig,optional"`
	Context           *string        `hcl:"context,optional"`
	Timeout           hcl.Expression `hcl:"timeout,optional"`
	InCluster         *bool          `hcl:"in_cluster,optional"`
	ServiceAccountDir *string        `hcl:"service_account_dir,optional"`
	TemplateKube      *string        `hcl:"template_kubeconfig,optional"`
}

type talosBlock struct {
	Talosconfig *string        `hcl:"talosconfig,optional"`
	Context     *string        `hcl:"context,optional"`
	Endpoints   []string       `hcl:"endpoints,optional"`
	Timeout     hcl.Expression `hcl:"timeout,optional"`
	Concurrency hcl.Expression `hcl:"concurrency,optional"`
}

type credentialBlock struct {
	Name         string         `hcl:"name,label"`
	Registry     string         `hcl:"registry"`
	Endpoint     *string        `hcl:"endpoint,optional"`
	SopsFile     hcl.Expression `hcl:"sops_file"`
	Key          []string       `hcl:"key,optional"`
	Prove        []string       `hcl:"prove,optional"`
	Deny         []string       `hcl:"deny,optional"`
	TrustedHosts []string       `hcl:"trusted_hosts,optional"`
	RetryWindow  hcl.Expression `hcl:"retry_window,optional"`
	DeniedWindow hcl.Expression `hcl:"denied_window,optional"`
	// Consumers and Selected make it a tenant credential: it reaches these pull secrets only.
	Consumers []consumerBlock `hcl:"consumer,block"`
	Selected  *consumersBlock `hcl:"consumers,block"`
}

// tenant reports whether the block is a tenant credential's (it names consumers of its own).
func (c credentialBlock) tenant() bool { return len(c.Consumers) > 0 || c.Selected != nil }

type nodesBlock struct {
	Selector             *string        `hcl:"selector,optional"`
	Exclude              []string       `hcl:"exclude,optional"`
	AutoscalerCandidates hcl.Expression `hcl:"autoscaler_candidates,optional"`
	WorkerParallelism    hcl.Expression `hcl:"worker_parallelism,optional"`
	LiveParallelism      hcl.Expression `hcl:"live_parallelism,optional"`
	MaxFailures          hcl.Expression `hcl:"max_failures,optional"`
	DrainTimeout         hcl.Expression `hcl:"drain_timeout,optional"`
	ReadyTimeout         hcl.Expression `hcl:"ready_timeout,optional"`
	AllowQuorumLoss      *bool          `hcl:"allow_quorum_loss,optional"`
	Verdict              hcl.Expression `hcl:"verdict,optional"`
	ExpectedNodeTime     hcl.Expression `hcl:"expected_node_time,optional"`
	ExpectedLiveTime     hcl.Expression `hcl:"expected_live_time,optional"`
	RuntimeProbe         *probeBlock    `hcl:"runtime_probe,block"`
	KubeletKeyring       *keyringBlock  `hcl:"kubelet_keyring,block"`
}

type probeBlock struct {
	Image          *string   `hcl:"image,optional"`
	Images         *[]string `hcl:"images,optional"`
	Namespace      *string   `hcl:"namespace,optional"`
	ServiceAccount *string   `hcl:"service_account,optional"`
}

type consumerBlock struct {
	Name            string    `hcl:"name,label"`
	Namespace       string    `hcl:"namespace"`
	Secret          string    `hcl:"secret"`
	ServiceAccounts *[]string `hcl:"service_accounts,optional"`
}

type consumersBlock struct {
	Selector        string    `hcl:"selector"`
	Secret          string    `hcl:"secret"`
	ServiceAccounts *[]string `hcl:"service_accounts,optional"`
}

type fluxRootBlock struct {
	Namespace     string         `hcl:"namespace"`
	Secret        string         `hcl:"secret"`
	OCIRepository *string        `hcl:"oci_repository,optional"`
	Prove         *bool          `hcl:"prove,optional"`
	ProofTimeout  hcl.Expression `hcl:"proof_timeout,optional"`
}

type fluxBlock struct {
	Suspend        []string       `hcl:"suspend"`
	Quiesce        *bool          `hcl:"quiesce,optional"`
	QuiesceTimeout hcl.Expression `hcl:"quiesce_timeout,optional"`
}

type templateBlock struct {
	Name              string    `hcl:"name,label"`
	Namespace         string    `hcl:"namespace"`
	Secret            string    `hcl:"secret"`
	Key               string    `hcl:"key"`
	Format            *string   `hcl:"format,optional"`
	Pools             *[]string `hcl:"pools,optional"`
	RestartDeployment *string   `hcl:"restart_deployment,optional"`
}

type leaseBlock struct {
	Namespace *string        `hcl:"namespace,optional"`
	Name      *string        `hcl:"name,optional"`
	Duration  hcl.Expression `hcl:"duration,optional"`
	Heartbeat hcl.Expression `hcl:"heartbeat,optional"`
}

type stateBlock struct {
	Backend   hcl.Expression `hcl:"backend,optional"`
	Path      *string        `hcl:"path,optional"`
	Namespace *string        `hcl:"namespace,optional"`
	Secret    *string        `hcl:"secret,optional"`
}
