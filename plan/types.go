package plan

import (
	"time"

	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/state"
)

// Snapshot is what the planner looks at: the fleet as observed, with no client in sight.
type Snapshot struct {
	TakenAt time.Time `json:"taken_at"`
	// APIEndpoint is the host of the kubeconfig's server.
	APIEndpoint string `json:"api_endpoint"`
	// ClusterUID identifies the cluster: the uid of its kube-system namespace.
	ClusterUID string `json:"cluster_uid"`
	Nodes      []Node `json:"nodes"`
	// OtherNodes are the Nodes nodes.selector leaves out, by identity only: an address or uid
	// one of them shares with a node of the fleet makes that node ambiguous.
	OtherNodes []Identity `json:"other_nodes,omitempty"`
	// Outside are those Nodes in full, with their Talos facts: ghcrsync rotates none of them, and
	// the verdict judges every one (unless the configuration narrows it to the selector).
	Outside []Node      `json:"outside_nodes,omitempty"`
	Lease   *Lease      `json:"lease,omitempty"`
	Secrets []SecretObs `json:"secrets,omitempty"`
	// Templates are the configured node templates' configs (none: no node_template block).
	Templates []TemplateObs `json:"templates,omitempty"`
	// Kustomizations are the Flux Kustomizations the flux block names.
	Kustomizations []KustomizationObs `json:"kustomizations,omitempty"`
	// Autoscaler is the cluster-autoscaler's status, read when node templates are configured
	// (nil: none configured, or no status published).
	Autoscaler *AutoscalerObs `json:"autoscaler,omitempty"`
	// PullSecretRefs are the pull secrets pods reference for the registry's images: one that is
	// not a managed consumer is a use the verdict cannot inspect.
	PullSecretRefs []PullSecretRef `json:"pull_secret_refs,omitempty"`
	// InUse are the distinct credentials the nodes and the managed secrets hold, as the
	// registry judged each when the snapshot was taken.
	InUse []CredentialInUse `json:"credentials_in_use,omitempty"`
}

// AutoscalerObs is the cluster-autoscaler's own status: each node group's machines.
type AutoscalerObs struct {
	Time   string         `json:"time,omitempty"`
	Groups []NodeGroupObs `json:"node_groups,omitempty"`
}

// NodeGroupObs is one node group: the machines the cloud provider is asked for (Target) and
// those registered as Nodes, and not (yet).
type NodeGroupObs struct {
	Name         string `json:"name"`
	Target       int    `json:"target"`
	Registered   int    `json:"registered"`
	Unregistered int    `json:"unregistered,omitempty"`
}

// Provisioning is how many of the group's machines exist and are not Nodes yet.
func (g NodeGroupObs) Provisioning() int { return max(g.Target-g.Registered, g.Unregistered, 0) }

// Provisioning are the node groups with machines being provisioned.
func (a *AutoscalerObs) Provisioning() []NodeGroupObs {
	if a == nil {
		return nil
	}

	var out []NodeGroupObs

	for _, g := range a.Groups {
		if g.Provisioning() > 0 {
			out = append(out, g)
		}
	}

	return out
}

// PullSecretRef is a pull secret pods reference while pulling from the registry.
type PullSecretRef struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Pods      int      `json:"pods"`
	Examples  []string `json:"examples,omitempty"` // up to three of the pods
}

// Credential states, as the registry judged a credential in use.
const (
	CredentialValid       = "valid"
	CredentialRefused     = "refused"
	CredentialUnreachable = "unreachable"
	// CredentialPartial: it pulls some of the prove packages and is denied others (one it was
	// never granted): a warning naming them, not an emergency.
	CredentialPartial = "partial"
)

// CredentialInUse is one distinct credential the fleet or the managed secrets hold: by its auth
// digest (never the credential itself), where it is, and what the registry said of it.
type CredentialInUse struct {
	Digest string `json:"digest"`
	// Credential is the tenant credential whose pull secrets hold it ("": the cluster's), judged
	// against that tenant's packages.
	Credential string `json:"credential,omitempty"`
	// Desired is true for the credential this plan rotates to.
	Desired bool     `json:"desired,omitempty"`
	Nodes   []string `json:"nodes,omitempty"`
	Secrets []string `json:"secrets,omitempty"`
	State   string   `json:"state"`
	Detail  string   `json:"detail,omitempty"`
	// Denied are the packages a partial credential cannot pull.
	Denied []string `json:"denied,omitempty"`
}

// Node is one observed Kubernetes Node with its Talos facts.
type Node struct {
	Name         string `json:"name"`
	UID          string `json:"uid"`
	ControlPlane bool   `json:"control_plane"`
	InternalIP   string `json:"internal_ip,omitempty"` // where its Talos API is reached: its first InternalIP
	// InternalIPs are all the InternalIPs it reports: a node is acted on only with exactly one.
	InternalIPs   []string `json:"internal_ips,omitempty"`
	Addresses     []string `json:"addresses,omitempty"`
	Unschedulable bool     `json:"unschedulable,omitempty"`
	// HeldUnproven: its cordon is ghcrsync's unproven hold (an undone fence whose proof never ran).
	HeldUnproven bool `json:"held_unproven,omitempty"`
	// Autoscaled: a machine of an autoscaler node group (the hcloud/node-group label).
	Autoscaled bool           `json:"autoscaled,omitempty"`
	Taints     []taints.Taint `json:"taints,omitempty"`
	// Owner and Phase are ghcrsync's fence on the node (its owner and phase annotations);
	// VerifiedRevision and VerifiedBoot its verified marker.
	Owner            string      `json:"owner,omitempty"`
	Phase            state.Phase `json:"phase,omitempty"`
	VerifiedRevision string      `json:"verified_revision,omitempty"`
	VerifiedBoot     string      `json:"verified_boot,omitempty"`
	// Keyring is the credential (its auth digest) ghcrsync last wrote into the node's kubelet
	// keyring, or read there ("": none known): the kubelet sends it with every pull, before
	// containerd's own. The ghcrsync.dev/keyring annotation.
	Keyring  string     `json:"keyring,omitempty"`
	Deleting *time.Time `json:"deleting,omitempty"`
	Ready    bool       `json:"ready"`
	BootID   string     `json:"boot_id,omitempty"`
	// Arch is its CPU architecture (the kubernetes.io/arch label): the probe's image must have
	// a variant for it.
	Arch       string      `json:"arch,omitempty"`
	Talos      *TalosFacts `json:"talos,omitempty"`
	TalosError string      `json:"talos_error,omitempty"`
	// TalosDenied: the node's Talos refused the read to this identity (PermissionDenied): the
	// talosconfig's role is too small, not the node unwell (plan fails, naming the role).
	TalosDenied bool `json:"talos_denied,omitempty"`
	// Pods counts the pods a drain of the node would evict (not DaemonSet, mirror or finished).
	Pods int `json:"pods,omitempty"`
	// Blockers are what its drain would meet: pods a budget holds now, pods with no controller,
	// pods whose emptyDir data an eviction loses.
	Blockers []DrainBlocker `json:"drain_blockers,omitempty"`
}

// Drain blocker kinds.
const (
	// BlockerBudget: a PodDisruptionBudget selecting the pod allows no disruption now: the drain
	// waits for it, up to nodes.drain_timeout, then fails and the node is restored.
	BlockerBudget = "budget"
	// BlockerBare: the pod has no controller: the drain refuses it (nothing would recreate it).
	BlockerBare = "bare"
	// BlockerEmptyDir: evicting the pod loses its emptyDir data (the drain goes on).
	BlockerEmptyDir = "emptydir"
)

// DrainBlocker is one pod a drain of its node would meet.
type DrainBlocker struct {
	Kind string `json:"kind"`
	Pod  string `json:"pod"` // namespace/name
	// Budget is the PodDisruptionBudget (namespace/name) of a BlockerBudget; Volumes the
	// emptyDir volumes of a BlockerEmptyDir.
	Budget  string   `json:"budget,omitempty"`
	Volumes []string `json:"volumes,omitempty"`
	// Allowed and OnNode, for a budget that allows some disruptions but fewer than the node
	// carries of its pods while their replacements have no other node to go to: the first
	// Allowed evictions pass, this pod's waits for a replacement that cannot become ready.
	Allowed int `json:"allowed,omitempty"`
	OnNode  int `json:"on_node,omitempty"`
	// Action, for a budget at 0 that never frees by itself (drain.Action), is what frees it: the
	// node is deferred, naming it, rather than held for nodes.drain_timeout ("": the budget frees
	// as its workload's replacements become ready).
	Action string `json:"action,omitempty"`
}

// NeedsAction reports whether the blocker is a hold that never clears by itself.
func (b DrainBlocker) NeedsAction() bool { return b.Kind == BlockerBudget && b.Action != "" }

// Holds reports whether the blocker stops the drain (a budget's hold or a bare pod), rather
// than only costing data.
func (b DrainBlocker) Holds() bool { return b.Kind == BlockerBudget || b.Kind == BlockerBare }

// Identity is what tells a Node's machine apart: its uid and InternalIPs.
type Identity struct {
	Name        string   `json:"name"`
	UID         string   `json:"uid"`
	InternalIPs []string `json:"internal_ips,omitempty"`
}

// Identity is the node's.
func (n Node) Identity() Identity {
	return Identity{Name: n.Name, UID: n.UID, InternalIPs: n.InternalIPs}
}

// Identities are the nodes' identities.
func Identities(nodes []Node) []Identity {
	out := make([]Identity, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Identity())
	}

	if len(out) == 0 {
		return nil
	}

	return out
}

// TalosFacts are read from the node's Talos API.
type TalosFacts struct {
	Version string `json:"version"`
	// ConfiguredDigest is the AuthDigest of the registry's credential in the active machine
	// config ("" if it has none); StagedDigest the same for the persistent (next-boot) config.
	ConfiguredDigest string `json:"configured_digest,omitempty"`
	StagedDigest     string `json:"staged_digest,omitempty"`
	// StagedDiffers is true when a config staged for the next boot differs from the active one
	// (an operator's pending change).
	StagedDiffers bool      `json:"staged_differs,omitempty"`
	ConfigUpdated time.Time `json:"config_updated"`
	CRIStarted    time.Time `json:"cri_started"`
	// DryRun is what its Talos answered a dry run of exactly the change (the mode it would take);
	// DryRunRefused its refusal of that config (plan deselects the node: never claimed).
	DryRun        string `json:"dry_run,omitempty"`
	DryRunRefused string `json:"dry_run_refused,omitempty"`
	// KubeletRootDir is the kubelet's root directory on the node (its keyring's folder):
	// machine.kubelet.extraArgs root-dir, else /var/lib/kubelet.
	KubeletRootDir string `json:"kubelet_root_dir,omitempty"`
	// Mirrors are the endpoints its containerd pulls the registry's images through.
	Mirrors []string `json:"mirrors,omitempty"`
}

// Lease is the observed run Lease.
type Lease struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Holder    string     `json:"holder,omitempty"`
	RenewTime *time.Time `json:"renew_time,omitempty"`
	// Written is the API server's time of the Lease's latest change (1 s resolution): its
	// renewal by the server's clock, where RenewTime is by the holder's.
	Written         *time.Time `json:"written,omitempty"`
	DurationSeconds int        `json:"duration_seconds,omitempty"`
	Transitions     int        `json:"transitions,omitempty"`
}

// SelfNodeEnv names the environment variable that gives the node ghcrsync's own pod runs on
// (the Job manifest sets it from the downward API's spec.nodeName); unset outside a cluster.
const SelfNodeEnv = "GHCRSYNC_NODE_NAME"

// Input is everything besides the snapshot that decides the plan.
type Input struct {
	Now                time.Time
	TTL                time.Duration // how long the plan stays valid
	CredentialRevision string
	// PullSecretRevision is the digest a pull secret holds when it is in sync: of the
	// dockerconfigjson with the Registry's entry only (what the fan-out writes).
	PullSecretRevision string
	AuthDigest         string // of the desired credential for Registry
	Registry           string
	ProofSkipped       bool
	// CredentialExpires is when the credential expires, as the registry reported it (zero: not).
	CredentialExpires time.Time
	// ProofRetries is the registry's passing trouble the proof waited out ("": none).
	ProofRetries string
	// IsolatedFrom are the images the registry refused the credential (credential.deny).
	IsolatedFrom []string
	// Credential names the cluster credential when the configuration has tenants ("" otherwise);
	// Tenants are the tenant credentials' rotations (several credential blocks).
	Credential   string
	Tenants      []TenantRotation
	ConfigDigest string
	Exclude      []string
	// SelfNode is the node this ghcrsync runs on, in a cluster (SelfNodeEnv): never fenced.
	SelfNode         string
	AutoscalerPolicy string // "deselect" or "include"
	AllowQuorumLoss  bool   // nodes.allow_quorum_loss
	// WaitHeldDrains: a drain held by a budget that needs an action waits nodes.drain_timeout for
	// someone to act (maintenance.held_drain = "wait") instead of deferring the node.
	WaitHeldDrains bool
	State          StateRef
	// Known lists nodes the prior state or a previous plan recorded (name -> uid).
	Known map[string]string
	// Probe is how apply proves a node's runtime (the image by its proved digest).
	Probe Probe
	// AllowPending lets evicted pods wait Pending rather than land on a node that cannot pull
	// or is drained later (plan --allow-pending).
	AllowPending bool
	// SelectedVerdict narrows the verdict to the nodes nodes.selector selects (nodes.verdict =
	// "selected"); by default it judges every Node of the cluster.
	SelectedVerdict bool
	// Timing is what the estimate is made of: the recorded samples, the defaults, the budget.
	Timing Timing
	// Rotation is the rotation the state says is in progress (nil: none).
	Rotation *state.Rotation
	// Keyring, when set, lets a node whose Talos cannot reload registry auth live take the
	// credential through its kubelet's keyring (nodes.kubelet_keyring); nil: every such node is
	// fenced and rebooted.
	Keyring *KeyringPolicy
}

// KeyringPolicy is how the kubelet keyring may be used.
type KeyringPolicy struct {
	// TrustedMirrors are mirror endpoints an operator accepts receiving the credential (the
	// kubelet's keyring credential goes to every endpoint containerd pulls from).
	TrustedMirrors []string `json:"trusted_mirrors,omitempty"`
	// RootDirs are the kubelet root directories the writer may mount (nil: any).
	RootDirs []string `json:"root_dirs,omitempty"`
	// Failed are the nodes an earlier run of this revision wrote a keyring on and could not prove
	// (the writer did not run, or no proof within the keyring's window), with what failed: a
	// reboot loads the credential there instead.
	Failed map[string]string `json:"failed,omitempty"`
}

// Probe is the runtime proof a plan's apply makes on each node: a pod of Image (by digest, as
// proved against the registry), in Namespace, as ServiceAccount, with no pull secret.
type Probe struct {
	Image string `json:"image"`
	// Images are every image the probe pulls, Image first, each by its proved digest (absent in
	// plans of one image).
	Images         []string `json:"images,omitempty"`
	Namespace      string   `json:"namespace"`
	ServiceAccount string   `json:"service_account"`
	// Platforms are, for each image the probe pulls, the platforms (os/arch) the registry's
	// manifest offers, as proved (absent: not known, or a plan made without the proof).
	Platforms map[string][]string `json:"platforms,omitempty"`
}

// Pulls are the images the probe pulls on each node.
func (p Probe) Pulls() []string {
	if len(p.Images) > 0 {
		return p.Images
	}

	if p.Image != "" {
		return []string{p.Image}
	}

	return nil
}

// StateRef binds a plan to the state it was made against.
type StateRef struct {
	Lineage string `json:"lineage"`
	Serial  int64  `json:"serial"`
}

// Action is what the plan does to a node.
type Action string

const (
	ActionFence     Action = "fence"
	ActionApplyLive Action = state.ActionApplyLive
	// ActionKeyring: the node's Talos cannot reload registry auth live (≤ 1.13); its config is
	// written live all the same (every later boot, and Talos's own pulls, take it), and the
	// kubelet's node keyring gets the credential, which the kubelet sends with every pull and
	// containerd uses before its own: proved on the node, with no cordon, drain, reboot or restart.
	ActionKeyring  Action = state.ActionKeyring
	ActionNoOp     Action = "no-op"
	ActionDeselect Action = "deselect"
)

// Acts reports whether the action changes the node: a fence, a live update, a keyring write.
func (a Action) Acts() bool { return a == ActionFence || a == ActionApplyLive || a == ActionKeyring }

// InPlace reports whether the action rotates the node in service: no claim, no cordon, no drain,
// no reboot (a live update, a keyring write).
func (a Action) InPlace() bool { return a == ActionApplyLive || a == ActionKeyring }

// Role is a node's role.
type Role string

const (
	RoleControlPlane Role = "control-plane"
	RoleWorker       Role = "worker"
)

// Plan is the saved plan: no secret, only digests.
type Plan struct {
	FormatVersion      string    `json:"format_version"`
	CreatedAt          time.Time `json:"created_at"`
	ExpiresAt          time.Time `json:"expires_at"`
	CredentialRevision string    `json:"credential_revision"`
	AuthDigest         string    `json:"auth_digest"`
	Registry           string    `json:"registry"`
	ProofSkipped       bool      `json:"proof_skipped,omitempty"`
	// CredentialExpiresAt is when the new credential stops working, as the registry reported it
	// (zero: not reported).
	CredentialExpiresAt time.Time `json:"credential_expires_at,omitzero"`
	// IsolatedFrom are the images the registry refused the credential when it was proved
	// (credential.deny: another tenant's packages).
	IsolatedFrom []string `json:"isolated_from,omitempty"`
	// Credential names the cluster credential (the nodes', the templates', the root's) when the
	// configuration has tenant credentials; Tenants are theirs, each reaching its pull secrets
	// only (absent with one credential).
	Credential   string           `json:"credential,omitempty"`
	Tenants      []TenantRotation `json:"tenants,omitempty"`
	ConfigDigest string           `json:"config_digest"`
	State        StateRef         `json:"state"`
	APIEndpoint  string           `json:"api_endpoint"`
	ClusterUID   string           `json:"cluster_uid"` // the plan applies to this cluster only
	EndpointNode string           `json:"endpoint_node,omitempty"`
	// CredentialsInUse are the credentials the fleet and the managed secrets held, as the
	// registry judged them (Refused, Emergency).
	CredentialsInUse []CredentialInUse `json:"credentials_in_use,omitempty"`
	// StaleRuntimes are the nodes whose container runtime has not loaded the credential their
	// Talos config holds (Talos without live reload, the runtime started before the config last
	// changed, no proof on this boot): their runtime pulls with what it booted with.
	StaleRuntimes []string     `json:"stale_runtimes,omitempty"`
	Nodes         []NodePlan   `json:"nodes"`
	Secrets       []SecretPlan `json:"secrets,omitempty"`
	// Templates are the node templates' configs, written after the consumer secrets and before
	// the root Flux secret.
	Templates []TemplatePlan `json:"templates,omitempty"`
	// Flux are the Kustomizations suspended for the run (the flux block).
	Flux []FluxPlan `json:"flux,omitempty"`
	// Owners are the other managers of the objects the run writes, and what each means for it.
	Owners   []OtherOwner `json:"other_owners,omitempty"`
	Warnings []string     `json:"warnings,omitempty"`
	// DrainHolds counts the warnings that predict a drain will be held (a budget allowing no
	// disruption, a pod with no controller): plan --strict refuses on any.
	DrainHolds int `json:"drain_holds,omitempty"`
	// Drifted are the nodes whose active machine config lost the credential ghcrsync rotated
	// them to (configDrift): re-applied by whatever else owns the machine config.
	Drifted []string `json:"drifted,omitempty"`
	Summary Summary  `json:"summary"`
	// Probe is the runtime proof apply makes (its image by the digest plan proved).
	Probe Probe `json:"probe"`
	// Steering is how the run keeps evicted pods off nodes not yet rotated.
	Steering Steering `json:"steering"`
	// Verdict is who uses which credential as the plan found the cluster (apply judges it again
	// at the end of its run).
	Verdict *Revocation `json:"verdict,omitempty"`
	// Estimate is how long apply is expected to take, and what fits in its time budget.
	Estimate *Estimate `json:"estimate,omitempty"`
	// Continuing is the rotation to this revision an earlier run started and did not finish.
	Continuing *state.Rotation `json:"continuing,omitempty"`

	seal *seal // set when read from a file: what its MAC covers
}

// TenantRotation is a tenant credential's rotation: proved (and its isolation) on its own, it
// reaches its consumers' pull secrets only, never a node, a template or the root.
type TenantRotation struct {
	Name string `json:"name"`
	// Revision is what its pull secrets hold when in sync (the digest of the dockerconfigjson
	// the fan-out writes); AuthDigest is the credential's.
	Revision     string    `json:"revision"`
	AuthDigest   string    `json:"auth_digest"`
	Registry     string    `json:"registry"`
	ProofSkipped bool      `json:"proof_skipped,omitempty"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
	IsolatedFrom []string  `json:"isolated_from,omitempty"`
}

// Tenant is the plan's rotation of the named tenant credential.
func (p *Plan) Tenant(name string) (TenantRotation, bool) {
	for _, t := range p.Tenants {
		if t.Name == name {
			return t, true
		}
	}

	return TenantRotation{}, false
}

// FormatVersion of Plan; additive changes keep the major version.
const FormatVersion = "1.0"

// NodePlan is one node's action, why, and the invariants apply re-validates.
type NodePlan struct {
	Name     string `json:"name"`
	UID      string `json:"uid,omitempty"`
	Role     Role   `json:"role,omitempty"`
	Action   Action `json:"action"`
	Reason   Reason `json:"reason_code"`
	Sentence string `json:"reason"`
	Order    int    `json:"order,omitempty"` // 1.. for nodes that are acted on
	Endpoint bool   `json:"api_endpoint,omitempty"`
	Talos    string `json:"talos_version,omitempty"`
	// TalosDryRun is its Talos's answer to a dry run of the change (nodes acted on).
	TalosDryRun string `json:"talos_dry_run,omitempty"`
	// Blockers are what its drain will meet (fenced nodes).
	Blockers []DrainBlocker `json:"drain_blockers,omitempty"`
	// KubeletRootDir is where its kubelet's keyring is (kubelet-keyring nodes, and fenced nodes
	// whose keyring an earlier rotation wrote); Keyring the credential ghcrsync knows it holds.
	KubeletRootDir string     `json:"kubelet_root_dir,omitempty"`
	Keyring        string     `json:"keyring,omitempty"`
	Pods           int        `json:"pods,omitempty"` // the pods its drain would evict, when planned
	Invariants     Invariants `json:"invariants"`
	// Autoscaled: a machine of an autoscaler node group (its estimate's class).
	Autoscaled bool `json:"autoscaled,omitempty"`
	// Estimate is how long its rotation is expected to take; Ends when, from the run's start, it
	// is expected to end; InBudget whether that is within the run's time budget.
	Estimate time.Duration `json:"estimate,omitempty"`
	Ends     time.Duration `json:"ends,omitempty"`
	InBudget bool          `json:"in_budget,omitempty"`
}

// Invariants are the facts a plan snapshots and apply re-validates before it touches a node.
type Invariants struct {
	UID           string `json:"uid"`
	Unschedulable bool   `json:"unschedulable"`
	// HeldUnproven: the cordon is ghcrsync's unproven hold (cluster.UnprovenAnnotation).
	HeldUnproven     bool     `json:"held_unproven,omitempty"`
	SchedulingTaints []string `json:"scheduling_taints"`
	Owner            string   `json:"owner,omitempty"`
	ConfiguredDigest string   `json:"configured_digest,omitempty"`
	BootID           string   `json:"boot_id,omitempty"`
	// ControlPlane: it was a control plane (its etcd gate, its order) when the plan was made.
	ControlPlane bool `json:"control_plane,omitempty"`
}

// Summary counts the actions.
type Summary struct {
	Fence      int `json:"fence"`
	ApplyLive  int `json:"apply_live"`
	Keyring    int `json:"kubelet_keyring,omitempty"`
	Unchanged  int `json:"unchanged"`
	Deselected int `json:"deselected"`

	SecretsCreate    int `json:"secrets_create"`
	SecretsUpdate    int `json:"secrets_update"`
	SecretsUnchanged int `json:"secrets_unchanged"`
	SecretsSkipped   int `json:"secrets_skipped"`

	TemplatesUpdate    int `json:"templates_update,omitempty"`
	TemplatesRestart   int `json:"templates_restart,omitempty"`
	TemplatesUnchanged int `json:"templates_unchanged,omitempty"`
}

// Changes reports whether the plan acts on any node, pull secret or node template.
func (p *Plan) Changes() bool {
	return p.Summary.Fence+p.Summary.ApplyLive+p.Summary.Keyring+p.Summary.SecretsCreate+p.Summary.SecretsUpdate+p.Summary.TemplatesUpdate+p.Summary.TemplatesRestart > 0
}

// ExpiryWarning is how long before its expiry a credential is reported as expiring.
const ExpiryWarning = 14 * 24 * time.Hour

// CredentialExpiring reports whether the credential expires within ExpiryWarning of the plan.
func (p *Plan) CredentialExpiring() bool {
	return !p.CredentialExpiresAt.IsZero() && p.CredentialExpiresAt.Sub(p.CreatedAt) < ExpiryWarning
}

// SafeToRevoke reports whether, as the plan found the cluster, nothing uses the old credential
// (of any credential the configuration rotates).
func (p *Plan) SafeToRevoke() bool { return p.Verdict != nil && p.Verdict.Clean() }

// Node returns the plan's entry for the named node.
func (p *Plan) Node(name string) (NodePlan, bool) {
	for _, n := range p.Nodes {
		if n.Name == name && name != "" {
			return n, true
		}
	}

	return NodePlan{}, false
}

// KustomizationObs is an observed Flux Kustomization the flux block names.
type KustomizationObs struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Exists    bool   `json:"exists"`
	UID       string `json:"uid,omitempty"`
	Suspended bool   `json:"suspended,omitempty"`
	// SuspendedBy is the run whose suspension it carries (ghcrsync's annotation; "": a person's,
	// or none).
	SuspendedBy string `json:"suspended_by,omitempty"`
	// Handled is the last reconcile request kustomize-controller answered
	// (status.lastHandledReconcileAt): a run's read while it waits, not part of a plan.
	Handled string `json:"-"`
}
