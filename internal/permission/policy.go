package permission

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state/kubestate"
)

// RBAC cannot say which fields a write may change: a patch right on a Deployment is a right to
// its pod template, an update right on a Kustomization a right to what kustomize-controller
// applies with its own identity. Each write a shipped identity holds is therefore bounded by a
// ValidatingAdmissionPolicy (the API server's own admission plugin, GA in Kubernetes 1.30) that
// admits exactly the fields ghcrsync writes, for every service account in ghcrsync's namespace:
//
//	ghcrsync-secrets          Secrets: pull secrets and opaque ones only, no service-account annotation
//	ghcrsync-nodes            Nodes: spec.unschedulable, its steering taint, ghcrsync.dev/* and the
//	                          autoscaler's scale-down-disabled annotation
//	ghcrsync-serviceaccounts  ServiceAccounts: imagePullSecrets
//	ghcrsync-deployments      Deployments: the pod template's kubectl.kubernetes.io/restartedAt
//	ghcrsync-kustomizations   Flux Kustomizations: spec.suspend, ghcrsync.dev/suspended-by and the reconcile request
//	ghcrsync-ocirepositories  Flux OCIRepositories: reconcile.fluxcd.io/requestedAt
//	ghcrsync-daemonsets       DaemonSets: kured's lock annotation (weave.works/kured-node-lock)
//	ghcrsync-pods             Pods: the runtime probe's shape, nothing else
//	ghcrsync-plan-dry-run     the plan identity: server-side dry runs only
//
// Every rule compares the object as it would be stored with the object as it is (oldObject),
// key by key, so a field added to a resource later is bounded too: nothing but the named keys
// may differ.

// The policies' names (each binding is named as its policy).
const (
	SecretsPolicy         = "ghcrsync-secrets"
	NodesPolicy           = "ghcrsync-nodes"
	ServiceAccountsPolicy = "ghcrsync-serviceaccounts"
	DeploymentsPolicy     = "ghcrsync-deployments"
	KustomizationsPolicy  = "ghcrsync-kustomizations"
	OCIRepositoriesPolicy = "ghcrsync-ocirepositories"
	DaemonSetsPolicy      = "ghcrsync-daemonsets"
	PodsPolicy            = "ghcrsync-pods"
	PlanDryRunPolicyName  = "ghcrsync-plan-dry-run"
	KeyringPolicy         = "ghcrsync-keyring-writers"
	LeasesPolicy          = "ghcrsync-leases"
	EventsPolicy          = "ghcrsync-events"
)

// Fields the API server maintains on every write: never ghcrsync's to bound.
var serverMaintained = []string{"managedFields", "resourceVersion", "generation"}

// Policies are every admission policy that bounds the identities of namespace, policy and
// binding in turn, for what the configuration writes (s): the run Lease, the Secrets it names,
// the probe pod (with no probe image, no pod may be created at all) and the keyring writer.
func Policies(namespace string, s Shapes) []runtime.Object {
	var out []runtime.Object

	if s.Lease.Name != "" {
		out = append(out, leasesPolicy(s.Lease.Namespace, s.Lease.Name).objects(identitiesCondition(namespace))...)
	}

	for _, p := range []policy{
		secretsPolicy(&s.Secrets), nodesPolicy(), serviceAccountsPolicy(), deploymentsPolicy(),
		kustomizationsPolicy(), ociRepositoriesPolicy(), daemonSetsPolicy(), eventsPolicy(),
	} {
		out = append(out, p.objects(identitiesCondition(namespace))...)
	}

	// Pods: the probe's shape anywhere but the keyring writer's namespace, the writer's there.
	pods := podsPolicy(s.Probe)
	if s.Writer == nil {
		out = append(out, pods.objects(identitiesCondition(namespace))...)
	} else {
		out = append(out, pods.objects(identitiesCondition(namespace), inNamespace(s.Writer.Namespace, false))...)
		out = append(out, keyringPolicy(*s.Writer).objects(identitiesCondition(namespace), inNamespace(s.Writer.Namespace, true))...)
	}

	return append(out, PlanDryRunPolicy(namespace)...)
}

// inNamespace matches a request in namespace (or, in false, every other one).
func inNamespace(namespace string, in bool) admissionregistrationv1.MatchCondition {
	if in {
		return admissionregistrationv1.MatchCondition{Name: "in-" + namespace, Expression: `request.namespace == ` + celString(namespace)}
	}

	return admissionregistrationv1.MatchCondition{Name: "not-in-" + namespace, Expression: `request.namespace != ` + celString(namespace)}
}

// StaticPolicies are the policies that do not depend on a configuration (all but the probe
// pod's and the plan identity's): deploy/rbac/admission-policy.yaml.
func StaticPolicies(namespace string) []runtime.Object {
	var out []runtime.Object

	for _, p := range []policy{secretsPolicy(nil), nodesPolicy(), serviceAccountsPolicy(), deploymentsPolicy(), kustomizationsPolicy(), ociRepositoriesPolicy(),
		daemonSetsPolicy(), eventsPolicy()} {
		out = append(out, p.objects(identitiesCondition(namespace))...)
	}

	return out
}

// ProbeShape is what a probe pod may be: its service account and the images it may pull (each
// as configured, or its repository pinned by digest).
type ProbeShape struct {
	ServiceAccount string
	Images         []string
}

// policy is one ValidatingAdmissionPolicy before rendering.
type policy struct {
	name       string
	group      string
	resource   string
	operations []admissionregistrationv1.OperationType
	rules      []admissionregistrationv1.Validation
}

func (p policy) objects(match ...admissionregistrationv1.MatchCondition) []runtime.Object {
	version := "*"
	if p.group == "" {
		version = "v1"
	}

	return []runtime.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   typeMeta("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
			ObjectMeta: meta(p.name, "", ""),
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: p.operations,
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{p.group}, APIVersions: []string{version}, Resources: []string{p.resource}},
					},
				}}},
				MatchConditions: match,
				Validations:     p.rules,
			},
		},
		binding(p.name),
	}
}

func binding(name string) runtime.Object {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   typeMeta("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
		ObjectMeta: meta(name, "", ""),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}

// identitiesCondition matches ghcrsync's identities, by their exact user names in namespace:
// never a prefix, which would bound whatever else runs there.
func identitiesCondition(namespace string) admissionregistrationv1.MatchCondition {
	users := make([]string, 0, len(Classes))
	for _, class := range Classes {
		users = append(users, celString("system:serviceaccount:"+namespace+":"+AccountFor(class)))
	}

	return admissionregistrationv1.MatchCondition{
		Name:       "ghcrsync-identities",
		Expression: `request.userInfo.username in [` + strings.Join(users, ", ") + `]`,
	}
}

// ReservedNamespaces are where ghcrsync's identities may not live: the cluster's and Flux's own.
var ReservedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease", "default", "flux-system"}

var (
	update = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	create = []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
)

func rule(expression, message string) admissionregistrationv1.Validation {
	return admissionregistrationv1.Validation{Expression: expression, Message: message, Reason: ptr.To(metav1.StatusReasonForbidden)}
}

// unchanged is a CEL expression: the objects or maps a and b (their CEL paths) agree on every key
// but those allowed (a CEL predicate over k): the same keys, the same values. Both are taken as
// dyn, so a typed object (a Node's metadata) is ranged over like a map.
func unchanged(a, b, allowed string) string {
	a, b = "dyn("+a+")", "dyn("+b+")"

	return fmt.Sprintf("%[1]s.all(k, %[3]s || (k in %[2]s && %[1]s[k] == %[2]s[k])) && %[2]s.all(k, %[3]s || k in %[1]s)", a, b, allowed)
}

// keyIn is a CEL predicate over k: one of keys.
func keyIn(keys ...string) string {
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = celString(k)
	}

	return "k in [" + strings.Join(quoted, ", ") + "]"
}

// celString is s as a CEL string literal.
func celString(s string) string { return fmt.Sprintf("%q", s) }

// orEmpty is a CEL path that may be absent, as an empty map when it is.
func orEmpty(parent, field string) string { return parent + ".?" + field + ".orValue({})" }

// onlyMetadata bounds the metadata: nothing but annotations (when annotations is a CEL
// predicate over their keys, those keys) and the fields the API server maintains may change.
func onlyMetadata(what, annotations string) []admissionregistrationv1.Validation {
	if annotations == "" {
		return []admissionregistrationv1.Validation{rule(unchanged("object.metadata", "oldObject.metadata", keyIn(serverMaintained...)),
			"ghcrsync's identities change no metadata of a "+what)}
	}

	return []admissionregistrationv1.Validation{
		rule(unchanged("object.metadata", "oldObject.metadata", keyIn(append([]string{"annotations"}, serverMaintained...)...)),
			"ghcrsync's identities change no metadata of a "+what+" but its own annotations"),
		rule(unchanged(orEmpty("object.metadata", "annotations"), orEmpty("oldObject.metadata", "annotations"), annotations),
			"ghcrsync's identities change no annotation of a "+what+" but their own"),
	}
}

// secretsPolicy bounds every Secret write; with a shape (a rendering for a configuration), to
// exactly the Secrets it names and each as ghcrsync writes it (secretShapeRules).
func secretsPolicy(shape *SecretsShape) policy {
	p := policy{name: SecretsPolicy, resource: "secrets",
		operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		rules: []admissionregistrationv1.Validation{
			rule(`object.type in ["kubernetes.io/dockerconfigjson", "Opaque"]`,
				"ghcrsync's identities write only pull secrets (kubernetes.io/dockerconfigjson) and opaque Secrets"),
			rule(`!has(object.metadata.annotations) || !object.metadata.annotations.exists(k, k.startsWith("kubernetes.io/service-account"))`,
				"ghcrsync's identities never write a service-account annotation on a Secret"),
			rule(`!object.?immutable.orValue(false)`, "ghcrsync's identities never make a Secret immutable (no later run could rotate it)"),
		}}

	if shape != nil {
		p.rules = append(p.rules, secretShapeRules(*shape)...)
	}

	return p
}

// SecretsShape is every Secret the identities write, and what each may be: the pull secrets
// (consumers' and the root's, each with the credential its mark names), the node templates (the
// data keys each may change), the run state's Secret and the keyring writer's.
type SecretsShape struct {
	Pull      []PullSecretShape
	Templates []TemplateShape
	State     *Named // nil: the state is not kept in the cluster
	Keyring   *Named // nil: nodes.kubelet_keyring is not configured
}

// PullSecretShape is one pull secret: Credential is the ghcrsync.dev/credential mark it must
// carry ("": none is written).
type PullSecretShape struct{ Namespace, Name, Credential string }

// TemplateShape is one node-template Secret and the keys ghcrsync rewrites in it.
type TemplateShape struct {
	Namespace, Name string
	Keys            []string
}

// Named is one namespaced object.
type Named struct{ Namespace, Name string }

func (n Named) String() string { return n.Namespace + "/" + n.Name }

// secretMarks are the annotations ghcrsync writes on a pull secret.
var secretMarks = []string{object.ConfigurationAnnotation, object.CredentialAnnotation}

// secretShapeRules: a Secret write is one of the named Secrets, shaped as ghcrsync writes it —
//
//   - a pull secret: type kubernetes.io/dockerconfigjson; created with the one key
//     .dockerconfigjson, ghcrsync's label and marks only; updated in .dockerconfigjson and its
//     marks only (no other key, label, annotation, owner or finalizer); its credential mark the
//     one rendered for its namespace (a tenant namespace relabelled since cannot move another
//     credential in: the move is a re-rendering, a reviewed change);
//   - a node template: updated (never created) in its configured keys only, nothing else of it;
//   - the state: Opaque, its chunk keys only;
//   - the keyring writer's Secret: a pull secret with the one key.
func secretShapeRules(s SecretsShape) []admissionregistrationv1.Validation {
	n := namesOf(s)
	rules := n.pullRules()

	if len(n.pins) > 0 {
		rules = append(rules, rule("!("+secretID+" in "+celMap(n.pins)+") || "+
			orEmpty("object.metadata", "annotations")+"[?"+celString(object.CredentialAnnotation)+"].orValue(\"\") == "+celMap(n.pins)+"["+secretID+"]",
			"ghcrsync's identities write into each pull secret the credential rendered for its namespace ("+object.CredentialAnnotation+
				"): moving a namespace to another credential is a new rendering of ghcrsync rbac, reviewed and applied"))
	}

	if len(n.templates) > 0 {
		rules = append(rules, n.templateRule())
	}

	if s.State != nil {
		rules = append(rules, rule(secretID+" != "+celString(s.State.String())+" || (object.type == \"Opaque\" && dyn("+secretData+").all(k, k.matches("+celString(kubestate.KeyPattern)+")))",
			"ghcrsync's identities write the state Secret "+s.State.String()+" as Opaque, with its chunks only"))
	}

	if s.Keyring != nil {
		rules = append(rules, rule(secretID+" != "+celString(s.Keyring.String())+" || (object.type == "+celString(dockerConfigType)+" && "+onlyDockerConfigKey+")",
			"ghcrsync's identities write the keyring writer's Secret "+s.Keyring.String()+" as a pull secret with the one key .dockerconfigjson"))
	}

	return rules
}

// The CEL of a Secret's shape rules: the Secret's namespace/name, its data (old and new), a
// creation, and data with the one key .dockerconfigjson.
var (
	secretID            = `(request.namespace + "/" + object.metadata.name)`
	secretData          = orEmpty("object", "data")
	secretOldData       = orEmpty("oldObject", "data")
	secretCreating      = `request.operation == "CREATE"`
	onlyDockerConfigKey = "dyn(" + secretData + ").all(k, k == " + celString(dockerConfigKey) + ")"
)

// secretNames are the Secrets a shape names, as namespace/name: every one, the pull secrets, the
// credential pinned to each pull secret, and each node template's keys.
type secretNames struct {
	all, pulls []string
	pins       map[string]string
	templates  map[string][]string
}

func namesOf(s SecretsShape) secretNames {
	n := secretNames{pins: map[string]string{}, templates: map[string][]string{}}

	for _, p := range s.Pull {
		name := Named{p.Namespace, p.Name}.String()
		n.all, n.pulls = append(n.all, name), append(n.pulls, name)

		if p.Credential != "" {
			n.pins[name] = p.Credential
		}
	}

	for _, t := range s.Templates {
		name := Named{t.Namespace, t.Name}.String()
		n.all = append(n.all, name)
		n.templates[name] = append(n.templates[name], t.Keys...)
	}

	for _, named := range []*Named{s.State, s.Keyring} {
		if named != nil {
			n.all = append(n.all, named.String())
		}
	}

	return n
}

// pullRules: only the Secrets named; a pull secret's type and one key; its marks only.
func (n secretNames) pullRules() []admissionregistrationv1.Validation {
	id, pulls := secretID, celList(n.pulls)

	return []admissionregistrationv1.Validation{
		rule(id+" in "+celList(n.all),
			"ghcrsync's identities write only the Secrets this configuration names: its pull secrets, node templates, state and keyring writer's Secret "+
				"(a new one is a new rendering of ghcrsync rbac, reviewed and applied)"),
		rule("!("+id+" in "+pulls+") || (object.type == "+celString(dockerConfigType)+" && "+
			either(secretCreating, onlyDockerConfigKey, unchanged(secretData, secretOldData, keyIn(dockerConfigKey)))+")",
			"ghcrsync's identities write a pull secret as kubernetes.io/dockerconfigjson with the one key .dockerconfigjson, and change no other key of it"),
		rule("!("+id+" in "+pulls+") || "+either(secretCreating,
			"dyn("+orEmpty("object.metadata", "labels")+").all(k, k == \"app.kubernetes.io/managed-by\") && "+
				"dyn("+orEmpty("object.metadata", "annotations")+").all(k, "+keyIn(secretMarks...)+") && "+
				"!has(object.metadata.ownerReferences) && !has(object.metadata.finalizers)",
			unchanged("object.metadata", "oldObject.metadata", keyIn(append([]string{"annotations"}, serverMaintained...)...))+" && "+
				unchanged(orEmpty("object.metadata", "annotations"), orEmpty("oldObject.metadata", "annotations"), keyIn(secretMarks...))),
			"ghcrsync's identities write no label, annotation, owner or finalizer of a pull secret but their own marks"),
	}
}

// templateRule: a node template is updated in its configured keys only, and never created.
func (n secretNames) templateRule() admissionregistrationv1.Validation {
	keys := map[string]string{}
	for name, ks := range n.templates {
		keys[name] = celList(ks)
	}

	return rule("!("+secretID+" in "+celList(keysOf(n.templates))+") || (!("+secretCreating+") && "+
		unchanged("object", "oldObject", keyIn(append([]string{"data"}, serverMaintainedTop...)...))+" && "+
		unchanged("object.metadata", "oldObject.metadata", keyIn(serverMaintained...))+" && "+
		unchanged(secretData, secretOldData, "k in "+celRawMap(keys)+"["+secretID+"]")+")",
		"ghcrsync's identities change only the configured key of a node template (nodes.template.key): no other key, no type, label or annotation, and create none")
}

// either is a CEL expression: yes when cond holds, no otherwise. Not CEL's "cond ? yes : no":
// YAML folds a long expression at its spaces, and a folded line beginning with the ":" would be
// escaped by the output guard (a line starting with a colon is a workflow command's form).
func either(cond, yes, no string) string {
	return "((" + cond + " && " + yes + ") || (!(" + cond + ") && " + no + "))"
}

const (
	dockerConfigType = "kubernetes.io/dockerconfigjson"
	dockerConfigKey  = ".dockerconfigjson"
)

// Top-level fields of a Secret that are not its content: the metadata, and what the API
// server sets (apiVersion and kind, as a typed object has them).
var serverMaintainedTop = []string{"metadata", "apiVersion", "kind"}

// celList is items as a CEL list of strings (sorted, without repeats).
func celList(items []string) string {
	sorted := slices.Clone(items)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)

	quoted := make([]string, len(sorted))
	for i, s := range sorted {
		quoted[i] = celString(s)
	}

	return "[" + strings.Join(quoted, ", ") + "]"
}

// celMap is m as a CEL map of strings to strings.
func celMap(m map[string]string) string {
	quoted := map[string]string{}
	for k, v := range m {
		quoted[k] = celString(v)
	}

	return celRawMap(quoted)
}

// celRawMap is m as a CEL map of strings to CEL expressions, its keys sorted.
func celRawMap(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, celString(k)+": "+m[k])
	}

	return "{" + strings.Join(parts, ", ") + "}"
}

func keysOf[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// nodesPolicy: the claim, the cordon, the phase and record annotations, the verified marker, the
// autoscaler's scale-down guard, the steering taint — and nothing else of a Node (its labels, an
// operator's taints, its provider ID).
func nodesPolicy() policy {
	ours := `k.startsWith("ghcrsync.dev/") || k == ` + celString(object.ScaleDownDisabledAnnotation)
	others := `.?taints.orValue([]).filter(t, t.key != ` + celString(taints.Steering) + `)`

	return policy{name: NodesPolicy, resource: "nodes", operations: update,
		rules: append(onlyMetadata("Node", ours),
			rule(unchanged("object", "oldObject", keyIn("metadata", "spec")), "ghcrsync's identities change only the metadata and spec of a Node"),
			rule(unchanged("object.spec", "oldObject.spec", keyIn("unschedulable", "taints")),
				"ghcrsync's identities change only spec.unschedulable and spec.taints of a Node"),
			rule("object.spec"+others+" == oldObject.spec"+others,
				"ghcrsync's identities add or remove no taint of a Node but "+taints.Steering),
			// The steering taint as ghcrsync writes it: PreferNoSchedule or NoSchedule (never
			// NoExecute, which evicts every pod without a toleration at once, past every budget),
			// its value a run's token.
			rule("object.spec.?taints.orValue([]).filter(t, t.key == "+celString(taints.Steering)+`).all(t, t.effect in ["PreferNoSchedule", "NoSchedule"] && `+
				`t.?value.orValue("").matches("^run-[0-9a-f]{16}$"))`,
				"ghcrsync's steering taint "+taints.Steering+" is PreferNoSchedule or NoSchedule, valued run-TOKEN: never NoExecute"),
		)}
}

// leasesPolicy: the run's Lease (lease.namespace/lease.name), and no other Lease, may be created
// or written by ghcrsync's identities — Flux's controllers keep their leader-election Leases in
// the same namespace, and one taken or pre-created with a long duration stops a controller.
func leasesPolicy(namespace, name string) policy {
	return policy{name: LeasesPolicy, group: "coordination.k8s.io", resource: "leases",
		operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		rules: []admissionregistrationv1.Validation{
			rule("request.namespace == "+celString(namespace)+" && request.name == "+celString(name),
				"ghcrsync's identities write only the run Lease "+namespace+"/"+name),
		}}
}

// eventsPolicy: the Events ghcrsync records (cluster.Connection.Record) and no other shape —
// its reason, its source and reporting component, about a Node, a Secret or a Lease. An Event
// posing as the kubelet (a Pulled on a probe pod) or another controller is refused.
func eventsPolicy() policy {
	// dyn: "events" is also served as events.k8s.io/v1 (other field names), which the API server
	// type-checks the rule against; requests there are converted to core v1 before it runs.
	e := "dyn(object)"

	return policy{name: EventsPolicy, resource: "events",
		operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		rules: []admissionregistrationv1.Validation{
			rule(e+".reason.startsWith("+celString(cluster.EventReasonPrefix)+") && "+e+".?source.component.orValue(\"\") == "+celString(cluster.EventSource)+
				" && "+e+".?reportingComponent.orValue(\"\") == "+celString(cluster.EventReportingController)+
				" && "+e+".?reportingInstance.orValue(\"\") == "+celString(cluster.EventSource),
				"ghcrsync's identities record only ghcrsync's Events: reason "+cluster.EventReasonPrefix+"…, source and reporting component ghcrsync"),
			rule(e+`.involvedObject.kind in ["Node", "Secret", "Lease"] && !has(`+e+`.related) && !has(`+e+`.series)`,
				"ghcrsync's identities record Events about a Node, a Secret or a Lease only"),
		}}
}

func serviceAccountsPolicy() policy {
	return policy{name: ServiceAccountsPolicy, resource: "serviceaccounts", operations: update,
		rules: append(onlyMetadata("ServiceAccount", ""),
			rule(unchanged("object", "oldObject", keyIn("metadata", "imagePullSecrets")),
				"ghcrsync's identities change only the imagePullSecrets of a ServiceAccount")),
	}
}

func deploymentsPolicy() policy {
	return policy{name: DeploymentsPolicy, group: "apps", resource: "deployments", operations: update,
		rules: append(onlyMetadata("Deployment", ""),
			rule(unchanged("object", "oldObject", keyIn("metadata", "spec")), "ghcrsync's identities change only the spec of a Deployment"),
			rule(unchanged("object.spec", "oldObject.spec", keyIn("template")), "ghcrsync's identities change only the pod template of a Deployment"),
			rule(unchanged("object.spec.template", "oldObject.spec.template", keyIn("metadata")),
				"ghcrsync's identities change only the pod template's metadata of a Deployment"),
			rule(unchanged("object.spec.template.metadata", "oldObject.spec.template.metadata", keyIn("annotations")),
				"ghcrsync's identities change only the pod template's annotations of a Deployment"),
			rule(unchanged(orEmpty("object.spec.template.metadata", "annotations"), orEmpty("oldObject.spec.template.metadata", "annotations"),
				keyIn(cluster.RestartedAtAnnotation)),
				"ghcrsync's identities change only the pod template's "+cluster.RestartedAtAnnotation+" annotation of a Deployment (a rollout restart)"),
		)}
}

func kustomizationsPolicy() policy {
	return policy{name: KustomizationsPolicy, group: cluster.Kustomizations.Group, resource: cluster.Kustomizations.Resource, operations: update,
		rules: append(onlyMetadata("Kustomization", keyIn(object.SuspendedByAnnotation, cluster.ReconcileRequestAnnotation)),
			rule(unchanged("object", "oldObject", keyIn("metadata", "spec")), "ghcrsync's identities change only the spec of a Kustomization"),
			rule(unchanged("object.spec", "oldObject.spec", keyIn("suspend")), "ghcrsync's identities change only spec.suspend of a Kustomization"),
		)}
}

func ociRepositoriesPolicy() policy {
	return policy{name: OCIRepositoriesPolicy, group: cluster.OCIRepositories.Group, resource: cluster.OCIRepositories.Resource, operations: update,
		rules: append(onlyMetadata("OCIRepository", keyIn(cluster.ReconcileRequestAnnotation)),
			rule(unchanged("object", "oldObject", keyIn("metadata")),
				"ghcrsync's identities change only the "+cluster.ReconcileRequestAnnotation+" annotation of an OCIRepository"),
		)}
}

// daemonSetsPolicy: of a DaemonSet (kured's, the only one a role lets ghcrsync patch), only
// kured's lock annotation may change — a patch right on a DaemonSet is otherwise a right to run
// any pod on every node.
func daemonSetsPolicy() policy {
	return policy{name: DaemonSetsPolicy, group: "apps", resource: "daemonsets", operations: update,
		rules: append(onlyMetadata("DaemonSet", keyIn(maintenance.KuredLockAnnotation)),
			rule(unchanged("object", "oldObject", keyIn("metadata", "status")),
				"ghcrsync's identities change only the "+maintenance.KuredLockAnnotation+" annotation of a DaemonSet (kured's lock)"),
		)}
}

// The probe pod's allowed keys: what cluster.probePod sets, and what the API server defaults.
var (
	probePodKeys = []string{"nodeName", "serviceAccountName", "serviceAccount", "restartPolicy", "tolerations", "automountServiceAccountToken",
		"terminationGracePeriodSeconds", "securityContext", "containers", "dnsPolicy", "schedulerName", "enableServiceLinks", "priority",
		"preemptionPolicy"}
	probeContainerKeys = []string{"name", "image", "imagePullPolicy", "securityContext", "resources", "terminationMessagePath", "terminationMessagePolicy"}
)

// podsPolicy admits a pod created by ghcrsync only in the probe's exact shape: its service
// account, no token, no volume, no host namespace, one container of a probe image with the
// restricted security context and nothing else.
func podsPolicy(probe ProbeShape) policy {
	images := make([]string, 0, 2*len(probe.Images))
	for _, img := range probe.Images {
		images = append(images, "c.image == "+celString(img), "c.image.startsWith("+celString(repository(img)+"@sha256:")+")")
	}

	image := "false" // no probe configured: no pod at all
	if len(images) > 0 {
		image = strings.Join(images, " || ")
	}

	c := "object.spec.containers[0]"

	return policy{name: PodsPolicy, resource: "pods", operations: create,
		rules: []admissionregistrationv1.Validation{
			rule("dyn(object.spec).all(k, "+keyIn(probePodKeys...)+")",
				"ghcrsync's identities create only the runtime probe pod: no volumes, init or ephemeral containers, host namespaces, pull secrets or other fields"),
			rule("object.spec.serviceAccountName == "+celString(probe.ServiceAccount)+" && object.spec.automountServiceAccountToken == false",
				"ghcrsync's runtime probe pod runs as "+probe.ServiceAccount+" with no service-account token"),
			rule("size(object.spec.containers) == 1 && object.spec.containers.all(c, dyn(c).all(k, "+keyIn(probeContainerKeys...)+") && ("+image+"))",
				"ghcrsync's runtime probe pod is one container of a configured probe image, with no command, arguments, environment, mounts or ports"),
			rule(c+".securityContext.allowPrivilegeEscalation == false && "+c+".securityContext.runAsNonRoot == true && "+
				c+`.securityContext.capabilities.drop == ["ALL"] && !has(`+c+".securityContext.capabilities.add) && "+
				"dyn("+c+".securityContext).all(k, "+keyIn("allowPrivilegeEscalation", "runAsNonRoot", "capabilities")+")",
				"ghcrsync's runtime probe container drops every capability and may not escalate or run as root"),
			rule(`object.spec.securityContext.runAsNonRoot == true && object.spec.securityContext.seccompProfile.type == "RuntimeDefault" && `+
				"dyn(object.spec.securityContext).all(k, "+keyIn("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile")+")",
				"ghcrsync's runtime probe pod runs as a non-root user under the runtime's default seccomp profile"),
		}}
}

// repository is an image reference without its tag or digest.
func repository(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}

	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}

	return image
}

// PlanDryRunPolicy lets the plan identity write nothing: its write rights (the runtime probe
// pod, to learn what admission makes of it; the fan-out's pull secret and template writes, to
// learn whether admission refuses them) are accepted as server-side dry runs only.
func PlanDryRunPolicy(namespace string) []runtime.Object {
	p := policy{name: PlanDryRunPolicyName, group: "*", resource: "*",
		operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
		rules:      []admissionregistrationv1.Validation{rule(`request.dryRun == true`, "the ghcrsync plan identity makes server-side dry runs only")}}

	return p.objects(admissionregistrationv1.MatchCondition{
		Name:       "ghcrsync-plan-identity",
		Expression: `request.userInfo.username == "system:serviceaccount:` + namespace + `:` + AccountFor(CommandPlan) + `"`,
	})
}

// Escapes are the writes command's identity must be refused by its policies with cfg and the
// consumer targets: one per policy that bounds a right it holds, on an object it may write
// (cluster.Contained tries them). A command that writes nothing (plan, fences) has none.
func Escapes(cfg *config.Config, command string, targets []cluster.SecretTarget) []cluster.Escape {
	if command == CommandTemplate {
		return templateEscapes(cfg)
	}

	if command != CommandApply && command != CommandRelease {
		return nil
	}

	out := []cluster.Escape{{Kind: cluster.EscapeNodeLabel, Policy: NodesPolicy}, {Kind: cluster.EscapeNoExecuteTaint, Policy: NodesPolicy},
		{Kind: cluster.EscapeForgedEvent, Policy: EventsPolicy}}

	if cfg.State.Backend == "kubernetes" {
		out = append(out, cluster.Escape{Kind: cluster.EscapeSecretAnnotate, Policy: SecretsPolicy, Namespace: cfg.State.Namespace, Name: cfg.State.Secret})
	}

	for _, k := range cfg.FluxSuspend {
		out = append(out, cluster.Escape{Kind: cluster.EscapeKustomization, Policy: KustomizationsPolicy, Namespace: k.Namespace, Name: k.Name})
	}

	if k := cfg.Others.Kured; k.Name != "" {
		out = append(out, cluster.Escape{Kind: cluster.EscapeDaemonSetSpec, Policy: DaemonSetsPolicy, Namespace: k.Namespace, Name: k.Name})
	}

	if command == CommandRelease {
		return out
	}

	// apply may create a Lease in the Lease's namespace (RBAC cannot name what is created):
	// only its own is admitted. release only patches its own, by name.
	out = append(out, cluster.Escape{Kind: cluster.EscapeForeignLease, Policy: LeasesPolicy, Namespace: cfg.Lease.Namespace})

	out = append(out, pullSecretEscapes(cfg, targets)...)

	for _, t := range targets {
		for _, sa := range t.ServiceAccounts {
			out = append(out, cluster.Escape{Kind: cluster.EscapeAccountToken, Policy: ServiceAccountsPolicy, Namespace: t.Namespace, Name: sa})
		}
	}

	if r := cfg.FluxRoot; r != nil && r.OCIRepository != "" {
		out = append(out, cluster.Escape{Kind: cluster.EscapeOCIRepository, Policy: OCIRepositoriesPolicy, Namespace: r.Namespace, Name: r.OCIRepository})
	}

	if pr := cfg.Nodes.Probe; pr.Image != "" {
		out = append(out, cluster.Escape{Kind: cluster.EscapePod, Policy: PodsPolicy, Namespace: pr.Namespace,
			Probe: plan.Probe{Image: pr.Image, ServiceAccount: pr.ServiceAccount}})
	}

	if k := cfg.Nodes.Keyring; k != nil {
		out = append(out, cluster.Escape{Kind: cluster.EscapeWriterPod, Policy: KeyringPolicy, Namespace: k.Namespace,
			Writer: keyring.Writer{Image: k.Image, Namespace: k.Namespace, Secret: k.Secret, Registry: cfg.Credential.Registry}})
	}

	return out
}

// pullSecretEscapes are a pull secret's bounds, tried on the first consumer's and on the root's
// (an escape on a Secret that does not exist yet proves nothing, and is skipped).
func pullSecretEscapes(cfg *config.Config, targets []cluster.SecretTarget) []cluster.Escape {
	i := slices.IndexFunc(targets, func(t cluster.SecretTarget) bool { return len(t.Contested) == 0 })
	if i < 0 {
		return nil
	}

	out := []cluster.Escape{{Kind: cluster.EscapeTokenSecret, Policy: SecretsPolicy, Namespace: targets[i].Namespace},
		{Kind: cluster.EscapeOpaqueSecret, Policy: SecretsPolicy, Namespace: targets[i].Namespace}}

	tried := []cluster.SecretTarget{targets[i]}
	if last := targets[len(targets)-1]; last.Role == plan.RoleRoot && len(targets)-1 != i {
		tried = append(tried, last)
	}

	for _, t := range tried {
		out = append(out, cluster.Escape{Kind: cluster.EscapeSecretKey, Policy: SecretsPolicy, Namespace: t.Namespace, Name: t.Name})

		if cluster.CredentialMark(t.Credential, cfg.Credential.Name) != "" {
			out = append(out, cluster.Escape{Kind: cluster.EscapeCredentialMark, Policy: SecretsPolicy, Namespace: t.Namespace, Name: t.Name})
		}
	}

	return out
}

// templateEscapes are the template identity's: a second key of each node template, and each
// restarted deployment's service account.
func templateEscapes(cfg *config.Config) []cluster.Escape {
	var out []cluster.Escape

	for _, t := range cfg.NodeTemplates {
		out = append(out, cluster.Escape{Kind: cluster.EscapeTemplateKey, Policy: SecretsPolicy, Namespace: t.Namespace, Name: t.Secret})

		if ns, name, ok := strings.Cut(t.RestartDeployment, "/"); ok {
			out = append(out, cluster.Escape{Kind: cluster.EscapeDeploymentSA, Policy: DeploymentsPolicy, Namespace: ns, Name: name})
		}
	}

	return out
}

// KeyringShape is what a kubelet keyring writer pod may be (nodes.kubelet_keyring): in its
// namespace, ghcrsync's image by digest, its command, one hostPath of a kubelet root directory.
type KeyringShape struct {
	Namespace, Image, Secret, Registry string
	RootDirs                           []string
}

// The writer pod's allowed keys: what keyring.Pod sets, and what the API server defaults.
var (
	writerPodKeys = []string{"nodeName", "serviceAccountName", "serviceAccount", "restartPolicy", "tolerations", "automountServiceAccountToken",
		"enableServiceLinks", "terminationGracePeriodSeconds", "securityContext", "volumes", "containers", "dnsPolicy", "schedulerName", "priority",
		"preemptionPolicy"}
	writerContainerKeys = []string{"name", "image", "imagePullPolicy", "command", "args", "env", "volumeMounts", "securityContext", "resources",
		"terminationMessagePath", "terminationMessagePolicy"}
)

// keyringPolicy admits a pod created by ghcrsync in the writer's namespace only in the writer's
// exact shape (keyring.Pod), and the one Secret it reads: ghcrsync's image by digest and its
// node-keyring command with the configured registry, pinned to a node, one volume — a hostPath of
// a kubelet root directory, mounted at /kubelet — no service-account token, no privilege, no
// capability, a read-only root file system; the credential only from that Secret.
func keyringPolicy(w KeyringShape) policy {
	c := "object.spec.containers[0]"
	v := "object.spec.volumes[0]"

	dirs := make([]string, len(w.RootDirs))
	for i, d := range w.RootDirs {
		dirs[i] = celString(d)
	}

	modes := `["write", "read", "remove", "await"]`
	args := c + ".args"

	return policy{name: KeyringPolicy, resource: "pods", operations: create,
		rules: []admissionregistrationv1.Validation{
			rule("dyn(object.spec).all(k, "+keyIn(writerPodKeys...)+") && object.spec.nodeName != \"\"",
				"ghcrsync's identities create only the keyring writer pod here, pinned to a node: no host namespaces, init or ephemeral containers, pull secrets or other fields"),
			rule(`object.spec.serviceAccountName == "default" && object.spec.automountServiceAccountToken == false && object.spec.enableServiceLinks == false`,
				"ghcrsync's keyring writer runs as its namespace's default account with no service-account token"),
			rule("size(object.spec.volumes) == 1 && dyn("+v+").all(k, "+keyIn("name", "hostPath")+") && "+v+".hostPath.path in ["+strings.Join(dirs, ", ")+"] && "+
				v+`.hostPath.type == "Directory"`,
				"ghcrsync's keyring writer has one volume: a kubelet root directory (nodes.kubelet_keyring.root_dirs)"),
			rule("size(object.spec.containers) == 1 && dyn("+c+").all(k, "+keyIn(writerContainerKeys...)+") && "+c+".image == "+celString(w.Image)+
				" && "+c+`.command == ["/usr/local/bin/ghcrsync"]`,
				"ghcrsync's keyring writer is one container of ghcrsync's configured image, running ghcrsync"),
			rule(args+".size() >= 8 && "+args+`[0] == "node-keyring" && `+args+"[1] in "+modes+" && "+args+`[2] == "--root" && `+args+`[3] == "/kubelet" && `+
				args+`[4] == "--registry" && `+args+"[5] == "+celString(w.Registry)+" && "+args+`[6] == "--node-path" && `+
				"(("+args+".size() == 8) || ("+args+`.size() == 10 && `+args+`[1] == "await" && `+args+`[8] == "--within" && `+args+"[9] == "+celString(keyring.AwaitStep.String())+"))",
				"ghcrsync's keyring writer runs its node-keyring command for the configured registry and nothing else"),
			rule("size("+c+".volumeMounts) == 1 && dyn("+c+".volumeMounts[0]).all(k, "+keyIn("name", "mountPath")+") && "+c+`.volumeMounts[0].mountPath == "/kubelet"`,
				"ghcrsync's keyring writer mounts its one volume at /kubelet, and only there"),
			rule("!has("+c+".env) || ("+"size("+c+".env) == 1 && "+c+`.env[0].name == "GHCRSYNC_KEYRING_ENTRY" && `+
				c+".env[0].valueFrom.secretKeyRef.name == "+celString(w.Secret)+" && "+c+`.env[0].valueFrom.secretKeyRef.key == ".dockerconfigjson" && !has(`+c+".env[0].value))",
				"ghcrsync's keyring writer reads the credential from its Secret only, never from its spec"),
			rule(c+".securityContext.privileged == false && "+c+".securityContext.allowPrivilegeEscalation == false && "+c+".securityContext.readOnlyRootFilesystem == true && "+
				c+`.securityContext.capabilities.drop == ["ALL"] && !has(`+c+".securityContext.capabilities.add) && "+
				"dyn("+c+".securityContext).all(k, "+keyIn("runAsUser", "runAsNonRoot", "privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities")+")",
				"ghcrsync's keyring writer drops every capability, may not escalate, and has a read-only root file system"),
			rule(`object.spec.securityContext.seccompProfile.type == "RuntimeDefault" && dyn(object.spec.securityContext).all(k, k == "seccompProfile")`,
				"ghcrsync's keyring writer runs under the runtime's default seccomp profile"),
		}}
}

// LeaseRef is the run Lease the identities may write.
type LeaseRef struct{ Namespace, Name string }
