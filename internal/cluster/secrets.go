package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/plan"
)

// SecretTarget is a pull secret ghcrsync keeps, and the service accounts that should reference it.
type SecretTarget struct {
	Namespace, Name string
	Role            string
	ServiceAccounts []string
	// Credential is the tenant credential the secret holds ("": the cluster credential).
	Credential string
	// Configuration is the identity of the configuration reading it: another configuration's
	// mark on the Secret is listed among its other owners.
	Configuration string
	// OutsideRoles: the identity's roles cover nothing in the namespace (it gained the consumer
	// label after they were rendered): the secret is neither read nor written.
	OutsideRoles bool
	// Contested are the credentials whose consumers all name it (two selectors match its
	// namespace, with the same secret name; the cluster credential as ""): which it should hold
	// is the configuration's to say, so it is neither read nor written.
	Contested []string
	// Marks are this configuration's credential marks, the cluster credential's first: another
	// of them on the Secret is a move between credentials (plan.SecretObs.Moved).
	Marks []string
}

// mark is the credential mark the target's Secret carries once written.
func (t SecretTarget) mark() string {
	if len(t.Marks) == 0 {
		return t.Credential
	}

	return CredentialMark(t.Credential, t.Marks[0])
}

// movedFrom is the credential (the cluster's as "") whose mark the Secret carries instead of the
// target's own, if it is another of this configuration's and the Secret is this configuration's.
func (t SecretTarget) movedFrom(s *corev1.Secret) (string, bool) {
	m := s.Annotations[object.CredentialAnnotation]
	if m == "" || m == t.mark() || !slices.Contains(t.Marks, m) || OtherConfiguration(s, t.Configuration) != "" {
		return "", false
	}

	if m == t.Marks[0] {
		return "", true
	}

	return m, true
}

// SelectedNamespaces lists the names of the namespaces matching a label selector, sorted.
func (c *Connection) SelectedNamespaces(ctx context.Context, selector string) ([]string, error) {
	nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, c.Unreachable("list consumer namespaces", err)
	}

	out := make([]string, 0, len(nss.Items))
	for _, ns := range nss.Items {
		out = append(out, ns.Name)
	}

	sort.Strings(out)

	return out, nil
}

// ConsumerTargets expands the configured consumers: explicit ones, and the secret in every
// selected namespace (those a consumer selector matches), sorted by namespace and name.
func ConsumerTargets(explicit []SecretTarget, selected []string, secret string, sas []string, credential string) []SecretTarget {
	out := append([]SecretTarget(nil), explicit...)

	for _, ns := range selected {
		t := SecretTarget{Namespace: ns, Name: secret, Role: plan.RoleConsumer, ServiceAccounts: sas, Credential: credential}
		if !slices.ContainsFunc(out, func(x SecretTarget) bool { return x.Namespace == t.Namespace && x.Name == t.Name }) {
			out = append(out, t)
		}
	}

	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })

	return out
}

// CredentialMark is the ghcrsync.dev/credential mark of a pull secret holding credential (a
// tenant's name, or "" for the cluster credential, named clusterCredential).
func CredentialMark(credential, clusterCredential string) string {
	if credential != "" {
		return credential
	}

	return clusterCredential
}

// OtherConfiguration names the other ghcrsync configuration whose mark the Secret carries ("":
// none, or self's): a pull secret two configurations write is a tug of war, which plan lists
// among the other owners. It is not refused: a configuration whose Lease was renamed would
// otherwise wedge on its own marks.
func OtherConfiguration(s *corev1.Secret, self string) string {
	v := s.Annotations[object.ConfigurationAnnotation]
	if v == "" || v == self || self == "" {
		return ""
	}

	what := "ghcrsync configuration " + strconv.Quote(v)
	if c := s.Annotations[object.CredentialAnnotation]; c != "" {
		what += " (credential " + strconv.Quote(c) + ")"
	}

	return what
}

// Foreign says which controller owns the Secret ("" if none): an ownerReference, an
// External Secrets or Flux label. ghcrsync never writes such a Secret.
func Foreign(s *corev1.Secret) string {
	for _, o := range s.OwnerReferences {
		return o.Kind + " " + s.Namespace + "/" + o.Name
	}

	for k, v := range s.Labels {
		switch {
		case strings.HasPrefix(k, "reconcile.external-secrets.io/"), strings.HasPrefix(k, "external-secrets.io/"):
			return "External Secrets (" + k + "=" + v + ")"
		case k == "kustomize.toolkit.fluxcd.io/name", k == "helm.toolkit.fluxcd.io/name":
			return "Flux (" + k + "=" + v + ")"
		}
	}

	return ""
}

// ObserveSecret reads a target: the Secret's type, digest and owner, and which of its service
// accounts do not reference it yet (an absent service account is not counted: ghcrsync does
// not create them).
//
// It also returns the registry credential the Secret holds (nil if none, or unreadable), kept
// in memory only: `plan` asks the registry whether it still pulls.
func (c *Connection) ObserveSecret(ctx context.Context, t SecretTarget, registry string) (plan.SecretObs, *credential.Credential, error) {
	var held *credential.Credential

	obs := plan.SecretObs{Namespace: t.Namespace, Name: t.Name, Role: t.Role, Credential: t.Credential, OutsideRoles: t.OutsideRoles, Contested: t.Contested}
	if t.OutsideRoles || len(t.Contested) > 0 {
		return obs, nil, nil
	}

	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, t.Namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		obs.NamespaceMissing = true

		return obs, held, nil
	} else if err != nil {
		return obs, nil, c.Unreachable("read namespace "+t.Namespace, err)
	}

	s, err := c.Client.CoreV1().Secrets(t.Namespace).Get(ctx, t.Name, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return obs, nil, c.Unreachable(fmt.Sprintf("read secret %s/%s", t.Namespace, t.Name), err)
	default:
		obs.Exists, obs.Type, obs.Foreign = true, string(s.Type), Foreign(s)
		obs.OtherConfiguration = OtherConfiguration(s, t.Configuration)

		if from, ok := t.movedFrom(s); ok {
			obs.Moved, obs.MovedFrom = true, from
			obs.MoveDeclared = c.moveDeclared(ctx, s, t.mark())
		}

		obs.Writers = Writers(s.ObjectMeta, corev1.DockerConfigJsonKey)
		if data, ok := s.Data[corev1.DockerConfigJsonKey]; ok {
			obs.Digest = authdigest.DockerConfig(data)
			held, _ = credential.Parse(data, registry)
		}
	}

	for _, name := range t.ServiceAccounts {
		sa, err := c.Client.CoreV1().ServiceAccounts(t.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}

		if err != nil {
			return obs, nil, c.Unreachable("read service account "+t.Namespace+"/"+name, err)
		}

		if !slices.ContainsFunc(sa.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == t.Name }) {
			obs.MissingFrom = append(obs.MissingFrom, name)
		}
	}

	return obs, held, nil
}

// SecretsPolicy is the admission policy that bounds the identities' Secret writes: rendered
// for a configuration, it pins each pull secret's credential mark (internal/permission).
const SecretsPolicy = "ghcrsync-secrets"

// moveDeclared reports whether moving s to the credential mark to is declared: the roles were
// rendered with its namespace under that credential, and are in force. Both are asked of the
// API server as server-side dry runs of a mark-only update (no credential is sent, nothing is
// stored): the mark to is admitted, and a mark no rendering names is refused by
// ghcrsync-secrets (the pins are in force). With no policy in force, nothing declares a move.
func (c *Connection) moveDeclared(ctx context.Context, s *corev1.Secret, to string) bool {
	try := func(mark string) error {
		next := s.DeepCopy()
		next.ResourceVersion = "" // a dry run: nothing to compare and swap
		metav1.SetMetaDataAnnotation(&next.ObjectMeta, object.CredentialAnnotation, mark)
		_, err := c.Client.CoreV1().Secrets(s.Namespace).Update(ctx, next, metav1.UpdateOptions{DryRun: []string{dryRun}})

		return err
	}

	return try(to) == nil && refusedBy(try(escapeMarker), SecretsPolicy)
}

// TemplateValue reads one key of a node template's Secret.
func (c *Connection) TemplateValue(ctx context.Context, namespace, name, key string) ([]byte, TemplateMeta, error) {
	s, err := c.Client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
		return nil, TemplateMeta{}, fmt.Errorf("the Secret does not exist")
	case err != nil:
		return nil, TemplateMeta{}, c.Unreachable("read Secret "+namespace+"/"+name, err)
	}

	v, err := keyOf(s, key)

	return v, TemplateMeta{Written: changedAt(s.ObjectMeta, "f:data"), Foreign: Foreign(s), Writers: Writers(s.ObjectMeta, key)}, err
}

// TemplateMeta is what a template Secret says of who writes it: when its data last changed, the
// controller that owns it (Foreign) and every other writer of its key.
type TemplateMeta struct {
	Written time.Time
	Foreign string
	Writers []plan.Writer
}

// Writers are the field managers other than ghcrsync that own the Secret's data key (its
// managedFields): whoever else writes the credential — a controller, a script, kubectl.
func Writers(m metav1.ObjectMeta, key string) []plan.Writer {
	var out []plan.Writer

	for _, e := range m.ManagedFields {
		if e.Manager == FieldManager || e.FieldsV1 == nil {
			continue
		}

		var fields map[string]map[string]any
		if json.Unmarshal(e.FieldsV1.Raw, &fields) != nil {
			continue
		}

		if _, ok := fields["f:data"]["f:"+key]; !ok {
			continue
		}

		w := plan.Writer{Manager: e.Manager, Operation: string(e.Operation)}
		if e.Time != nil {
			w.At = e.Time.UTC()
		}

		out = append(out, w)
	}

	return out
}

// changedAt is when the object's field (a managedFields path element such as "f:data") last
// changed, by the apiserver's clock; its creation if no manager's entry names it.
func changedAt(m metav1.ObjectMeta, field string) time.Time {
	at := m.CreationTimestamp.Time

	for _, e := range m.ManagedFields {
		if e.Time != nil && e.FieldsV1 != nil && bytes.Contains(e.FieldsV1.Raw, []byte(`"`+field+`"`)) && e.Time.After(at) {
			at = e.Time.Time
		}
	}

	return at
}

// TemplateReader is the deployment ("namespace/name") that reads a node template when its pods
// start: when the oldest of its running pods was created — the last moment any of them read the
// template, the rollout's own evidence, not a managedFields time another field's writer (a Helm
// or Flux label change) also moves — and whether its rollout is done.
func (c *Connection) TemplateReader(ctx context.Context, nsName string) (*plan.ReaderObs, error) {
	ns, name, _ := strings.Cut(nsName, "/")

	d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
		return &plan.ReaderObs{Missing: true}, nil
	case err != nil:
		return nil, c.Unreachable("read deployment "+nsName, err)
	}

	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("deployment %s: its selector: %w", nsName, err)
	}

	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, c.Unreachable("list the pods of deployment "+nsName, err)
	}

	obs := &plan.ReaderObs{RolledOut: RolledOut(d)}

	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}

		if at := p.CreationTimestamp.Time; obs.StartedFrom.IsZero() || at.Before(obs.StartedFrom) {
			obs.StartedFrom = at
		}
	}

	obs.Idle = obs.StartedFrom.IsZero()

	return obs, nil
}

// RolledOut is `kubectl rollout status`'s rule: the controller saw the current spec, and every
// replica runs its pod template and is available.
func RolledOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}

	st := d.Status

	return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas >= want && st.Replicas == st.UpdatedReplicas && st.AvailableReplicas >= st.UpdatedReplicas
}

func keyOf(s *corev1.Secret, key string) ([]byte, error) {
	v, ok := s.Data[key]
	if !ok {
		keys := make([]string, 0, len(s.Data))
		for k := range s.Data {
			keys = append(keys, k)
		}

		sort.Strings(keys)

		return nil, fmt.Errorf("the Secret has no key %s (its keys: %s)", key, strings.Join(keys, ", "))
	}

	return v, nil
}
