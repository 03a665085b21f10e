// Package config decodes ghcrsync's HCL configuration (see docs/config.md). Decoding touches
// no network: it reads the file, checks the files it names exist, and reports every problem as
// an HCL diagnostic with file, line and column.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ghcrsync/ghcrsync/internal/diag"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/pin"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
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
}

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
	Namespace     string  `hcl:"namespace"`
	Secret        string  `hcl:"secret"`
	OCIRepository *string `hcl:"oci_repository,optional"`
}

type fluxBlock struct {
	Suspend []string `hcl:"suspend"`
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

// Error carries the diagnostics of a configuration that did not decode. Its message lists each
// as FILE:LINE:COL: summary; detail.
type Error struct {
	Diagnostics hcl.Diagnostics
	Files       map[string]*hcl.File
	envs        []envValue // values env() returned: never repeated in the message
}

func (e *Error) Error() string {
	var b strings.Builder

	for i, d := range e.Diagnostics.Errs() {
		if i > 0 {
			b.WriteString("\n")
		}

		b.WriteString(formatDiag(d.(*hcl.Diagnostic)))
	}

	return withoutEnvValues(b.String(), e.envs)
}

// Findings are the diagnostics one by one, each with its place and source (validate --json),
// filename naming the file as the user gave it; no env() value is repeated.
func (e *Error) Findings(filename string) []diag.Diagnostic {
	return diag.FromHCL(e.Diagnostics, e.Files, filename, func(s string) string { return withoutEnvValues(s, e.envs) })
}

// Finding is a diagnostic about the configuration at where (a range in it), with its snippet;
// filename names the file as the user gave it.
func (c *Config) Finding(severity hcl.DiagnosticSeverity, summary, detail string, where hcl.Range, filename string) diag.Diagnostic {
	return diag.FromHCL(hcl.Diagnostics{{Severity: severity, Summary: summary, Detail: detail, Subject: &where}}, c.files, filename,
		func(s string) string { return withoutEnvValues(s, c.envs) })[0]
}

func formatDiag(d *hcl.Diagnostic) string {
	where := ""
	if d.Subject != nil {
		where = fmt.Sprintf("%s:%d:%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
	}

	msg := where + d.Summary
	if d.Detail != "" {
		msg += "; " + d.Detail
	}

	return msg
}

// Load reads and validates the configuration at path.
func Load(path string) (*Config, error) { return load(path, false) }

// LoadNames is Load without checking that the files the configuration names exist: which files
// it reads (SopsFiles), for a workflow to fetch them before they do.
func LoadNames(path string) (*Config, error) { return load(path, true) }

func load(path string, namesOnly bool) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}

	src, err := readlimit.File(abs, readlimit.Config)
	if err != nil {
		return nil, fmt.Errorf("read configuration %s: %w (pass --config FILE, or create ghcrsync.hcl; see docs/config.md)", path, err)
	}

	return parse(src, abs, namesOnly)
}

// Parse decodes src as if read from the absolute path filename.
func Parse(src []byte, filename string) (*Config, error) { return parse(src, filename, false) }

// parse decodes src; with namesOnly, the files it names need not exist.
func parse(src []byte, filename string, namesOnly bool) (*Config, error) {
	p := hclparse.NewParser()
	name := filepath.Base(filename)

	f, diags := p.ParseHCL(src, name)
	if diags.HasErrors() {
		return nil, newError(diags, p.Files())
	}

	d := &decoder{dir: filepath.Dir(filename), namesOnly: namesOnly}
	d.ctx = d.evalContext()

	var raw file
	diags = append(diags, gohcl.DecodeBody(f.Body, d.ctx, &raw)...)

	if diags.HasErrors() {
		return nil, d.newError(diags, p.Files())
	}

	sum := sha256.Sum256(src)
	cfg := d.build(&raw, f.Body)
	cfg.Path, cfg.Digest, cfg.files, cfg.envs = filename, hex.EncodeToString(sum[:]), p.Files(), d.envs

	if d.diags.HasErrors() {
		return nil, d.newError(d.diags, p.Files())
	}

	return cfg, nil
}

// newError keeps the first error reported at each place: a value that failed to evaluate (an
// unset env() variable) is reported once, not followed by what its absence caused there.
func (d *decoder) newError(diags hcl.Diagnostics, files map[string]*hcl.File) *Error {
	e := newError(diags, files)
	e.envs = d.envs

	return e
}

func newError(diags hcl.Diagnostics, files map[string]*hcl.File) *Error {
	seen := map[hcl.Pos]bool{}
	out := make(hcl.Diagnostics, 0, len(diags))

	for _, d := range diags {
		if d.Severity == hcl.DiagError && d.Subject != nil {
			if seen[d.Subject.Start] {
				continue
			}

			seen[d.Subject.Start] = true
		}

		out = append(out, d)
	}

	return &Error{Diagnostics: out, Files: files}
}

// evalContext gives expressions env(); every value it returns is remembered, so no error
// message repeats it (Error names the variable instead).
func (d *decoder) evalContext() *hcl.EvalContext {
	return &hcl.EvalContext{Functions: map[string]function.Function{
		"env": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "name", Type: cty.String}},
			Type:   function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				name := args[0].AsString()

				v, ok := os.LookupEnv(name)
				if !ok {
					return cty.NilVal, fmt.Errorf("environment variable %s is not set", name)
				}

				d.envs = append(d.envs, envValue{name: name, value: v})

				return cty.StringVal(v), nil
			},
		}),
	}}
}

type decoder struct {
	dir   string
	ctx   *hcl.EvalContext
	diags hcl.Diagnostics
	envs  []envValue // what env() returned
	// namesOnly: a file the configuration names need not exist (LoadNames).
	namesOnly bool
}

func (d *decoder) errorf(rng hcl.Range, summary, detail string, args ...any) {
	r := rng
	d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(detail, args...), Subject: &r})
}

// expr evaluates an optional expression to a string; null or absent gives def.
func (d *decoder) str(e hcl.Expression, def string) (string, hcl.Range, bool) {
	if e == nil {
		return def, hcl.Range{}, true
	}

	v, diags := e.Value(d.ctx)
	if diags.HasErrors() {
		d.diags = append(d.diags, diags...)

		return def, e.Range(), false
	}

	if v.IsNull() {
		return def, e.Range(), true
	}

	if v.Type() != cty.String {
		d.errorf(e.Range(), "Incorrect attribute value type", "Expected a string, got %s.", v.Type().FriendlyName())

		return def, e.Range(), false
	}

	return v.AsString(), e.Range(), true
}

// atLeastOne decodes an optional whole number of at least 1.
func (d *decoder) atLeastOne(e hcl.Expression, def int, what string) int {
	if e == nil {
		return def
	}

	v, diags := e.Value(d.ctx)
	d.diags = append(d.diags, diags...)

	if diags.HasErrors() || v.IsNull() {
		return def
	}

	var n int
	if diags := gohcl.DecodeExpression(e, d.ctx, &n); diags.HasErrors() || n < 1 {
		d.errorf(e.Range(), "Invalid "+what, "%s must be a whole number of at least 1.", what)

		return def
	}

	return n
}

func (d *decoder) duration(e hcl.Expression, def time.Duration, what string) time.Duration {
	s, rng, ok := d.str(e, "")
	if !ok || s == "" {
		return def
	}

	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		d.errorf(rng, "Invalid duration", "%s must be a positive duration like \"90s\", \"10m\" or \"1h30m\"; %q is not.", what, s)

		return def
	}

	return v
}

func (d *decoder) path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}

	return filepath.Join(d.dir, p)
}

func (d *decoder) existingFile(p string, rng hcl.Range, what string) string {
	abs := d.path(p)
	if _, err := os.Stat(abs); err != nil && !d.namesOnly {
		d.errorf(rng, "File not found", "%s %q (resolved to %s) does not exist. Relative paths resolve against the configuration file's folder.", what, p, abs)
	}

	return abs
}

// attrRange finds where an attribute of a block was written, for diagnostics about values
// decoded as plain Go types.
func attrRange(body hcl.Body, block, attr string) hcl.Range {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: block, LabelNames: nil}}})
	for _, b := range content.Blocks {
		attrs, _ := b.Body.JustAttributes()
		if a, ok := attrs[attr]; ok {
			return a.Range
		}

		return b.DefRange
	}

	return body.MissingItemRange()
}

var proveRef = regexp.MustCompile(`^[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[a-f0-9]{64})$`)

func (d *decoder) build(raw *file, body hcl.Body) *Config {
	cfg := &Config{}

	d.connections(raw, body, cfg)
	d.credential(raw, body, cfg)
	d.nodes(raw, body, cfg)
	d.consumers(raw, body, cfg)
	d.distinctConsumers(body, cfg)
	d.flux(raw, body, cfg)
	d.templates(raw, body, cfg)
	d.lease(raw, cfg)
	d.state(raw, cfg)
	d.liveness(raw, body, cfg)
	d.probeNamespace(body, cfg)

	if raw.Nodes != nil {
		cfg.Nodes.Keyring = d.keyring(raw.Nodes.KubeletKeyring, body, cfg)
	}

	d.run(raw, cfg)
	d.others(raw, cfg)

	return cfg
}

// others decodes the maintenance block: where kured and the system-upgrade-controller keep
// their holds, and what a drain held for good does.
func (d *decoder) others(raw *file, cfg *Config) {
	cfg.Others = Others{Kured: DefaultKured, UpgradePlans: DefaultUpgradePlans, HeldDrain: HeldDrainDefer}

	b := raw.Maintenance
	if b == nil {
		return
	}

	if text, rng, ok := d.str(b.Kured, DefaultKured.String()); ok {
		ns, name, cut := strings.Cut(text, "/")

		switch {
		case text == "":
			cfg.Others.Kured = NamespacedName{}
		case !cut || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0:
			d.errorf(rng, "Invalid kured DaemonSet", "maintenance.kured is the namespace/name of kured's DaemonSet, like \"kube-system/kured\" (\"\" : kured is not used); %q is not.", text)
		default:
			cfg.Others.Kured = NamespacedName{Namespace: ns, Name: name}
		}
	}

	if text, rng, ok := d.str(b.UpgradePlans, DefaultUpgradePlans); ok {
		if text != "" && len(validation.IsDNS1123Label(text)) > 0 {
			d.errorf(rng, "Invalid namespace", "maintenance.upgrade_plans is the namespace of the system-upgrade-controller's Plans (\"\" : it is not used); %q is not a namespace.", text)
		}

		cfg.Others.UpgradePlans = text
	}

	if text, rng, ok := d.str(b.HeldDrain, HeldDrainDefer); ok {
		if text != HeldDrainDefer && text != HeldDrainWait {
			d.errorf(rng, "Invalid held_drain", "maintenance.held_drain is %q (defer the node, naming the action) or %q (wait nodes.drain_timeout for someone to act); not %q.",
				HeldDrainDefer, HeldDrainWait, text)
		}

		cfg.Others.HeldDrain = text
	}
}

// run decodes the run block: the time budget of one apply, and its maintenance window.
func (d *decoder) run(raw *file, cfg *Config) {
	cfg.Run = Run{Reserve: DefaultReserve}

	if b := raw.Run; b != nil {
		cfg.Run.Budget = d.duration(b.Budget, 0, "run.budget")
		cfg.Run.Reserve = d.duration(b.Reserve, cfg.Run.Reserve, "run.reserve")

		if text, rng, ok := d.str(b.Window, ""); ok && text != "" {
			w, err := window.Parse(text)
			if err != nil {
				d.errorf(rng, "Invalid maintenance window", "run.window: %v.", err)
			}

			cfg.Run.Window = w
		}
	}
}

// probeNamespace refuses a probe namespace that holds anything a pod could take: apply may
// create pods there.
func (d *decoder) probeNamespace(body hcl.Body, cfg *Config) {
	ns := cfg.Nodes.Probe.Namespace
	if cfg.Nodes.Probe.Image == "" {
		return
	}

	var holds string

	switch {
	case slices.Contains(reservedProbeNamespaces, ns):
		holds = "the cluster's or Flux's own service accounts and Secrets"
	case ns == cfg.Lease.Namespace:
		holds = "the run's Lease (lease.namespace)"
	case cfg.State.Backend == "kubernetes" && ns == cfg.State.Namespace:
		holds = "the state Secret (state.namespace)"
	default:
		return
	}

	d.errorf(attrRange(body, "nodes", "runtime_probe"), "Probe namespace not isolated",
		"nodes.runtime_probe.namespace is %q, which holds %s: apply may create pods in the probe namespace, so it must hold nothing else. "+
			"Use a namespace of its own (the default, %q, which `ghcrsync rbac` creates).", ns, holds, DefaultProbeNamespace)
}

// connections decodes the cluster and talos blocks.
func (d *decoder) connections(raw *file, body hcl.Body, cfg *Config) {
	cfg.Cluster.Timeout, cfg.Talos.Timeout = 30*time.Second, 30*time.Second

	if c := raw.Cluster; c != nil {
		cfg.Cluster.Timeout = d.duration(c.Timeout, cfg.Cluster.Timeout, "cluster.timeout")

		if c.Kubeconfig != nil {
			cfg.Cluster.Kubeconfig = d.existingFile(*c.Kubeconfig, attrRange(body, "cluster", "kubeconfig"), "kubeconfig")
		}

		if c.Context != nil {
			cfg.Cluster.Context = *c.Context
		}

		if c.TemplateKube != nil {
			cfg.Cluster.TemplateKubeconfig = d.existingFile(*c.TemplateKube, attrRange(body, "cluster", "template_kubeconfig"), "template_kubeconfig")
		}

		cfg.Cluster.InCluster = c.InCluster != nil && *c.InCluster
		cfg.Cluster.ServiceAccountDir = DefaultServiceAccountDir

		if c.ServiceAccountDir != nil {
			cfg.Cluster.ServiceAccountDir = d.path(*c.ServiceAccountDir)
		}

		if cfg.Cluster.InCluster && (c.Kubeconfig != nil || c.Context != nil) {
			d.errorf(attrRange(body, "cluster", "in_cluster"), "Conflicting cluster settings",
				"in_cluster = true connects as the pod's service account; remove kubeconfig and context, or in_cluster.")
		}
	}

	cfg.Talos.Concurrency = 64

	if t := raw.Talos; t != nil {
		cfg.Talos.Timeout = d.duration(t.Timeout, cfg.Talos.Timeout, "talos.timeout")
		cfg.Talos.Concurrency = d.atLeastOne(t.Concurrency, cfg.Talos.Concurrency, "talos.concurrency")

		if t.Talosconfig != nil {
			cfg.Talos.Talosconfig = d.existingFile(*t.Talosconfig, attrRange(body, "talos", "talosconfig"), "talosconfig")
		}

		if t.Context != nil {
			cfg.Talos.Context = *t.Context
		}

		cfg.Talos.Endpoints = t.Endpoints
	}
}

// consumers decodes the top-level consumer, consumers and flux_root blocks (the cluster
// credential's).
func (d *decoder) consumers(raw *file, body hcl.Body, cfg *Config) {
	cfg.Consumers, cfg.ConsumerSelector = d.consumerBlocks(raw.Consumers, raw.Selected, attrRange(body, "consumers", "selector"), "")

	if raw.FluxRoot != nil {
		cfg.FluxRoot = &FluxRoot{Namespace: raw.FluxRoot.Namespace, Secret: raw.FluxRoot.Secret}
		if raw.FluxRoot.OCIRepository != nil {
			cfg.FluxRoot.OCIRepository = *raw.FluxRoot.OCIRepository
		}
	}
}

// consumerBlocks decodes one credential's consumer and consumers blocks (where, "" or
// `credential "NAME": `, prefixes their messages).
func (d *decoder) consumerBlocks(explicit []consumerBlock, selected *consumersBlock, rng hcl.Range, where string) ([]Consumer, *ConsumerSelector) {
	sas := func(p *[]string) []string {
		if p == nil {
			return []string{"default"}
		}

		return *p
	}

	var out []Consumer

	for _, c := range explicit {
		out = append(out, Consumer{Name: c.Name, Namespace: c.Namespace, Secret: c.Secret, ServiceAccounts: sas(c.ServiceAccounts)})
	}

	var sel *ConsumerSelector

	if c := selected; c != nil {
		if _, err := labels.Parse(c.Selector); err != nil || c.Selector == "" {
			d.errorf(rng, "Invalid selector", "%sconsumers.selector %q is not a Kubernetes label selector.", where, c.Selector)
		}

		sel = &ConsumerSelector{Selector: c.Selector, Secret: c.Secret, ServiceAccounts: sas(c.ServiceAccounts)}
	}

	return out, sel
}

// flux decodes the flux block: each Kustomization to suspend for the run, as namespace/name,
// named once.
func (d *decoder) flux(raw *file, body hcl.Body, cfg *Config) {
	if raw.Flux == nil {
		return
	}

	rng := attrRange(body, "flux", "suspend")

	for _, s := range raw.Flux.Suspend {
		ns, name, ok := strings.Cut(s, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			d.errorf(rng, "Invalid Kustomization", "flux.suspend entries are namespace/name of a Flux Kustomization, like \"flux-system/apps\"; %q is not.", s)

			continue
		}

		n := NamespacedName{Namespace: ns, Name: name}
		if slices.Contains(cfg.FluxSuspend, n) {
			d.errorf(rng, "Duplicate Kustomization", "flux.suspend names %s twice.", s)

			continue
		}

		cfg.FluxSuspend = append(cfg.FluxSuspend, n)
	}
}

// templates decodes the node_template blocks.
func (d *decoder) templates(raw *file, body hcl.Body, cfg *Config) {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "node_template", LabelNames: []string{"name"}}}})
	seen := map[string]bool{}

	for i, b := range raw.Templates {
		rng := content.Blocks[i].DefRange
		attr := func(name string) hcl.Range {
			if attrs, _ := content.Blocks[i].Body.JustAttributes(); attrs[name] != nil {
				return attrs[name].Range
			}

			return rng
		}

		t := NodeTemplate{Name: b.Name, Namespace: b.Namespace, Secret: b.Secret, Key: b.Key, Format: nodetemplate.FormatHcloud}
		if b.Format != nil {
			t.Format = *b.Format
		}

		if !slices.Contains(nodetemplate.Formats, t.Format) {
			d.errorf(attr("format"), "Unsupported node template format", "format must be one of %s, not %q.", strings.Join(nodetemplate.Formats, ", "), t.Format)
		}

		if b.Pools != nil {
			t.Pools = *b.Pools
			if t.Format != nodetemplate.FormatHcloud {
				d.errorf(attr("pools"), "Pools without a cluster config", "pools select node pools of format %q; a %q template holds one config.", nodetemplate.FormatHcloud, t.Format)
			}
		}

		if b.RestartDeployment != nil {
			ns, name, ok := strings.Cut(*b.RestartDeployment, "/")
			if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				d.errorf(attr("restart_deployment"), "Invalid deployment", "restart_deployment must be \"namespace/name\", not %q.", *b.RestartDeployment)
			}

			t.RestartDeployment = *b.RestartDeployment
		}

		where := t.Namespace + "/" + t.Secret + ":" + t.Key
		if seen[where] {
			d.errorf(rng, "Duplicate node template", "the key %s is managed by another node_template block already.", where)
		}

		seen[where] = true
		cfg.NodeTemplates = append(cfg.NodeTemplates, t)
	}
}

// lease decodes the lease block, with its defaults.
func (d *decoder) lease(raw *file, cfg *Config) {
	cfg.Lease = Lease{Namespace: "flux-system", Name: "ghcr-auth-refresh", Duration: 120 * time.Second, Heartbeat: 30 * time.Second}

	l := raw.Lease
	if l == nil {
		return
	}

	if l.Namespace != nil {
		cfg.Lease.Namespace = *l.Namespace
	}

	if l.Name != nil {
		cfg.Lease.Name = *l.Name
	}

	cfg.Lease.Duration = d.duration(l.Duration, cfg.Lease.Duration, "lease.duration")
	cfg.Lease.Heartbeat = d.duration(l.Heartbeat, cfg.Lease.Heartbeat, "lease.heartbeat")

	if cfg.Lease.Heartbeat*2 > cfg.Lease.Duration {
		d.errorf(l.Heartbeat.Range(), "Lease heartbeat too slow",
			"lease.heartbeat (%s) must be at most half of lease.duration (%s), so that one missed renewal does not lose the Lease.",
			cfg.Lease.Heartbeat, cfg.Lease.Duration)
	}
}

// state decodes the state block, with its defaults.
func (d *decoder) state(raw *file, cfg *Config) {
	cfg.State = State{Backend: "local", Path: d.path("ghcrsync.state.json"), Namespace: "flux-system", Secret: "ghcrsync-state"}

	s := raw.State
	if s == nil {
		return
	}

	backend, rng, _ := d.str(s.Backend, "local")
	if backend != "local" && backend != "kubernetes" {
		d.errorf(rng, "Unsupported state backend", "backend must be \"local\" or \"kubernetes\", not %q.", backend)
	}

	cfg.State.Backend = backend

	if s.Path != nil {
		cfg.State.Path = d.path(*s.Path)
	}

	if s.Namespace != nil {
		cfg.State.Namespace = *s.Namespace
	}

	if s.Secret != nil {
		cfg.State.Secret = *s.Secret
	}
}

// liveness decodes the (at most one) liveness block.
func (d *decoder) liveness(raw *file, body hcl.Body, cfg *Config) {
	switch len(raw.Liveness) {
	case 0:
		return
	case 1:
	default:
		d.errorf(attrRange(body, "liveness", "repository"), "Duplicate liveness block", "Only one liveness block is supported.")

		return
	}

	l := raw.Liveness[0]
	if l.Kind != "github_actions" {
		d.errorf(attrRange(body, "liveness", "repository"), "Unsupported liveness source", "liveness %q is not supported; use liveness \"github_actions\".", l.Kind)
	}

	if strings.Count(l.Repository, "/") != 1 {
		d.errorf(attrRange(body, "liveness", "repository"), "Invalid repository", "repository must be \"owner/name\", not %q.", l.Repository)
	}

	cfg.Liveness = &Liveness{Kind: l.Kind, Repository: l.Repository, APIURL: DefaultGitHubAPI, TokenEnv: "GH_TOKEN",
		TrustedHosts: d.hosts(l.TrustedHosts, attrRange(body, "liveness", "trusted_hosts"))}
	if l.APIURL != nil {
		cfg.Liveness.APIURL = strings.TrimSuffix(*l.APIURL, "/")
		if err := pin.URL(cfg.Liveness.APIURL, append([]string{"api.github.com"}, cfg.Liveness.TrustedHosts...)); err != nil {
			d.errorf(attrRange(body, "liveness", "api_url"), "Untrusted api_url",
				"liveness.api_url receives the GitHub token (%s): %s.", cfg.Liveness.TokenEnv, err)
		}
	}

	if l.TokenEnv != nil {
		cfg.Liveness.TokenEnv = *l.TokenEnv
	}
}

// credential decodes the credential blocks: one is the cluster's (it names no consumers of its
// own), the others tenants' (each names its consumers).
func (d *decoder) credential(raw *file, body hcl.Body, cfg *Config) {
	if len(raw.Credentials) == 0 {
		d.errorf(body.MissingItemRange(), "Missing credential block",
			"The configuration needs one credential \"NAME\" { registry, sops_file } block naming the SOPS file that holds the pull credential.")

		return
	}

	var cluster []string

	seen := map[string]bool{}

	for _, c := range raw.Credentials {
		rng := blockRange(body, "credential", c.Name, "")
		if seen[c.Name] {
			d.errorf(rng, "Duplicate credential block", "Two credential blocks are named %q: give each credential its own name.", c.Name)

			continue
		}

		seen[c.Name] = true

		if !credentialName.MatchString(c.Name) {
			d.errorf(rng, "Invalid credential name",
				"A credential's name is written into the plan, the state and an annotation of every Secret it reaches: lower-case letters, digits and '-', like \"tenant-a\"; %q is not.", c.Name)
		}

		cred := d.oneCredential(c, body)

		switch {
		case c.tenant() && len(raw.Credentials) == 1:
			d.errorf(rng, "Consumers inside the only credential block",
				"consumer and consumers blocks inside a credential block make it a tenant credential, which reaches those pull secrets only; "+
					"with one credential, write them at the top level, where the cluster credential's consumers go.")
		case c.tenant():
			t := Tenant{Credential: cred}
			t.Consumers, t.ConsumerSelector = d.consumerBlocks(c.Consumers, c.Selected, blockRange(body, "credential", c.Name, "consumers"), "credential \""+c.Name+"\": ")
			cfg.Tenants = append(cfg.Tenants, t)
		default:
			cluster = append(cluster, c.Name)
			cfg.Credential = cred
		}
	}

	if len(raw.Credentials) > 1 && len(cluster) != 1 {
		d.errorf(blockRange(body, "credential", raw.Credentials[0].Name, ""), "Which credential is the cluster's?",
			"With several credential blocks, exactly one names no consumers of its own: the cluster's credential, which the nodes (Talos RegistryAuthConfig), "+
				"the node templates, the root Flux secret and the top-level consumers receive; each other block names its tenant's consumers inside it "+
				"(consumer or consumers blocks). Here %d name none (%s).", len(cluster), strings.Join(cluster, ", "))
	}
}

// credentialName is what a credential may be called: a label value (it names the credential on
// the Secrets it reaches).
var credentialName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// distinctConsumers refuses a pull secret two credentials would write (explicit consumers; those
// a selector finds are checked when plan lists them).
func (d *decoder) distinctConsumers(body hcl.Body, cfg *Config) {
	owner := map[string]string{}

	for _, set := range cfg.PullSecretSets() {
		name := set.Credential
		if name == "" {
			name = cfg.Credential.Name
		}

		for _, c := range set.Consumers {
			key := c.Namespace + "/" + c.Secret
			if prev, ok := owner[key]; ok && prev != name {
				d.errorf(blockRange(body, "credential", set.Credential, "consumers"), "Pull secret of two credentials",
					"%s is a consumer of credential %q and of credential %q: a pull secret holds one credential; name it in one block only.", key, prev, name)
			}

			owner[key] = name
		}
	}
}

// oneCredential decodes one credential block.
func (d *decoder) oneCredential(c credentialBlock, body hcl.Body) Credential {
	at := func(attr string) hcl.Range { return blockRange(body, "credential", c.Name, attr) }
	sops, rng, ok := d.str(c.SopsFile, "")

	if ok {
		sops = d.existingFile(sops, rng, "sops_file")
	}

	cred := Credential{
		Where:     blockRange(body, "credential", c.Name, ""),
		SopsWhere: at("sops_file"),
		Name:      c.Name,
		Registry:  c.Registry,
		Endpoint:  "https://" + c.Registry,
		SopsFile:  sops,
		Key:       []string{"stringData", "ghcr_dockerconfigjson"},
		Prove:     c.Prove,
		Deny:      c.Deny,
	}

	if c.Registry == "" || strings.Contains(c.Registry, "/") {
		d.errorf(at("registry"), "Invalid registry",
			"registry is the host name the credential is keyed by in the dockerconfigjson (e.g. \"ghcr.io\"), not %q.", c.Registry)
	}

	cred.TrustedHosts = d.hosts(c.TrustedHosts, at("trusted_hosts"))
	cred.RetryWindow = d.duration(c.RetryWindow, DefaultRetryWindow, "credential.retry_window")
	cred.DeniedWindow = d.duration(c.DeniedWindow, DefaultDeniedWindow, "credential.denied_window")

	if cred.DeniedWindow > cred.RetryWindow {
		d.errorf(at("denied_window"), "Invalid denied_window",
			"credential.denied_window (%s) must not be longer than credential.retry_window (%s): a denial is asked again within the retry window.",
			cred.DeniedWindow, cred.RetryWindow)
	}

	if c.Endpoint != nil {
		cred.Endpoint = strings.TrimSuffix(*c.Endpoint, "/")
		err := pin.URL(cred.Endpoint, nil)
		if err == nil {
			err = pin.Base(cred.Endpoint)
		}

		if err != nil {
			d.errorf(at("endpoint"), "Invalid endpoint", "credential.endpoint receives the credential: %s.", err)
		}
	}

	if len(c.Key) > 0 {
		cred.Key = c.Key
	}

	for _, p := range c.Prove {
		if !proveRef.MatchString(p) {
			d.errorf(at("prove"), "Invalid image reference",
				"prove entries are repository:tag (or repository@sha256:…) on the registry, like \"org/private-image:v1\"; %q is not.", p)
		}
	}

	for _, p := range c.Deny {
		switch {
		case !proveRef.MatchString(p):
			d.errorf(at("deny"), "Invalid image reference",
				"deny entries are repository:tag (or repository@sha256:…) on the registry the credential must not pull, like \"other-team/private-image:v1\"; %q is not.", p)
		case slices.Contains(c.Prove, p):
			d.errorf(at("deny"), "Image both proved and denied",
				"%q is in credential.prove (must pull) and credential.deny (must not pull): keep it in one.", p)
		}
	}

	return cred
}

// blockRange is where attr of the labelled block (type, label) was written (attr "": the block's
// header), for diagnostics about values decoded as plain Go types.
func blockRange(body hcl.Body, block, label, attr string) hcl.Range {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: block, LabelNames: []string{"name"}}}})
	for _, b := range content.Blocks {
		if len(b.Labels) != 1 || b.Labels[0] != label {
			continue
		}

		if attr != "" {
			if attrs, _ := b.Body.JustAttributes(); attrs != nil {
				if a, ok := attrs[attr]; ok {
					return a.Range
				}
			}
		}

		return b.DefRange
	}

	return attrRange(body, block, attr)
}

func (d *decoder) nodes(raw *file, body hcl.Body, cfg *Config) {
	n := Nodes{AutoscalerCandidates: AutoscalerInclude, WorkerParallelism: 1, LiveParallelism: 10, MaxFailures: 1, DrainTimeout: 45 * time.Minute, ReadyTimeout: 10 * time.Minute,
		Verdict: VerdictCluster, ExpectedNodeTime: DefaultExpectedNodeTime, ExpectedLiveTime: DefaultExpectedLiveTime}

	if len(cfg.Credential.Prove) > 0 {
		n.Probe = Probe{Image: cfg.Credential.Registry + "/" + cfg.Credential.Prove[0]}
	}

	n.Probe.Namespace, n.Probe.ServiceAccount = DefaultProbeNamespace, DefaultProbeServiceAccount

	if b := raw.Nodes; b != nil {
		if b.Selector != nil {
			if _, err := labels.Parse(*b.Selector); err != nil {
				d.errorf(attrRange(body, "nodes", "selector"), "Invalid selector", "selector %q is not a Kubernetes label selector: %v.", *b.Selector, err)
			}

			n.Selector = *b.Selector
		}

		n.Exclude = b.Exclude

		policy, rng, _ := d.str(b.AutoscalerCandidates, AutoscalerInclude)
		if !slices.Contains([]string{AutoscalerDeselect, AutoscalerInclude}, policy) {
			d.errorf(rng, "Invalid autoscaler_candidates", "autoscaler_candidates must be \"deselect\" or \"include\", not %q.", policy)
		}

		n.AutoscalerCandidates = policy

		scope, rng, _ := d.str(b.Verdict, VerdictCluster)
		if scope != VerdictCluster && scope != VerdictSelected {
			d.errorf(rng, "Invalid verdict scope", "nodes.verdict must be \"cluster\" (judge every Node) or \"selected\" (only those nodes.selector selects), not %q.", scope)
		}

		n.Verdict = scope

		n.WorkerParallelism = d.atLeastOne(b.WorkerParallelism, n.WorkerParallelism, "worker_parallelism")
		n.LiveParallelism = d.atLeastOne(b.LiveParallelism, n.LiveParallelism, "live_parallelism")
		n.MaxFailures = d.atLeastOne(b.MaxFailures, n.MaxFailures, "max_failures")

		n.DrainTimeout = d.duration(b.DrainTimeout, n.DrainTimeout, "nodes.drain_timeout")
		n.ExpectedNodeTime = d.duration(b.ExpectedNodeTime, n.ExpectedNodeTime, "nodes.expected_node_time")
		n.ExpectedLiveTime = d.duration(b.ExpectedLiveTime, n.ExpectedLiveTime, "nodes.expected_live_time")
		n.ReadyTimeout = d.duration(b.ReadyTimeout, n.ReadyTimeout, "nodes.ready_timeout")

		if b.AllowQuorumLoss != nil {
			n.AllowQuorumLoss = *b.AllowQuorumLoss
		}

		d.probe(b.RuntimeProbe, body, &n.Probe)
	}

	if n.Probe.Image != "" && len(n.Probe.Images) == 0 {
		n.Probe.Images = []string{n.Probe.Image}
	}

	for _, img := range n.Probe.Images {
		if !strings.HasPrefix(img, cfg.Credential.Registry+"/") {
			d.errorf(attrRange(body, "nodes", "runtime_probe"), "Invalid probe image",
				"nodes.runtime_probe.image must be an image on the credential's registry (%s/…): it proves the node's credential for that registry, not %q.",
				cfg.Credential.Registry, img)
		}
	}

	cfg.Nodes = n
}

// probe reads nodes.runtime_probe over the defaults in pr.
func (d *decoder) probe(p *probeBlock, body hcl.Body, pr *Probe) {
	if p == nil {
		return
	}

	if p.Image != nil {
		pr.Image = *p.Image
	}

	switch {
	case p.Images != nil && p.Image != nil:
		d.errorf(attrRange(body, "nodes", "runtime_probe"), "Conflicting probe images", "set nodes.runtime_probe.image or images, not both.")
	case p.Images != nil && len(*p.Images) == 0:
		d.errorf(attrRange(body, "nodes", "runtime_probe"), "No probe images", "nodes.runtime_probe.images lists no image.")
	case p.Images != nil:
		pr.Image, pr.Images = (*p.Images)[0], slices.Clone(*p.Images)
	}

	if p.Namespace != nil {
		pr.Namespace = *p.Namespace
	}

	if p.ServiceAccount != nil {
		pr.ServiceAccount = *p.ServiceAccount
	}
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
