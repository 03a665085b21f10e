package permission

import (
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
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

// Render is the RBAC that grants each identity exactly its needs, in namespace's service
// accounts, with the admission policies that bound what those needs may write (Policies) first:
// the API server must hold a policy before the right it bounds is granted. Then the probe's
// namespace (PodSecurity "restricted") and service account, the identities' service accounts,
// and for each identity a ClusterRole (and binding) for what is cluster-wide or cluster-scoped and
// a Role (and binding) in each namespace it touches, each rule as narrow as its need (by name
// where the API can limit by name). The objects come in a fixed order, so the rendering of one
// input is always the same text.
func Render(namespace string, ids []Identity, shapes Shapes) []runtime.Object {
	out := Policies(namespace, shapes)

	if shapes.ProbeNamespace != "" {
		out = append(out, ProbeObjects(shapes.ProbeNamespace, shapes.Probe)...)
	}

	if w := shapes.Writer; w != nil {
		out = append(out, KeyringObjects(w.Namespace)...)
	}

	for _, id := range ids {
		out = append(out, &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"),
			ObjectMeta: meta(id.Account, namespace, id.Class)})
	}

	for _, id := range ids {
		out = append(out, roles(namespace, id)...)
	}

	return out
}

// Shapes are what the identities' writes may be with a configuration: where the runtime probe
// pods run ("": no probe) and what they may be; what the kubelet keyring's writer pods may be (nil:
// nodes.kubelet_keyring is not configured); the run Lease, the only one they may write ("": not
// bounded); and the Secrets they may write.
type Shapes struct {
	ProbeNamespace string
	Probe          ProbeShape
	Writer         *KeyringShape
	Lease          LeaseRef
	Secrets        SecretsShape
}

// ProbeObjects are the probe's namespace, where the PodSecurity admission enforces the
// "restricted" profile, and its service account: no rights, no token, and no imagePullSecrets
// for admission to add to the probe (a pull through one would prove nothing). Nothing else lives
// there: no Secret, no other account, so a pod created there has nothing to steal.
func ProbeObjects(namespace string, p ProbeShape) []runtime.Object {
	ns := &corev1.Namespace{TypeMeta: typeMeta("v1", "Namespace"), ObjectMeta: meta(namespace, "", "probe")}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	ns.Labels["pod-security.kubernetes.io/enforce-version"] = "latest"

	return []runtime.Object{ns, &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"),
		ObjectMeta: meta(p.ServiceAccount, namespace, "probe"), AutomountServiceAccountToken: ptr.To(false)}}
}

// KeyringObjects are the keyring writer's namespace (nodes.kubelet_keyring.namespace): it holds
// the writer pods and their Secret, nothing else. Its PodSecurity level is "privileged": the
// writer mounts the kubelet's root directory (a hostPath, which "baseline" forbids); what a pod
// there may be is bounded by the admission policy ghcrsync-keyring-writers, not by PodSecurity.
func KeyringObjects(namespace string) []runtime.Object {
	ns := &corev1.Namespace{TypeMeta: typeMeta("v1", "Namespace"), ObjectMeta: meta(namespace, "", "keyring")}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "privileged"
	ns.Labels["pod-security.kubernetes.io/enforce-version"] = "latest"

	return []runtime.Object{ns}
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

// target is one object (or, with no name, every object) of a resource.
type target struct{ group, resource, name string }

// ruleKey is a rule before its names: a resource and its verbs (sorted, joined; ",*" marks a
// rule on any object).
type ruleKey struct{ group, resource, verbs string }

// verbsByObject gathers the verbs needed on each object, objects in the order first needed.
func verbsByObject(needs []cluster.Access) (map[target][]string, []target) {
	verbs := map[target][]string{}

	var order []target

	for _, a := range needs {
		o := target{a.Group, a.Resource, a.Name}
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
func byVerbs(verbs map[target][]string, order []target) (map[ruleKey][]string, []ruleKey) {
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

// ShapesOf are the configuration's shapes, with the pull secrets targets resolves to.
func ShapesOf(cfg *config.Config, targets []cluster.SecretTarget) Shapes {
	out := Shapes{Lease: LeaseRef{Namespace: cfg.Lease.Namespace, Name: cfg.Lease.Name}, Secrets: SecretsOf(cfg, targets),
		Probe: ProbeShape{ServiceAccount: cfg.Nodes.Probe.ServiceAccount}}

	if k := cfg.Nodes.Keyring; k != nil {
		out.Writer = &KeyringShape{Namespace: k.Namespace, Image: k.Image, Secret: k.Secret, Registry: cfg.Credential.Registry, RootDirs: k.RootDirs}
	}

	if pr := cfg.Nodes.Probe; pr.Image != "" {
		out.ProbeNamespace, out.Probe.Images = pr.Namespace, pr.Images
	}

	return out
}

// SecretsOf are the Secrets the configuration writes, with the pull secrets targets resolves to
// (a contested one is written by none).
func SecretsOf(cfg *config.Config, targets []cluster.SecretTarget) SecretsShape {
	var out SecretsShape

	for _, t := range targets {
		if len(t.Contested) > 0 {
			continue // neither read nor written: no write of it is admitted
		}

		out.Pull = append(out.Pull, PullSecretShape{Namespace: t.Namespace, Name: t.Name, Credential: cluster.CredentialMark(t.Credential, cfg.Credential.Name)})
	}

	for _, t := range cfg.NodeTemplates {
		out.Templates = append(out.Templates, TemplateShape{Namespace: t.Namespace, Name: t.Secret, Keys: []string{t.Key}})
	}

	if cfg.State.Backend == "kubernetes" {
		out.State = &Named{Namespace: cfg.State.Namespace, Name: cfg.State.Secret}
	}

	if k := cfg.Nodes.Keyring; k != nil {
		out.Keyring = &Named{Namespace: k.Namespace, Name: k.Secret}
	}

	return out
}
