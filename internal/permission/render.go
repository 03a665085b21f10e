package permission

import (
	"slices"
	"sort"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
)

// Identity is one command class's service account and what it needs.
type Identity struct {
	Class   string // plan (also fences), apply, release
	Account string // its ServiceAccount's name
	Needs   []cluster.Access
}

// DefaultNamespace is where ghcrsync's service accounts and probe pods live.
const DefaultNamespace = "ghcrsync-system"

// AccountFor is a class's service account name.
func AccountFor(class string) string { return "ghcrsync-" + class }

// SecretsPolicy names the ValidatingAdmissionPolicy (and its binding) that bounds what
// ghcrsync's identities may write into a Secret.
const SecretsPolicy = "ghcrsync-secrets"

// Render is the RBAC that grants each identity exactly its needs, in namespace's service
// accounts: a ClusterRole (and binding) for what is cluster-wide or cluster-scoped, a Role (and
// binding) in each namespace it touches, each rule as narrow as its need (by name where the
// API can limit by name). Then the admission policy that keeps ghcrsync's identities from
// writing any Secret but a pull secret or an opaque one (SecretsAdmissionPolicy). The objects
// come in a fixed order, so the rendering of one input is always the same text.
func Render(namespace string, ids []Identity) []runtime.Object {
	var out []runtime.Object

	for _, id := range ids {
		out = append(out, &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"),
			ObjectMeta: meta(id.Account, namespace, id.Class)})
	}

	for _, id := range ids {
		out = append(out, roles(namespace, id)...)
	}

	out = append(out, SecretsAdmissionPolicy(namespace)...)

	return append(out, PlanDryRunPolicy(namespace)...)
}

// ProbeAccount is the service account the runtime probe pods run as: no rights, and no
// imagePullSecrets for admission to add to the probe (a pull through one would prove nothing).
func ProbeAccount(namespace, name string) runtime.Object {
	return &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"), ObjectMeta: meta(name, namespace, "probe"),
		AutomountServiceAccountToken: ptr.To(false)}
}

// PlanDryRunPolicy lets the plan identity write nothing: its write rights (the runtime probe
// pod, to learn what admission makes of it; the fan-out's pull secret and template writes, to
// learn whether admission refuses them) are accepted as server-side dry runs only.
func PlanDryRunPolicy(namespace string) []runtime.Object {
	name := "ghcrsync-plan-dry-run"

	return []runtime.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   typeMeta("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
			ObjectMeta: meta(name, "", ""),
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*"}},
					},
				}}},
				MatchConditions: []admissionregistrationv1.MatchCondition{{
					Name:       "ghcrsync-plan-identity",
					Expression: `request.userInfo.username == "system:serviceaccount:` + namespace + `:` + AccountFor(CommandPlan) + `"`,
				}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: `request.dryRun == true`,
					Message:    "the ghcrsync plan identity makes server-side dry runs only",
					Reason:     ptr.To(metav1.StatusReasonForbidden),
				}},
			},
		},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   typeMeta("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
			ObjectMeta: meta(name, "", ""),
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		},
	}
}

func roles(namespace string, id Identity) []runtime.Object {
	byNS := map[string][]cluster.Access{}
	for _, a := range id.Needs {
		byNS[a.Namespace] = append(byNS[a.Namespace], a)
	}

	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: id.Account, Namespace: namespace}}
	name := "ghcrsync-" + id.Class

	var out []runtime.Object

	if cw := byNS[""]; len(cw) > 0 {
		out = append(out,
			&rbacv1.ClusterRole{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRole"), ObjectMeta: meta(name, "", id.Class), Rules: rules(cw)},
			&rbacv1.ClusterRoleBinding{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ObjectMeta: meta(name, "", id.Class),
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subject})
	}

	namespaces := make([]string, 0, len(byNS))
	for ns := range byNS {
		if ns != "" {
			namespaces = append(namespaces, ns)
		}
	}

	sort.Strings(namespaces)

	for _, ns := range namespaces {
		out = append(out,
			&rbacv1.Role{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "Role"), ObjectMeta: meta(name, ns, id.Class), Rules: rules(byNS[ns])},
			&rbacv1.RoleBinding{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "RoleBinding"), ObjectMeta: meta(name, ns, id.Class),
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subject})
	}

	return out
}

// rules turns permissions into policy rules: the verbs on one object together, then the objects
// with the same verbs together. A permission on any object ("" name) stays a rule of its own.
func rules(needs []cluster.Access) []rbacv1.PolicyRule {
	names, keys := byVerbs(verbsByObject(needs))

	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.group != b.group {
			return a.group < b.group
		}

		if a.resource != b.resource {
			return a.resource < b.resource
		}

		return a.verbs < b.verbs
	})

	out := make([]rbacv1.PolicyRule, 0, len(keys))

	for _, k := range keys {
		r := rbacv1.PolicyRule{APIGroups: []string{k.group}, Resources: []string{k.resource},
			Verbs: strings.Split(strings.TrimSuffix(k.verbs, ",*"), ",")}

		if n := names[k]; len(n) > 0 {
			r.ResourceNames = slices.Sorted(slices.Values(n))
		}

		out = append(out, r)
	}

	return out
}

// object is one object (or, with no name, every object) of a resource.
type object struct{ group, resource, name string }

// ruleKey is a rule before its names: a resource and its verbs (sorted, joined; ",*" marks a
// rule on any object).
type ruleKey struct{ group, resource, verbs string }

// verbsByObject gathers the verbs needed on each object, objects in the order first needed.
func verbsByObject(needs []cluster.Access) (map[object][]string, []object) {
	verbs := map[object][]string{}

	var order []object

	for _, a := range needs {
		o := object{a.Group, a.Resource, a.Name}
		if _, ok := verbs[o]; !ok {
			order = append(order, o)
		}

		if !slices.Contains(verbs[o], a.Verb) {
			verbs[o] = append(verbs[o], a.Verb)
		}
	}

	return verbs, order
}

// byVerbs gathers the objects of a resource needing the same verbs into one rule's names.
func byVerbs(verbs map[object][]string, order []object) (map[ruleKey][]string, []ruleKey) {
	names := map[ruleKey][]string{}

	var keys []ruleKey

	for _, o := range order {
		v := slices.Clone(verbs[o])
		sort.Strings(v)

		k := ruleKey{o.group, o.resource, strings.Join(v, ",")}
		if o.name == "" {
			k.verbs += ",*" // any object: never merged with a rule by name
		}

		if _, ok := names[k]; !ok {
			keys = append(keys, k)
		}

		if o.name != "" {
			names[k] = append(names[k], o.name)
		} else {
			names[k] = names[k][:0:0]
		}
	}

	return names, keys
}

// SecretsAdmissionPolicy bounds what every identity of namespace (ghcrsync's service
// accounts) may write into a Secret, whatever RBAC grants it: only the types ghcrsync writes —
// a pull secret (kubernetes.io/dockerconfigjson) or an opaque one (its state, a node template)
// — and no service-account annotation. So a create right cannot become a token: the token
// controller fills only a kubernetes.io/service-account-token Secret, and a bootstrap token is
// another type again. Enforced by the API server's own ValidatingAdmissionPolicy plugin (GA in
// Kubernetes 1.30).
func SecretsAdmissionPolicy(namespace string) []runtime.Object {
	return []runtime.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   typeMeta("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
			ObjectMeta: meta(SecretsPolicy, "", ""),
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
					},
				}}},
				MatchConditions: []admissionregistrationv1.MatchCondition{{
					Name:       "ghcrsync-identities",
					Expression: `request.userInfo.username.startsWith("system:serviceaccount:` + namespace + `:")`,
				}},
				Validations: []admissionregistrationv1.Validation{
					{
						Expression: `object.type in ["kubernetes.io/dockerconfigjson", "Opaque"]`,
						Message:    "ghcrsync's identities write only pull secrets (kubernetes.io/dockerconfigjson) and opaque Secrets",
						Reason:     ptr.To(metav1.StatusReasonForbidden),
					},
					{
						Expression: `!has(object.metadata.annotations) || !object.metadata.annotations.exists(k, k.startsWith("kubernetes.io/service-account"))`,
						Message:    "ghcrsync's identities never write a service-account annotation on a Secret",
						Reason:     ptr.To(metav1.StatusReasonForbidden),
					},
				},
			},
		},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   typeMeta("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
			ObjectMeta: meta(SecretsPolicy, "", ""),
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        SecretsPolicy,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		},
	}
}

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

func meta(name, namespace, class string) metav1.ObjectMeta {
	labels := map[string]string{"app.kubernetes.io/name": "ghcrsync", "app.kubernetes.io/managed-by": "ghcrsync-rbac"}
	if class != "" {
		labels["app.kubernetes.io/component"] = class
	}

	return metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}
}
