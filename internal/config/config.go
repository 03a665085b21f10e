// Package config decodes ghcrsync's HCL configuration (see docs/config.md). Decoding touches
// no network: it reads the file, checks the files it names exist, and reports every problem as
// an HCL diagnostic with file, line and column.
package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/ghcrsync/ghcrsync/internal/window"
)

// Config is a decoded, validated configuration with defaults applied and relative paths
// resolved against the config file's folder.
type Config struct {
	Path   string // absolute path of the file
	Digest string // hex SHA-256 of the file's bytes

	// files are the parsed sources, for a finding's snippet (Finding); envs what env() returned,
	// never repeated in one (as in the decoder's own errors).
	files map[string]*hcl.File
	envs  []envValue

	Cluster Cluster
	Talos   Talos
	// Credential is the cluster's credential: the nodes' (Talos RegistryAuthConfig), the node
	// templates', the root Flux secret's and the top-level consumers'.
	Credential Credential
	// Tenants are the other credential blocks (several credentials in one configuration): each
	// reaches the pull secrets of its own consumers only, never a node or the root.
	Tenants   []Tenant
	Nodes     Nodes
	Consumers []Consumer
	// ConsumerSelector selects more consumer namespaces by label (the consumers block).
	ConsumerSelector *ConsumerSelector
	FluxRoot         *FluxRoot
	// FluxSuspend are the Flux Kustomizations suspended for the run (the flux block): the
	// GitOps controllers that would apply the credential from Git mid-rotation.
	FluxSuspend []NamespacedName
	// FluxQuiesce bounds the wait, after each suspension, for kustomize-controller to take it
	// (flux.quiesce, flux.quiesce_timeout): until then a reconcile begun before it may still apply
	// Git's credential. 0: not waited for.
	FluxQuiesce time.Duration
	// NodeTemplates are the machine templates new nodes boot from (the autoscaler's).
	NodeTemplates []NodeTemplate
	Lease         Lease
	State         State
	Liveness      *Liveness
	// Run bounds a run in time (the run block).
	Run Run
	// Others are the other maintenance tools ghcrsync shares the fleet with (the maintenance
	// block).
	Others Others
}

// Others are where the other tools that drain and reboot nodes keep what ghcrsync honours
// (internal/maintenance): kured's DaemonSet (its lock; zero: not looked for) and the
// namespace of the system-upgrade-controller's Plans ("" : not looked for), and what a drain
// held by a budget that never frees by itself does: HeldDrainDefer (the node is deferred, the
// action named) or HeldDrainWait (the drain waits nodes.drain_timeout, for someone to act).
type Others struct {
	Kured        NamespacedName
	UpgradePlans string
	HeldDrain    string
}

// What a drain held by a budget that never frees by itself does (maintenance.held_drain).
const (
	HeldDrainDefer = "defer"
	HeldDrainWait  = "wait"
)

// The maintenance block's defaults: kured's and the system-upgrade-controller's own.
var (
	DefaultKured        = NamespacedName{Namespace: "kube-system", Name: "kured"}
	DefaultUpgradePlans = "" // not looked for: no Role is rendered into a namespace a cluster without the controller lacks
)

// Run is how long one apply may take: a run that cannot finish the rotation in its budget does
// what fits and leaves the rest to the next run.
type Run struct {
	// Budget is the wall time one apply may take (0: none); apply --within overrides it.
	Budget time.Duration
	// Reserve is what a run keeps at its end for its closing steps (the pull secrets, the late
	// nodes, the verdict, the root, releasing the Lease): a node starts only if its estimate
	// ends before the budget less this.
	Reserve time.Duration
	// Window is when a run may drain and reboot nodes (nil: always): outside it, apply does
	// what restarts nothing and defers the nodes it would fence, unless the old credential is
	// already refused (an emergency).
	Window *window.Window
}

// Liveness is where a Lease holder's run is checked for having ended.
type Liveness struct {
	Kind       string // "github_actions"
	Repository string // owner/repo
	APIURL     string // DefaultGitHubAPI, or one on a TrustedHosts host
	TokenEnv   string // environment variable holding the API token (optional)
	// TrustedHosts are the hosts besides api.github.com api_url may be on (GitHub Enterprise
	// Server): the token is sent there.
	TrustedHosts []string
}

// DefaultGitHubAPI is GitHub's REST API: the liveness API unless another is trusted.
const DefaultGitHubAPI = "https://api.github.com"

// Cluster is how to reach Kubernetes. Empty fields follow the kubeconfig loading rules.
type Cluster struct {
	Kubeconfig string
	Context    string
	Timeout    time.Duration // bounds every Kubernetes request
	// InCluster connects as the pod's service account (a Job in the cluster): the API from
	// KUBERNETES_SERVICE_HOST/PORT, the token and CA from ServiceAccountDir.
	InCluster         bool
	ServiceAccountDir string
	// TemplateKubeconfig is the template identity's kubeconfig (its current context): apply
	// writes the node templates, and restarts their readers, with it and nothing else ("": with
	// its own connection, which then needs the template identity's rights too; docs/rbac.md).
	TemplateKubeconfig string
}

// DefaultServiceAccountDir is where Kubernetes mounts a pod's service-account token and CA.
const DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Talos is how to reach the Talos API. Empty fields follow TALOSCONFIG.
type Talos struct {
	Talosconfig string
	Context     string
	Endpoints   []string
	// Concurrency bounds the nodes whose Talos facts plan reads at once: enough to hide a WAN
	// round-trip between a CI runner and the cluster.
	Concurrency int
	Timeout     time.Duration // bounds every Talos call
}

// Credential is where the pull credential comes from and how it is proved.
type Credential struct {
	Name     string
	Registry string   // the auths key, e.g. ghcr.io
	Endpoint string   // base URL the registry is reached at (default https://REGISTRY)
	SopsFile string   // absolute
	Key      []string // path of the dockerconfigjson in the decrypted document
	Prove    []string // repository:tag references the credential must pull
	// Deny are repository:tag references the credential must NOT pull (a proof of isolation:
	// another tenant's packages); the registry must refuse each.
	Deny []string
	// TrustedHosts are the hosts besides the endpoint's that the registry's token realm may be
	// on: the password is sent there (HTTP Basic) to trade it for a pull token.
	TrustedHosts []string
	// Where is the credential block in the file; SopsWhere its sops_file attribute: where a
	// finding about the block or its SOPS file points (validate).
	Where, SopsWhere hcl.Range
	// RetryWindow bounds how long a registry's transient answers (429, 5xx) are asked again;
	// DeniedWindow is how long a denial (401, 403) must last to be final ("refused (stable)").
	RetryWindow  time.Duration
	DeniedWindow time.Duration
}

// Tenant is a credential that reaches pull secrets only: its own consumers (a tenant's
// namespaces), proved and isolated on its own, rotated in the same plan and run as the cluster's.
type Tenant struct {
	Credential       Credential
	Consumers        []Consumer
	ConsumerSelector *ConsumerSelector
}

// PullSecrets is one credential's consumers: the cluster credential's (Credential "", the
// top-level consumer and consumers blocks) or a tenant's (the blocks nested in its credential).
type PullSecrets struct {
	Credential string // the tenant's credential name; "" for the cluster credential
	Consumers  []Consumer
	Selector   *ConsumerSelector
}

// Identity names the configuration on the pull secrets it writes (their
// ghcrsync.dev/configuration annotation): its Lease, namespace/name, which one run at a time holds.
func (c *Config) Identity() string { return c.Lease.Namespace + "/" + c.Lease.Name }

// SopsFiles are the SOPS files the configuration reads, the cluster credential's first, then
// each tenant's (absolute paths, each once).
func (c *Config) SopsFiles() []string {
	out := []string{c.Credential.SopsFile}

	for _, t := range c.Tenants {
		if !slices.Contains(out, t.Credential.SopsFile) {
			out = append(out, t.Credential.SopsFile)
		}
	}

	return out
}

// PullSecretSets are every credential's consumers, the cluster credential's first.
func (c *Config) PullSecretSets() []PullSecrets {
	out := []PullSecrets{{Consumers: c.Consumers, Selector: c.ConsumerSelector}}
	for _, t := range c.Tenants {
		out = append(out, PullSecrets{Credential: t.Credential.Name, Consumers: t.Consumers, Selector: t.ConsumerSelector})
	}

	return out
}

// Selectors are the consumer selectors of every credential (none: no consumers block).
func (c *Config) Selectors() []string {
	var out []string

	for _, set := range c.PullSecretSets() {
		if set.Selector != nil && !slices.Contains(out, set.Selector.Selector) {
			out = append(out, set.Selector.Selector)
		}
	}

	return out
}

// Tenant is the tenant credential named name (nil: none; "" is the cluster credential).
func (c *Config) Tenant(name string) *Tenant {
	for i := range c.Tenants {
		if c.Tenants[i].Credential.Name == name {
			return &c.Tenants[i]
		}
	}

	return nil
}

// The registry's passing trouble is waited out this long by default: GHCR's incidents answer
// 429, 5xx and DENIED in bursts of seconds to a minute or two.
const (
	DefaultRetryWindow  = 2 * time.Minute
	DefaultDeniedWindow = 45 * time.Second
)

// Nodes selects the fleet and bounds the fence transaction.
type Nodes struct {
	Selector             string
	Exclude              []string
	AutoscalerCandidates string // AutoscalerDeselect or AutoscalerInclude
	WorkerParallelism    int
	// LiveParallelism bounds the live updates (Talos reloads registry auth; no cordon) at a time.
	LiveParallelism int
	// MaxFailures is the failure budget: after that many failed nodes, no new node is started.
	MaxFailures int
	// AllowQuorumLoss lets control planes be taken down (rebooted, updated live) with fewer
	// than two other healthy voting etcd members: a one- or two-control-plane cluster.
	AllowQuorumLoss bool
	DrainTimeout    time.Duration
	ReadyTimeout    time.Duration
	Probe           Probe
	// Verdict is what the verdict judges: every Node of the cluster (VerdictCluster, the
	// default) or only the selected ones (VerdictSelected, an explicit narrowing).
	Verdict string
	// ExpectedNodeTime and ExpectedLiveTime are what a fenced node and a live update are
	// expected to take before the state has recorded any (the estimate's defaults).
	ExpectedNodeTime time.Duration
	ExpectedLiveTime time.Duration
	// Keyring is nodes.kubelet_keyring (nil: not configured).
	Keyring *Keyring
}

// The estimate's defaults, before the state has recorded a rotation: a fenced node on Hetzner
// cx33 workers with Talos 1.13 (drain, reboot, Ready, proof) took 4.7 to 6.8 minutes in the
// predecessor's published runs; a live update, seconds.
const (
	DefaultExpectedNodeTime = 6 * time.Minute
	DefaultExpectedLiveTime = 30 * time.Second
	DefaultReserve          = 2 * time.Minute
)

// Verdict scopes (nodes.verdict).
const (
	VerdictCluster  = "cluster"
	VerdictSelected = "selected"
)

// Autoscaler candidate policies.
const (
	AutoscalerDeselect = "deselect"
	AutoscalerInclude  = "include"
)

// DefaultProbeServiceAccount runs the probe pods: ghcrsync's own account, with no
// imagePullSecrets for admission to inject (`ghcrsync rbac` creates it).
const DefaultProbeServiceAccount = "ghcrsync-probe"

// DefaultProbeNamespace holds the probe pods and nothing else (`ghcrsync rbac` creates it, under
// PodSecurity "restricted"): apply's right to create pods there reaches no Secret and no other
// service account.
const DefaultProbeNamespace = "ghcrsync-probe"

// reservedProbeNamespaces hold what a pod created there could take: the cluster's own accounts
// and Secrets, Flux's, or every workload's default. The state's and the Lease's namespaces are
// refused as well.
var reservedProbeNamespaces = []string{"kube-system", "kube-public", "kube-node-lease", "default", "flux-system"}

// Probe is the runtime proof: a pod pinned to the node pulling Image with no pull secret.
type Probe struct {
	// ServiceAccount the probe pods run as (DefaultProbeServiceAccount).
	ServiceAccount string
	Image          string
	// Images are every image the probe pulls on each node, Image first (runtime_probe.images:
	// each private package the runtime needs, as GHCR grants them one by one).
	Images    []string
	Namespace string
}

// Consumer is a pull secret the credential is fanned out to, and the service accounts that
// should reference it.
type Consumer struct {
	Name            string
	Namespace       string
	Secret          string
	ServiceAccounts []string
}

// ConsumerSelector names a pull secret in every namespace matching a label selector.
type ConsumerSelector struct {
	Selector        string
	Secret          string
	ServiceAccounts []string
}

// FluxRoot is the root Flux secret, switched last, and the OCIRepository to reconcile after.
type FluxRoot struct {
	Namespace     string
	Secret        string
	OCIRepository string
	// Prove waits, up to ProofTimeout, for Flux's source-controller to pull the OCIRepository
	// with the root secret just written (flux_root.prove, on by default with an oci_repository).
	Prove        bool
	ProofTimeout time.Duration
}

// DefaultFluxQuiesce bounds the wait for kustomize-controller to take a suspension: a
// reconcile in flight ends within its Kustomization's timeout (Flux's default is its interval).
const DefaultFluxQuiesce = 2 * time.Minute

// DefaultRootProofTimeout bounds the wait for Flux to pull with the new root credential.
const DefaultRootProofTimeout = 2 * time.Minute

// NamespacedName names a namespaced object.
type NamespacedName struct{ Namespace, Name string }

func (n NamespacedName) String() string { return n.Namespace + "/" + n.Name }

// NodeTemplate is a machine template kept in a Secret's key, which ghcrsync keeps on the
// credential (see internal/nodetemplate for the formats).
type NodeTemplate struct {
	Name      string
	Namespace string
	Secret    string
	Key       string
	Format    string
	Pools     []string // hcloud-cluster-config only; empty: every pool with a cloudInit
	// RestartDeployment ("namespace/name") is rolled after the template changed, for an
	// autoscaler that reads it only at start.
	RestartDeployment string
}

// Lease is the run's coordination.k8s.io Lease.
type Lease struct {
	Namespace string
	Name      string
	Duration  time.Duration
	Heartbeat time.Duration
}

// State is where the state lives.
type State struct {
	Backend   string // "local" or "kubernetes"
	Path      string // absolute, for the local backend
	Namespace string // for the kubernetes backend
	Secret    string // for the kubernetes backend
}

// Overrides are the command line's connection flags (--kubeconfig, --context, --talosconfig,
// --talos-context); set ones win over the file. Paths are taken as given (relative to the
// working directory, like any command-line path).
type Overrides struct {
	Kubeconfig, Context, Talosconfig, TalosContext string
	// TemplateKubeconfig is --template-kubeconfig (cluster.template_kubeconfig).
	TemplateKubeconfig string
}

// Override applies the set overrides; a file that does not exist is an error naming the flag.
func (c *Config) Override(o Overrides) error {
	for _, f := range []struct {
		flag, path string
		into       *string
	}{{"--kubeconfig", o.Kubeconfig, &c.Cluster.Kubeconfig}, {"--talosconfig", o.Talosconfig, &c.Talos.Talosconfig},
		{"--template-kubeconfig", o.TemplateKubeconfig, &c.Cluster.TemplateKubeconfig}} {
		if f.path == "" {
			continue
		}

		abs, err := filepath.Abs(f.path)
		if err != nil {
			return fmt.Errorf("%s %s: %w", f.flag, f.path, err)
		}

		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%s %s does not exist: pass an existing file, or leave the flag out to use the configuration's", f.flag, f.path)
		}

		*f.into = abs
	}

	if o.Kubeconfig != "" {
		c.Cluster.InCluster = false
	}

	if o.Context != "" {
		c.Cluster.Context = o.Context
	}

	if o.TalosContext != "" {
		c.Talos.Context = o.TalosContext
	}

	return nil
}
