// Package plan is the pure planner: Make turns a snapshot of the fleet and the desired
// credential into one action per node, with its reason, in execution order. It performs no
// I/O; the saved-plan format (file.go) is the only thing in this package that touches a file.
package plan

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// Make decides every node's action. The same inputs always give the same plan.
func Make(s Snapshot, in Input) *Plan {
	p := &Plan{
		FormatVersion:       FormatVersion,
		CreatedAt:           in.Now.UTC(),
		ExpiresAt:           in.Now.Add(in.TTL).UTC(),
		CredentialRevision:  in.CredentialRevision,
		AuthDigest:          in.AuthDigest,
		Registry:            in.Registry,
		ProofSkipped:        in.ProofSkipped,
		CredentialExpiresAt: in.CredentialExpires,
		IsolatedFrom:        in.IsolatedFrom,
		Credential:          in.Credential,
		Tenants:             in.Tenants,
		ConfigDigest:        in.ConfigDigest,
		State:               in.State,
		APIEndpoint:         s.APIEndpoint,
		ClusterUID:          s.ClusterUID,
		Probe:               in.Probe,
	}

	p.Nodes, p.EndpointNode = planNodes(s, in)
	order(p.Nodes)
	p.Secrets = planSecrets(s.Secrets, in.revisionOf)
	p.Templates = planTemplates(s.Templates, in.AuthDigest)
	p.Summary = summarize(p.Nodes, p.Secrets, p.Templates)

	p.Flux = planFlux(s.Kustomizations, p.Changes())
	p.Owners = OtherOwners(s, p.Flux)
	p.CredentialsInUse = inUse(s.InUse)
	p.StaleRuntimes = staleRuntimes(s, in)
	p.Steering = steer(p, s, in.AllowPending)
	p.Estimate = estimate(p, in.Timing)
	p.Continuing = continuing(in)
	p.Warnings = append(warnings(p, s, in), neverFitWarning(p)...)

	var drift []string
	p.Drifted, drift = configDrift(s, in)
	p.Warnings = append(p.Warnings, drift...)
	p.Warnings = append(p.Warnings, writeRefusals(p)...)

	predicted, holds := drainPredictions(p, in.WaitHeldDrains)
	p.Warnings, p.DrainHolds = append(p.Warnings, predicted...), holds

	v := Inventory(s, in)
	p.Verdict = &v

	return p
}

// planNodes classifies every node of the snapshot, then deselects every node an earlier run
// recorded that no longer exists; it names the node serving the API endpoint ("" if none).
func planNodes(s Snapshot, in Input) ([]NodePlan, string) {
	var (
		out      []NodePlan
		endpoint string
	)

	seen := map[string]bool{}
	problems := IdentityProblems(s)

	for _, n := range s.Nodes {
		seen[n.Name] = true
		np := classify(n, in, problems[n.Name])

		if endpointOf(n, s.APIEndpoint) {
			np.Endpoint, endpoint = true, n.Name
		}

		out = append(out, np)
	}

	known := make([]string, 0, len(in.Known))
	for name := range in.Known {
		known = append(known, name)
	}

	sort.Strings(known)

	for _, name := range known {
		if !seen[name] {
			out = append(out, NodePlan{
				Name: name, UID: in.Known[name], Action: ActionDeselect, Reason: ReasonNotFound,
				Sentence:   ReasonNotFound.Sentence("recorded by an earlier run, no Node of that name now"),
				Invariants: Invariants{UID: in.Known[name]},
			})
		}
	}

	return out, endpoint
}

func classify(n Node, in Input, identity string) NodePlan {
	np := NodePlan{
		Name: n.Name, UID: n.UID, Role: RoleWorker, Pods: n.Pods, Autoscaled: n.Autoscaled,
		Invariants: Invariants{
			UID:              n.UID,
			Unschedulable:    n.Unschedulable,
			HeldUnproven:     n.HeldUnproven,
			SchedulingTaints: taints.Scheduling(n.Taints),
			Owner:            n.Owner,
			BootID:           n.BootID,
			ControlPlane:     n.ControlPlane,
		},
	}

	if n.ControlPlane {
		np.Role = RoleControlPlane
	}

	if n.Talos != nil {
		np.Talos = n.Talos.Version
		np.Invariants.ConfiguredDigest = n.Talos.ConfiguredDigest
	}

	if slices.Contains(in.Exclude, n.Name) {
		np.Action, np.Reason, np.Sentence = ActionDeselect, ReasonExcluded, ReasonExcluded.Sentence("nodes.exclude")

		return np
	}

	if identity != "" {
		np.Action, np.Reason, np.Sentence = ActionDeselect, ReasonInvalidInventory, ReasonInvalidInventory.Sentence(identity)

		return np
	}

	np.Action, np.Reason, np.Sentence = needs(n, in)

	if np.Action == ActionFence && n.Name == in.SelfNode {
		np.Action, np.Reason, np.Sentence = ActionDeselect, ReasonRunsGhcrsync, ReasonRunsGhcrsync.Sentence("its pod's node, GHCRSYNC_NODE_NAME")

		return np
	}

	v := Judge(Subject{Node: &n, Action: np.Action, Step: StepPlan, CandidatePolicy: in.AutoscalerPolicy, Desired: in.AuthDigest})
	if v.Decision != Proceed {
		np.Action, np.Reason, np.Sentence = ActionDeselect, v.Reason, v.Reason.Sentence(v.Detail)
	}

	if np.Action.Acts() && n.Talos != nil {
		np.TalosDryRun = n.Talos.DryRun
		np.KubeletRootDir, np.Keyring = n.Talos.KubeletRootDir, n.Keyring
	}

	if np.Action == ActionFence {
		np.Blockers = n.Blockers // only a drain meets them
	}

	return np
}

// needs is what the node's Talos facts call for: nothing (in sync, with a proof that its runtime
// uses the credential), a live update, or a fence — or, without certain facts, to be left alone.
func needs(n Node, in Input) (Action, Reason, string) {
	version, refused, sentence := talosUsable(n)
	if refused != "" {
		return ActionDeselect, refused, sentence
	}

	live := version.AtLeast(TalosLiveRegistryAuth)
	// A keyring ghcrsync wrote that holds another credential: the kubelet sends it with every
	// pull, before containerd's own, whatever the Talos config says.
	staleKeyring := n.Keyring != "" && n.Keyring != in.AuthDigest

	if n.Talos.ConfiguredDigest == in.AuthDigest && in.AuthDigest != "" && !n.HeldUnproven && !staleKeyring {
		if proof := runtimeProof(n, in); proof != "" {
			return ActionNoOp, ReasonInSync, ReasonInSync.Sentence(human.Short(in.CredentialRevision)) + ": " + proof + keyringClause(n)
		}
	}

	reason, detail := ReasonConfigOutdated, "configured "+human.ShortOrNone(n.Talos.ConfiguredDigest)+", desired "+human.Short(in.AuthDigest)
	switch {
	case n.Talos.ConfiguredDigest == in.AuthDigest && staleKeyring:
		reason, detail = ReasonKeyringStale, human.Short(n.Keyring)+", desired "+human.Short(in.AuthDigest)
	case n.Talos.ConfiguredDigest == in.AuthDigest && n.HeldUnproven:
		reason, detail = ReasonRuntimeUnproven, "it is cordoned on ghcrsync's unproven hold: an earlier run wrote its config and never proved its runtime"
	case n.Talos.ConfiguredDigest == in.AuthDigest:
		reason, detail = ReasonRuntimeUnproven, "no verified marker for this revision, and the runtime started before the config changed"
	}

	why := reason.Sentence(detail)
	notUsable := keyringUnusable(n, in)

	switch {
	case in.Keyring != nil && notUsable == "" && (!live || n.Keyring != ""):
		// Talos ≤ 1.13, or a node whose keyring ghcrsync wrote (which a live reload would not
		// reach): the keyring takes the credential with no restart.
		return ActionKeyring, reason, why + "; Talos " + n.Talos.Version + keyringHow(live)
	case staleKeyring && in.Keyring == nil:
		return ActionDeselect, ReasonKeyringStale, why + "; only nodes.kubelet_keyring's writer can rewrite it: configure it, then plan again"
	case live && n.Talos.ConfiguredDigest != in.AuthDigest:
		// A live write restarts the runtime only when it changes the rendered config: a config
		// that already holds the credential, with a runtime not known to have loaded it, takes a
		// reboot.
		return ActionApplyLive, reason, why + "; Talos " + n.Talos.Version + " reloads registry auth live: apply and prove, no cordon"
	case live:
		return ActionFence, reason, why + "; Talos " + n.Talos.Version +
			" restarts its runtime only when a write changes its registry config, and this one would change nothing: a reboot loads it" + notUsable
	}

	return ActionFence, reason, why + "; Talos " + n.Talos.Version + " needs a reboot to load it" + notUsable
}

// keyringHow says how the keyring path loads the credential on a node.
func keyringHow(live bool) string {
	if live {
		return " reloads registry auth live, but its kubelet's keyring, which ghcrsync wrote, would still send the old credential with every pull: " +
			"the config written live and the keyring rewritten, then proved, no cordon, no reboot"
	}

	return " loads registry auth only at boot: the config written live (every later boot takes it) and the kubelet's keyring given the credential, " +
		"which the kubelet sends with every pull and containerd uses before its own — proved, no cordon, no drain, no reboot, no restart"
}

// keyringUnusable says why the kubelet keyring cannot carry the credential on a node where it is
// configured (a clause to append, "" when it can, or is not configured).
func keyringUnusable(n Node, in Input) string {
	if in.Keyring == nil || n.Talos == nil {
		return ""
	}

	if why, failed := in.Keyring.Failed[n.Name]; failed {
		return "; its kubelet keyring is not used again: an earlier run of this revision wrote it and did not prove it (" + why + "), so a reboot loads the credential"
	}

	if dir := n.Talos.KubeletRootDir; dir != "" && in.Keyring.RootDirs != nil && !slices.Contains(in.Keyring.RootDirs, dir) {
		return "; its kubelet keyring is not used: its kubelet keeps its root directory in " + dir + ", which is not in nodes.kubelet_keyring.root_dirs " +
			"(the writer pod's admission policy mounts no other folder)"
	}

	if m := untrustedMirrors(n.Talos.Mirrors, in.Keyring.TrustedMirrors); len(m) > 0 {
		return "; its kubelet keyring is not used: its containerd pulls " + in.Registry + " through the mirror " + strings.Join(m, ", ") +
			", which would receive the keyring's credential with every pull (the kubelet sends it with no server address, and containerd hands it to every endpoint)" +
			" — list it in nodes.kubelet_keyring.trusted_mirrors if that is meant"
	}

	return ""
}

// untrustedMirrors are the mirrors not in trusted.
func untrustedMirrors(mirrors, trusted []string) []string {
	var out []string

	for _, m := range mirrors {
		if !slices.Contains(trusted, m) {
			out = append(out, m)
		}
	}

	return out
}

// talosUsable is the node's Talos version, or why its Talos cannot be acted on (the reason and
// its sentence): unreachable, a version ghcrsync cannot read or does not support, or a change
// its Talos refuses.
func talosUsable(n Node) (TalosVersion, Reason, string) {
	if n.Talos == nil {
		detail := n.TalosError
		if detail == "" {
			detail = "no facts"
		}

		return TalosVersion{}, ReasonTalosUnreachable, ReasonTalosUnreachable.Sentence(detail)
	}

	version, err := ParseTalosVersion(n.Talos.Version)

	switch {
	case err != nil:
		return version, ReasonUnclassifiable, ReasonUnclassifiable.Sentence(err.Error())
	case !version.AtLeast(TalosMinimum):
		return version, ReasonTalosUnsupported, ReasonTalosUnsupported.Sentence("Talos " + n.Talos.Version)
	case n.Talos.DryRunRefused != "":
		return version, ReasonTalosRefuses, ReasonTalosRefuses.Sentence(n.Talos.DryRunRefused)
	}

	return version, "", ""
}

// keyringClause says, of a node in sync, that its kubelet's keyring carries the credential.
func keyringClause(n Node) string {
	if n.Keyring == "" {
		return ""
	}

	return "; its kubelet keyring holds it, and its containerd loads it from the Talos config at its next boot"
}

// staleBehindValidConfig are the stale runtimes whose config holds no refused credential: the
// config says they can pull, their runtime may not.
func staleBehindValidConfig(p *Plan) []string {
	var out []string

	for _, name := range p.StaleRuntimes {
		if !slices.ContainsFunc(p.Refused(), func(u CredentialInUse) bool { return slices.Contains(u.Nodes, name) }) {
			out = append(out, name)
		}
	}

	return out
}

// staleRuntimes are the nodes (of the fleet and outside it) whose runtime has not loaded the
// credential their config holds: their runtime started before the config last changed (a live
// reload, Talos 1.14's, is a restart of the runtime too), and no proof on this boot says
// otherwise.
func staleRuntimes(s Snapshot, in Input) []string {
	var out []string

	for _, n := range slices.Concat(s.Nodes, s.Outside) {
		if n.Talos == nil || n.Talos.ConfiguredDigest == "" {
			continue
		}

		if _, err := ParseTalosVersion(n.Talos.Version); err != nil {
			continue
		}

		// Talos 1.14 loads registry auth live by restarting the runtime when its rendered
		// config changes: the same evidence as a reboot's, a runtime started after the config.
		loaded := n.Talos.CRIStarted.After(n.Talos.ConfigUpdated) ||
			n.Talos.ConfiguredDigest == in.AuthDigest && n.VerifiedRevision == in.CredentialRevision && n.VerifiedBoot != "" && n.VerifiedBoot == n.BootID
		if !loaded {
			out = append(out, n.Name)
		}
	}

	return out
}

// runtimeProof says why a node whose config carries the credential is known to use it ("" if
// nothing proves it). Whatever its Talos version: a live reload (1.14) is a runtime restart a
// moment after the write, and until then the runtime pulls with what it started with.
func runtimeProof(n Node, in Input) string {
	switch {
	case n.VerifiedRevision == in.CredentialRevision && n.VerifiedBoot != "" && n.VerifiedBoot == n.BootID:
		// A marker is about the boot it was taken on: after another boot, the runtime's start
		// (below) is the proof, not the marker.
		// A marker without a boot id says nothing of the boot running now.
		return "its runtime was verified by ghcrsync on boot " + human.Short(n.VerifiedBoot)
	case !n.Talos.CRIStarted.IsZero() && n.Talos.CRIStarted.After(n.Talos.ConfigUpdated):
		return "its container runtime started at " + human.Clock(n.Talos.CRIStarted) + ", after its config last changed at " + human.Clock(n.Talos.ConfigUpdated)
	}

	return ""
}

// TalosVersion is a Talos release line (major.minor).
type TalosVersion struct{ Major, Minor int }

// What Talos versions can do, stated once: the planner, the verdict and the docs use these.
var (
	// TalosMinimum is the first Talos with the RegistryAuthConfig document ghcrsync writes;
	// an older node cannot take it, and is never claimed.
	TalosMinimum = TalosVersion{1, 12}
	// TalosLiveRegistryAuth is the first Talos that reloads registry auth without a reboot.
	TalosLiveRegistryAuth = TalosVersion{1, 14}
)

func (v TalosVersion) String() string { return fmt.Sprintf("v%d.%d", v.Major, v.Minor) }

// AtLeast reports whether v is o or later.
func (v TalosVersion) AtLeast(o TalosVersion) bool {
	return v.Major > o.Major || (v.Major == o.Major && v.Minor >= o.Minor)
}

// ParseTalosVersion reads "v1.13.9" (or "1.13", "v1.14.0-alpha.1"). An unparsable version is an
// error: callers fail closed.
func ParseTalosVersion(version string) (TalosVersion, error) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return TalosVersion{}, fmt.Errorf("unknown Talos version %q", version)
	}

	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])

	if err1 != nil || err2 != nil {
		return TalosVersion{}, fmt.Errorf("unknown Talos version %q", version)
	}

	return TalosVersion{major, minor}, nil
}

func endpointOf(n Node, host string) bool {
	return host != "" && slices.Contains(n.Addresses, host)
}

// order numbers the nodes acted on: live updates first (no cordon, no reboot: any role, in
// parallel), then fenced workers, the emptiest first (the fewer pods an early drain evicts, the
// fewer land on nodes drained later), then fenced control planes one at a time, the API
// endpoint's node last; the rest follow, by name.
func order(nodes []NodePlan) {
	const rest = 4

	rank := func(n NodePlan) int {
		switch {
		case n.Action.InPlace():
			return 0
		case n.Action != ActionFence:
			return rest
		case n.Role != RoleControlPlane:
			return 1
		case n.Endpoint:
			return 3
		}

		return 2
	}

	sort.SliceStable(nodes, func(i, j int) bool {
		ri, rj := rank(nodes[i]), rank(nodes[j])
		if ri != rj {
			return ri < rj
		}

		if ri == 1 && nodes[i].Pods != nodes[j].Pods {
			return nodes[i].Pods < nodes[j].Pods
		}

		return nodes[i].Name < nodes[j].Name
	})

	for i := range nodes {
		if rank(nodes[i]) < rest {
			nodes[i].Order = i + 1
		}
	}
}

// summarize counts the plan's actions on nodes, pull secrets and node templates.
func summarize(nodes []NodePlan, secrets []SecretPlan, templates []TemplatePlan) Summary {
	var s Summary

	for _, n := range nodes {
		switch n.Action {
		case ActionFence:
			s.Fence++
		case ActionApplyLive:
			s.ApplyLive++
		case ActionKeyring:
			s.Keyring++
		case ActionNoOp:
			s.Unchanged++
		case ActionDeselect:
			s.Deselected++
		}
	}

	for _, sp := range secrets {
		switch sp.Action {
		case SecretCreate:
			s.SecretsCreate++
		case SecretUpdate:
			s.SecretsUpdate++
		case SecretNoOp:
			s.SecretsUnchanged++
		case SecretSkip:
			s.SecretsSkipped++
		}
	}

	for _, tp := range templates {
		switch tp.Action {
		case TemplateUpdate:
			s.TemplatesUpdate++
		case TemplateRestart:
			s.TemplatesRestart++
		default:
			s.TemplatesUnchanged++
		}
	}

	return s
}

func actsOnControlPlanes(p *Plan) bool {
	for _, n := range p.Nodes {
		if n.Role == RoleControlPlane && (n.Action == ActionFence || n.Action == ActionApplyLive) { // a keyring write restarts nothing
			return true
		}
	}

	return false
}

// drainPredictions says, for each node the plan fences, what its drain will meet, and how many
// of those stop it: a budget that allows no disruption now and a pod with no controller hold it
// (apply's drain waits, then fails after nodes.drain_timeout and restores the node); emptyDir
// data is lost.
func drainPredictions(p *Plan, wait bool) (out []string, holds int) {
	for _, np := range p.Nodes {
		for _, b := range np.Blockers {
			if b.Holds() {
				holds++
			}

			switch b.Kind {
			case BlockerBudget:
				if b.OnNode > 0 {
					out = append(out, fmt.Sprintf("%s's drain will be held: it carries %d pods of PodDisruptionBudget %s, which allows %d disruption(s) now, and no other "+
						"Ready, schedulable node takes their replacements (taints, cordons, node selectors), so pod %s waits for one that cannot become ready; "+
						"the drain fails after nodes.drain_timeout and the node is restored. Make room for one more replica elsewhere (or lower the budget's "+
						"minAvailable for the rotation), then plan again", np.Name, b.OnNode, b.Budget, b.Allowed, b.Pod))

					continue
				}

				if b.NeedsAction() && wait {
					out = append(out, fmt.Sprintf("%s's drain will wait: pod %s is held by PodDisruptionBudget %s, which allows 0 disruptions now and needs an action "+
						"(it never frees by itself): %s; apply waits nodes.drain_timeout for someone to act (maintenance.held_drain = \"wait\"), "+
						"then fails and restores the node", np.Name, b.Pod, b.Budget, b.Action))

					continue
				}

				if b.NeedsAction() {
					out = append(out, fmt.Sprintf("%s's drain is held by a budget that needs an action (it never frees by itself): %s; apply defers the node "+
						"rather than wait nodes.drain_timeout", np.Name, b.Action))

					continue
				}

				out = append(out, fmt.Sprintf("%s's drain will wait: pod %s is held by PodDisruptionBudget %s, which allows 0 disruptions now; "+
					"it frees as its workload's replacements become ready, and unless one does, the drain fails after nodes.drain_timeout and the node is restored",
					np.Name, b.Pod, b.Budget))
			case BlockerBare:
				out = append(out, fmt.Sprintf("%s's drain will refuse pod %s: it has no controller, so nothing would recreate it; move or delete it first", np.Name, b.Pod))
			case BlockerEmptyDir:
				out = append(out, fmt.Sprintf("%s's drain evicts pod %s, and its emptyDir data (%s) is lost", np.Name, b.Pod, strings.Join(b.Volumes, ", ")))
			}
		}
	}

	return out, holds
}

func warnings(p *Plan, s Snapshot, in Input) []string {
	w := credentialWarnings(p, in)
	w = append(w, controlPlaneWarnings(p, s, in)...)
	w = append(w, probeArchWarnings(p, s)...)

	if hidden := staleBehindValidConfig(p); p.Emergency() && len(hidden) > 0 {
		w = append(w, fmt.Sprintf("Emergency: the container runtime of %s has not loaded the credential its Talos config holds (it started before the "+
			"config last changed, and its Talos loads none live): it still pulls with what it booted with, which may be the refused credential, "+
			"so no evicted pod is sent there (hard steering) until it is rotated.", describe(UseNode, hidden)))
	}

	w = append(w, secretWarnings(s)...)

	if len(s.Templates) == 0 {
		w = append(w, noTemplateWarning)
	}

	w = append(w, staleReaderWarnings(p.Templates)...)

	if l := s.Lease; l != nil && l.Holder != "" {
		w = append(w, fmt.Sprintf("Lease %s/%s is held by %s (%s, duration %ds): apply will refuse to start until it is released; inspect it with `ghcrsync fences`.",
			l.Namespace, l.Name, l.Holder, human.Renewed(l.RenewTime, s.TakenAt), l.DurationSeconds))
	}

	return w
}

// credentialWarnings are the credentials' own: its proof skipped or waited for, its expiry near,
// an old credential in use that pulls only in part or cannot be asked.
func credentialWarnings(p *Plan, in Input) []string {
	var w []string

	if in.ProofSkipped {
		w = append(w, "The credential was not proved against the registry (--skip-proof).")
	}

	if in.ProofRetries != "" {
		w = append(w, "The registry was in passing trouble while the credential was proved ("+in.ProofRetries+"); it was proved once the registry answered.")
	}

	if p.CredentialExpiring() {
		left := p.CredentialExpiresAt.Sub(p.CreatedAt)
		w = append(w, fmt.Sprintf("The new credential expires at %s (in %s, as the registry reports it): every node, pull secret and template will hold a "+
			"credential that stops working then; make its successor and rotate again before that.",
			p.CredentialExpiresAt.UTC().Format(time.RFC3339), human.Days(left)))
	}

	for _, u := range p.CredentialsInUse {
		switch u.State {
		case CredentialUnreachable:
			w = append(w, "In use: "+u.Sentence()+"; whether it still pulls is unknown.")
		case CredentialPartial:
			w = append(w, "In use: "+u.Sentence()+"; it pulls the other packages, so this is no emergency: grant it the package(s) "+
				"or rotate them off it before it is needed.")
		}
	}

	return w
}

// secretWarnings are the pull secrets': contested, moved between credentials, outside the roles.
func secretWarnings(s Snapshot) []string {
	var w []string

	for _, sec := range s.Secrets {
		if len(sec.Contested) > 0 {
			w = append(w, "Pull secret of several credentials: "+sec.ContestedSentence()+".")
		}

		if sec.Moved && !sec.MoveDeclared {
			w = append(w, "Namespace moved between credentials: "+sec.MoveSentence()+".")
		}

		if sec.OutsideRoles {
			w = append(w, "Consumer outside the roles: "+sec.OutsideRolesSentence()+" (`ghcrsync rbac --config FILE`, then apply its output).")
		}
	}

	return w
}

// controlPlaneWarnings are what fencing the control planes and the API endpoint's node costs.
func controlPlaneWarnings(p *Plan, s Snapshot, in Input) []string {
	var w []string

	controlPlanes := 0

	for _, n := range s.Nodes {
		if n.ControlPlane {
			controlPlanes++
		}
	}

	for _, n := range p.Nodes {
		if n.Endpoint && n.Action == ActionFence {
			w = append(w, fmt.Sprintf("%s serves the kubeconfig's API endpoint %s and the kubeconfig has no other endpoint: "+
				"it is fenced last, the API is unreachable while it reboots, and apply reconnects when it is back.", n.Name, s.APIEndpoint))
		}
	}

	if controlPlanes == 1 && p.Summary.Fence > 0 {
		w = append(w, "This cluster has a single control plane: its Kubernetes API goes away while that node reboots.")
	}

	if actsOnControlPlanes(p) && controlPlanes < MinOtherVoters+1 && !in.AllowQuorumLoss {
		w = append(w, fmt.Sprintf("This cluster has %d control plane(s): etcd keeps its quorum through one member's reboot or live update "+
			"only with %d other healthy voters, so apply will not take them down unless nodes.allow_quorum_loss = true.", controlPlanes, MinOtherVoters))
	}

	if p.EndpointNode == "" && s.APIEndpoint != "" {
		w = append(w, fmt.Sprintf("The API endpoint %s is not a node address (a VIP or load balancer): no node is held back for it.", s.APIEndpoint))
	}

	return w
}

// inUse orders the credentials in use: refused first, then unreachable, then valid; by digest.
func inUse(uses []CredentialInUse) []CredentialInUse {
	out := slices.Clone(uses)
	rank := map[string]int{CredentialRefused: 0, CredentialUnreachable: 1, CredentialPartial: 2, CredentialValid: 3}

	sort.SliceStable(out, func(i, j int) bool {
		if rank[out[i].State] != rank[out[j].State] {
			return rank[out[i].State] < rank[out[j].State]
		}

		return out[i].Digest < out[j].Digest
	})

	return out
}

// Refused are the credentials in use, other than the new one, that the registry refused: the
// nodes and secrets holding them cannot pull new images already.
func (p *Plan) Refused() []CredentialInUse {
	var out []CredentialInUse

	for _, u := range p.CredentialsInUse {
		if u.State == CredentialRefused && !u.Desired {
			out = append(out, u)
		}
	}

	return out
}

// Emergency reports an emergency rotation: a credential in use is refused by the registry.
func (p *Plan) Emergency() bool { return len(p.Refused()) > 0 }

// Sentence says where a credential in use is and what the registry said of it.
func (u CredentialInUse) Sentence() string {
	var where []string

	if len(u.Nodes) > 0 {
		where = append(where, describe(UseNode, u.Nodes))
	}

	if len(u.Secrets) > 0 {
		where = append(where, describe(UseSecret, u.Secrets))
	}

	subject := "the credential " + human.Short(u.Digest) + " on " + strings.Join(where, " and ")
	if u.Credential != "" {
		subject = "the " + u.Credential + " credential " + human.Short(u.Digest) + " on " + strings.Join(where, " and ")
	}

	switch u.State {
	case CredentialRefused:
		return subject + " is refused by the registry: their runtimes cannot pull new images (" + u.Detail + ")"
	case CredentialUnreachable:
		return subject + " could not be checked against the registry (" + u.Detail + ")"
	case CredentialPartial:
		return subject + " is denied " + strings.Join(u.Denied, ", ") + " by the registry (never granted that package) and pulls the others"
	}

	return subject + " is accepted by the registry"
}
