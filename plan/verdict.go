package plan

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/human"
)

// A rotation is done for one reason: so the old credential can be revoked. The verdict answers
// "what would break if it were revoked now?" from the cluster as it is — every node, pull
// secret, node template and the root Flux secret — never from a plan: a node that joined late,
// one left deselected, a consumer another controller owns or one reverted after its write is
// still a user of the old credential, and the verdict says so.

// UseState is what one object's credential is.
type UseState string

const (
	// UseNew: it holds the new credential, with a proof the planner accepts (a node: its
	// runtime loaded it).
	UseNew UseState = "new"
	// UseOld: it still holds, or its runtime still uses, another credential.
	UseOld UseState = "old"
	// UseUnknown: what it uses could not be read: it counts as old.
	UseUnknown UseState = "unknown"
)

// Use kinds.
const (
	UseNode     = "node"
	UseSecret   = "pull-secret"
	UseRoot     = "root"
	UseTemplate = "node-template"
	UseFleet    = "fleet"
	// UseUnmanaged is a pull secret pods use for the registry's images that ghcrsync does not
	// manage (and, holding no right to read it, cannot inspect).
	UseUnmanaged = "unmanaged-pull-secret"
	// UseProvisioning is machines an autoscaler node group is creating, not Nodes yet: made from
	// the template as the autoscaler read it, they may boot with the old credential.
	UseProvisioning = "provisioning"
	// UseFluxSource is Flux's root source (its OCIRepository) when Flux could not pull with the
	// new root credential (flux_root.prove): not a use of the old credential, but a cluster whose
	// deploys stop when it is revoked is not one where revoking it is safe.
	UseFluxSource = "flux-source"
)

// Use is one object and the credential it uses.
type Use struct {
	Kind  string   `json:"kind"`
	Name  string   `json:"name"`
	State UseState `json:"state"`
	// Holds is the digest of what it holds ("" unknown or none): a node's and a template's auth
	// digest, a pull secret's revision.
	Holds string `json:"holds,omitempty"`
	Why   string `json:"why"`
	// Next is what a person must do about an old use ghcrsync cannot fix itself.
	Next string `json:"next,omitempty"`
}

// Revocation is the verdict on revoking the old credential: who uses which credential, and whether revoking the old one breaks nothing.
type Revocation struct {
	// Credential names the credential judged when the configuration has several ("" with one);
	// Tenant is true for a tenant credential's verdict (its pull secrets only).
	Credential string `json:"credential,omitempty"`
	Tenant     bool   `json:"tenant,omitempty"`
	// Scope is what the verdict judged: every Node of the cluster (""), or only those
	// nodes.selector selects (ScopeSelected, a setting of the configuration).
	Scope string `json:"scope,omitempty"`
	// Revision is the new credential's revision.
	Revision     string `json:"revision"`
	SafeToRevoke bool   `json:"safe_to_revoke"`
	New          int    `json:"new"`
	Old          int    `json:"old"`
	Unknown      int    `json:"unknown"`
	// Uses lists every object: the old and unknown ones first.
	Uses []Use `json:"uses"`
	// Tenants are the verdicts on the tenant credentials' old credentials, one each (several
	// credential blocks): each judges its own pull secrets.
	Tenants []Revocation `json:"tenants,omitempty"`
}

// Clean reports whether every credential's old one is safe to revoke: the cluster credential's
// and each tenant's.
func (v Revocation) Clean() bool {
	for _, t := range v.Tenants {
		if !t.SafeToRevoke {
			return false
		}
	}

	return v.SafeToRevoke
}

// All are the verdicts of every credential: the cluster credential's, then each tenant's.
func (v Revocation) All() []Revocation {
	own := v
	own.Tenants = nil

	return append([]Revocation{own}, v.Tenants...)
}

// Inventory is the verdict of a snapshot: every node (judged by the planner's own rule: in sync
// with a proof it accepts, or not), every configured pull secret (consumers and the root) and
// every node template. An empty fleet is no proof of anything: it is an unknown use.
func Inventory(s Snapshot, in Input) Revocation {
	v := Revocation{Revision: in.CredentialRevision, Credential: in.Credential}

	if len(s.Nodes) == 0 {
		v.add(Use{Kind: UseFleet, Name: "nodes", State: UseUnknown,
			Why: "no Node matches nodes.selector: an empty inventory proves nothing", Next: "check nodes.selector and the kubeconfig's cluster"})
	}

	problems := IdentityProblems(s)

	for _, n := range s.Nodes {
		v.add(nodeUse(n, in, problems[n.Name]))
	}

	if in.SelectedVerdict {
		v.Scope = ScopeSelected
	} else {
		for _, n := range s.Outside {
			v.add(outsideUse(n, in, problems[n.Name]))
		}
	}

	for _, sec := range s.Secrets {
		if !sec.JudgedBy("") {
			continue // a tenant's: judged in its own verdict
		}

		if u, ok := secretUse(sec, in.PullSecretRevision, in.rotationStarted()); ok {
			v.add(u)
		}
	}

	for _, t := range s.Templates {
		v.add(templateUse(t, in.AuthDigest))
	}

	for _, u := range unmanagedUses(s, in.Registry) {
		v.add(u)
	}

	for _, g := range s.Autoscaler.Provisioning() {
		v.add(Use{Kind: UseProvisioning, Name: g.Name, State: UseUnknown,
			Why: fmt.Sprintf("autoscaler node group %s is creating %d %s (target %d, %d registered as Nodes): not Nodes yet, they boot from the "+
				"template as the autoscaler read it, which may hold the old credential", g.Name, g.Provisioning(), human.Plural(g.Provisioning(), "machine", "machines"),
				g.Target, g.Registered),
			Next: "wait until they join (apply rotates a machine that joins during its run), then run plan again"})
	}

	v.sortUses()
	v.SafeToRevoke = v.Old == 0 && v.Unknown == 0

	for _, t := range in.Tenants {
		v.Tenants = append(v.Tenants, tenantInventory(s, in, t))
	}

	return v
}

// tenantInventory is the verdict on a tenant's old credential: its pull secrets, each judged
// as the cluster credential's are.
func tenantInventory(s Snapshot, in Input, t TenantRotation) Revocation {
	v := Revocation{Credential: t.Name, Tenant: true, Revision: t.Revision}

	for _, sec := range s.Secrets {
		if !sec.JudgedBy(t.Name) {
			continue
		}

		if u, ok := secretUse(sec, t.Revision, in.rotationStarted()); ok {
			v.add(u)
		}
	}

	v.sortUses()
	v.SafeToRevoke = v.Old == 0 && v.Unknown == 0

	return v
}

// RootNotProved is v with Flux's root source (namespace/name) unable to pull with the new root
// credential, and why: the old credential is then not safe to revoke, whatever else holds it.
func (v Revocation) RootNotProved(source, why string) Revocation {
	v.Uses = slices.Clone(v.Uses)
	v.add(Use{Kind: UseFluxSource, Name: source, State: UseUnknown, Why: "Flux could not pull with the new root credential: " + why,
		Next: "see the OCIRepository's Ready condition (flux get sources oci -A); the root secret holds the new credential: fix what refuses it, or write the old one back, before revoking"})
	v.SafeToRevoke = false
	v.sortUses()

	return v
}

// sortUses puts the old and unknown uses first, by kind.
func (v *Revocation) sortUses() {
	rank := map[UseState]int{UseOld: 0, UseUnknown: 1, UseNew: 2}
	kinds := map[string]int{UseFleet: 0, UseNode: 1, UseProvisioning: 2, UseTemplate: 3, UseSecret: 4, UseUnmanaged: 5, UseRoot: 6, UseFluxSource: 7}
	sort.SliceStable(v.Uses, func(i, j int) bool {
		a, b := v.Uses[i], v.Uses[j]
		if rank[a.State] != rank[b.State] {
			return rank[a.State] < rank[b.State]
		}

		return kinds[a.Kind] < kinds[b.Kind]
	})
}

func (v *Revocation) add(u Use) {
	switch u.State {
	case UseNew:
		v.New++
	case UseOld:
		v.Old++
	default:
		v.Unknown++
	}

	v.Uses = append(v.Uses, u)
}

// unmanagedUses are the pull secrets pods reference for registry's images that are neither a
// managed consumer nor the root: what they hold is unknown, and counts as old.
func unmanagedUses(s Snapshot, registry string) []Use {
	managed := map[string]bool{}
	for _, sec := range s.Secrets {
		managed[sec.Namespace+"/"+sec.Name] = true
	}

	var out []Use

	for _, r := range s.PullSecretRefs {
		where := r.Namespace + "/" + r.Name
		if managed[where] {
			continue
		}

		out = append(out, Use{Kind: UseUnmanaged, Name: where, State: UseUnknown,
			Why: fmt.Sprintf("%s, used by %d %s pulling from %s (%s), is not managed by ghcrsync: what it holds is not read", where, r.Pods,
				human.Plural(r.Pods, "pod", "pods"), registry, strings.Join(r.Examples, ", ")),
			Next: "add its namespace to the consumers (the consumer selector's label, or a consumer block), or confirm it holds the new credential"})
	}

	return out
}

// ScopeSelected is a verdict narrowed to the nodes nodes.selector selects (nodes.verdict).
const ScopeSelected = "selected"

// outsideUse is a Node nodes.selector leaves out: judged by the same rule, and, when it is not on
// the new credential, named as outside what ghcrsync rotates.
func outsideUse(n Node, in Input, identity string) Use {
	u := nodeUse(n, in, identity)
	if u.State == UseNew {
		return u
	}

	u.Why = "outside nodes.selector, so ghcrsync does not rotate it: " + u.Why
	if u.Next == "" || u.State == UseOld {
		u.Next = "widen nodes.selector to take it in (or rotate its Talos config yourself), then run plan again; " +
			"or, if it is meant to keep another credential, narrow the verdict with nodes.verdict = \"selected\""
	}

	return u
}

// nodeUse: new exactly when the planner would leave the node alone as in sync (its config
// carries the credential and its runtime provably loaded it).
func nodeUse(n Node, in Input, identity string) Use {
	u := Use{Kind: UseNode, Name: n.Name, State: UseOld}

	if identity != "" {
		u.State, u.Why = UseUnknown, ReasonInvalidInventory.Sentence(identity)
		u.Next = "fix the Node's addresses (the kubelet's --node-ip), then run plan again"

		return u
	}

	if n.Talos == nil {
		u.State, u.Why = UseUnknown, "its Talos API could not be read: "+orNone(n.TalosError)
		u.Next = "make its Talos API reachable, then run plan again"

		return u
	}

	u.Holds = n.Talos.ConfiguredDigest

	action, reason, sentence := needs(n, in)

	switch {
	case action == ActionNoOp && reason == ReasonInSync:
		u.State, u.Why = UseNew, sentence
	case action == ActionDeselect && reason == ReasonTalosUnsupported:
		u.Why = sentence // it keeps the credential it has
		u.Next = "upgrade its Talos to " + TalosMinimum.String() + " or later, then run plan again"
	case action == ActionDeselect:
		u.State, u.Why = UseUnknown, sentence
	default:
		u.Why = sentence
	}

	if u.State != UseNew {
		switch {
		case slices.Contains(in.Exclude, n.Name):
			u.Why += "; it is excluded by nodes.exclude"
			u.Next = "rotate it yourself, or remove it from nodes.exclude"
		case n.Name == in.SelfNode:
			u.Why += "; ghcrsync runs on it"
			u.Next = "run ghcrsync from another node to rotate it"
		case n.Deleting != nil:
			u.Why += "; it is being deleted"
		}
	}

	return u
}

// secretUse: a pull secret is new when it holds the pull-secret revision, whoever manages it; a
// missing namespace has nothing to use (ok is false). One that holds another credential, which
// another field manager wrote after the rotation began (since), names that writer: it puts the
// old credential back.
func secretUse(s SecretObs, revision string, since time.Time) (Use, bool) {
	kind := UseSecret
	if s.Role == RoleRoot {
		kind = UseRoot
	}

	where := s.Namespace + "/" + s.Name
	u := Use{Kind: kind, Name: where, Holds: s.Digest}

	switch {
	case s.OutsideRoles:
		u.State, u.Why = UseUnknown, s.OutsideRolesSentence()
		u.Next = "render the roles with `ghcrsync rbac --config FILE`, apply them, and run ghcrsync again"

		return u, true
	case len(s.Contested) > 0:
		u.State, u.Why = UseUnknown, s.ContestedSentence()
		u.Next = "make one credential's consumers name it, then run ghcrsync again"

		return u, true
	case s.Moved && !s.MoveDeclared:
		u.State, u.Why = UseUnknown, s.MoveSentence()
		u.Next = "render the roles with `ghcrsync rbac --config FILE`, review and apply them (or restore the namespace's labels), and run ghcrsync again"

		return u, true
	case s.NamespaceMissing:
		return u, false
	case !s.Exists:
		u.State, u.Why = UseNew, where+" does not exist: nothing uses a credential through it"

		if s.Role == RoleRoot {
			u.State, u.Why = UseOld, where+" does not exist: Flux cannot pull with the new credential"
		}
	case s.Digest == revision:
		u.State, u.Why = UseNew, where+" holds credential revision "+human.Short(revision)
	case s.Type != "" && s.Type != "kubernetes.io/dockerconfigjson":
		u.State, u.Why = UseUnknown, fmt.Sprintf("%s is of type %s: what it holds is not a pull credential ghcrsync can read", where, s.Type)
		u.Next = "make it a kubernetes.io/dockerconfigjson Secret, or remove it from the configuration"
	default:
		u.State, u.Why = UseOld, fmt.Sprintf("%s holds another credential (%s)", where, human.ShortOrNone(s.Digest))

		if w, ok := putBack(s.Writers, since); ok && s.Foreign == "" {
			u.Why += fmt.Sprintf("; %s wrote it at %s, after this rotation began: it puts an old credential back", w.Manager, human.Clock(w.At))
			u.Next = "stop " + w.Manager + " writing " + where + " (or give it the new credential), then run ghcrsync again"
		}
	}

	if s.Foreign != "" && u.State != UseNew {
		u.Why += "; it is managed by " + s.Foreign + ", so ghcrsync does not write it"
		u.Next = "update the source " + s.Foreign + " reads it from to the new credential"
	}

	return u, true
}

func templateUse(t TemplateObs, authDigest string) Use {
	u := Use{Kind: UseTemplate, Name: t.Where(), Holds: t.Digest, State: UseOld}

	stale := t.StaleReader()

	switch {
	case t.Digest == authDigest && stale != "" && t.Restart == "":
		u.State, u.Why = UseUnknown, "it holds the new credential, but "+stale
		u.Next = "set restart_deployment on its node_template block so apply restarts its reader and can check it did"
	case t.Digest == authDigest && stale != "":
		u.Why = "it holds the new credential, but " + stale
		ns, name, _ := strings.Cut(t.Restart, "/")
		u.Next = "run apply again (it restarts " + t.Restart + "), or: kubectl -n " + ns + " rollout restart deployment " + name
	case t.Digest == authDigest:
		u.State, u.Why = UseNew, "machines created from it join with the new credential"
	case t.Digest == "":
		u.Why = "it carries no credential for the registry"
	default:
		u.Why = "machines created from it join with another credential (" + human.Short(t.Digest) + ")"
	}

	if t.OutsidePools && u.State != UseNew {
		u.Why = "a pool node_template " + strconv.Quote(t.Name) + " does not list in pools, so ghcrsync does not write it: " + u.Why
		u.Next = "add " + strconv.Quote(t.Pool) + " to the pools of node_template " + strconv.Quote(t.Name) + ", then plan and apply again"
	}

	return u
}

// Still lists the uses of the old credential (old and unknown), kind first.
func (v Revocation) Still() []Use {
	var out []Use

	for _, u := range v.Uses {
		if u.State != UseNew {
			out = append(out, u)
		}
	}

	return out
}

// Among are those of the uses in of that are also in uses (by kind and name): what a plan leaves of one
// credential's.
func Among(uses, of []Use) []Use {
	var out []Use

	for _, u := range of {
		for _, x := range uses {
			if x.Kind == u.Kind && x.Name == u.Name {
				out = append(out, x)

				break
			}
		}
	}

	return out
}

// stillAll are the uses of every credential's old one.
func (v Revocation) stillAll() []Use {
	var out []Use
	for _, c := range v.All() {
		out = append(out, c.Still()...)
	}

	return out
}

// Except is the verdict without the uses of one kind (the root, before it is written).
func (v Revocation) Except(kind string) Revocation {
	out := Revocation{Revision: v.Revision, Scope: v.Scope, Credential: v.Credential, Tenant: v.Tenant}

	for _, u := range v.Uses {
		if u.Kind != kind {
			out.add(u)
		}
	}

	out.SafeToRevoke = out.Old == 0 && out.Unknown == 0

	return out
}

// Sentence is the verdict in words: a tenant's of its pull secrets; with several credentials,
// each one's, by name.
func (v Revocation) Sentence() string {
	switch {
	case v.Tenant:
		return v.tenantSentence()
	case len(v.Tenants) == 0:
		return v.own()
	}

	parts := []string{v.Credential + ": " + v.own()}
	for _, t := range v.Tenants {
		parts = append(parts, t.Credential+": "+t.Sentence())
	}

	return strings.Join(parts, " ")
}

// tenantSentence is a tenant credential's verdict in words.
func (v Revocation) tenantSentence() string {
	if v.SafeToRevoke {
		return fmt.Sprintf("safe to revoke its old credential: all %d of its pull secrets hold revision %s.", v.New, human.Short(v.Revision))
	}

	return "do not revoke its old credential yet: it is still used by " + v.StillUsedBy() + "."
}

// own is one credential's verdict in words.
func (v Revocation) own() string {
	if v.SafeToRevoke && v.Scope == ScopeSelected {
		return fmt.Sprintf("The old credential is no longer used by any node nodes.selector selects, pull secret, node template or the root "+
			"Flux secret: all %d hold revision %s. It is safe to revoke as far as those go: nodes outside nodes.selector were not judged "+
			"(nodes.verdict = \"selected\").", v.New, human.Short(v.Revision))
	}

	if v.SafeToRevoke {
		return fmt.Sprintf("The old credential is no longer used by any Node of the cluster, pull secret, node template or the root Flux secret: "+
			"all %d hold revision %s. It is safe to revoke.", v.New, human.Short(v.Revision))
	}

	return "Do not revoke the old credential yet: it is still used by " + v.StillUsedBy() + "."
}

// StillUsedBy names the uses of the old credential, by kind ("2 nodes (a, b); 1 pull secret
// (ns/x)").
func (v Revocation) StillUsedBy() string {
	counts := map[string][]string{}
	order := []string{UseFleet, UseNode, UseProvisioning, UseSecret, UseUnmanaged, UseTemplate, UseRoot, UseFluxSource}

	for _, u := range v.Still() {
		counts[u.Kind] = append(counts[u.Kind], u.Name)
	}

	var parts []string

	for _, k := range order {
		if names := counts[k]; len(names) > 0 {
			parts = append(parts, describe(k, names))
		}
	}

	return strings.Join(parts, "; ")
}

func describe(kind string, names []string) string {
	const most = 5

	shown := names
	if len(shown) > most {
		shown = append(slices.Clone(names[:most]), fmt.Sprintf("%d more", len(names)-most))
	}

	what := map[string][2]string{
		UseFleet:        {"the fleet", "the fleet"},
		UseNode:         {"node", "nodes"},
		UseSecret:       {"pull secret", "pull secrets"},
		UseTemplate:     {"node template", "node templates"},
		UseRoot:         {"the root Flux secret", "the root Flux secrets"},
		UseUnmanaged:    {"pull secret ghcrsync does not manage", "pull secrets ghcrsync does not manage"},
		UseProvisioning: {"autoscaler node group still provisioning", "autoscaler node groups still provisioning"},
	}[kind]

	switch kind {
	case UseFleet:
		return "an empty fleet (no Node matches nodes.selector)"
	case UseRoot:
		return what[0] + " " + strings.Join(shown, ", ")
	case UseFluxSource:
		return "Flux's root source " + strings.Join(shown, ", ") + ", which could not pull with the new root credential"
	}

	noun := what[0]
	if len(names) != 1 {
		noun = what[1]
	}

	return fmt.Sprintf("%d %s (%s)", len(names), noun, strings.Join(shown, ", "))
}

func orNone(s string) string {
	if s == "" {
		return "no facts"
	}

	return s
}

// Leaves lists the uses of the old credential the plan does not act on: what would still use it
// after an apply that did everything planned (a node left alone, a consumer another controller
// owns). Empty when the plan, carried out, leaves nothing on the old credential.
func (p *Plan) Leaves() []Use {
	if p.Verdict == nil {
		return nil
	}

	acts, alone := map[string]bool{}, map[string]string{}

	for _, n := range p.Nodes {
		switch n.Action {
		case ActionFence, ActionApplyLive, ActionKeyring:
			acts[UseNode+" "+n.Name] = true
		case ActionDeselect:
			alone[n.Name] = n.Sentence
		}
	}

	for _, s := range p.Secrets {
		if s.Action == SecretCreate || s.Action == SecretUpdate {
			kind := UseSecret
			if s.Role == RoleRoot {
				kind = UseRoot
			}

			acts[kind+" "+s.Namespace+"/"+s.Secret] = true
		}
	}

	for _, t := range p.Templates {
		if t.Action == TemplateUpdate {
			acts[UseTemplate+" "+t.Where()] = true
		}
	}

	var out []Use

	for _, u := range p.Verdict.stillAll() {
		if acts[u.Kind+" "+u.Name] {
			continue
		}

		if why, ok := alone[u.Name]; ok && u.Kind == UseNode && u.State == UseOld {
			u.Why = "this plan leaves it alone: " + why
		}

		out = append(out, u)
	}

	return out
}

// putBack is the last of a secret's other writers that wrote its credential at or after since
// (zero since: no rotation in progress, nothing is "put back").
func putBack(writers []Writer, since time.Time) (Writer, bool) {
	if since.IsZero() {
		return Writer{}, false
	}

	var last Writer

	since = since.Truncate(time.Second) // managedFields times are whole seconds

	for _, w := range writers {
		if !w.At.Before(since) && w.At.After(last.At) {
			last = w
		}
	}

	return last, last.Manager != ""
}

// rotationStarted is when the rotation in progress began (zero: none).
func (in Input) rotationStarted() time.Time {
	if in.Rotation == nil || in.Rotation.Finished != nil {
		return time.Time{}
	}

	return in.Rotation.Started
}
