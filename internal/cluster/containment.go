package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// An Escape is a write an identity's rights allow and its admission policy must refuse: the
// proof, made as a server-side dry run (nothing is stored), that the policy is in force. Each
// kind is one field outside what ghcrsync writes on an object it may write.
type Escape struct {
	Kind      EscapeKind
	Policy    string // the policy that must refuse it
	Namespace string
	Name      string
	// Probe is the probe pod's service account and image, for EscapePod: the escape is that pod
	// with a Secret mounted.
	Probe Probe
	// Writer is the keyring writer, for EscapeWriterPod: the escape is its pod mounting the
	// node's root instead of the kubelet's root directory.
	Writer keyring.Writer
}

// EscapeKind is what an Escape writes.
type EscapeKind string

// The escapes, one per bounded write.
const (
	EscapeTokenSecret    EscapeKind = "a service-account token Secret"
	EscapeSecretAnnotate EscapeKind = "a service-account annotation on a Secret"
	EscapeNodeLabel      EscapeKind = "a label on a Node"
	EscapeAccountToken   EscapeKind = "automountServiceAccountToken on a ServiceAccount"
	EscapeDeploymentSA   EscapeKind = "the service account of a Deployment's pod template"
	EscapeKustomization  EscapeKind = "spec.serviceAccountName of a Kustomization"
	EscapeOCIRepository  EscapeKind = "spec.url of an OCIRepository"
	EscapePod            EscapeKind = "a probe pod mounting a Secret"
	EscapeWriterPod      EscapeKind = "a keyring writer pod mounting the node's root"
	EscapeNoExecuteTaint EscapeKind = "the steering taint with effect NoExecute on a Node"
	EscapeForeignLease   EscapeKind = "a Lease of another name"
	EscapeOpaqueSecret   EscapeKind = "an Opaque Secret of another name"
	EscapeSecretKey      EscapeKind = "a second key in a pull secret"
	EscapeCredentialMark EscapeKind = "a pull secret marked with another credential"
	EscapeTemplateKey    EscapeKind = "a key of a node template besides its configured one"
	EscapeForgedEvent    EscapeKind = "an Event posing as the kubelet"
	EscapeDaemonSetSpec  EscapeKind = "the service account of kured's DaemonSet's pod template"
)

func (e Escape) String() string {
	where := e.Name
	if e.Namespace != "" && e.Name != "" {
		where = e.Namespace + "/" + e.Name
	} else if e.Namespace != "" {
		where = "namespace " + e.Namespace
	}

	if where == "" {
		return string(e.Kind)
	}

	return string(e.Kind) + " (" + where + ")"
}

// escapeMarker is the name of everything an escape writes: no object of ghcrsync's carries it.
const escapeMarker = "ghcrsync-containment-check"

// ErrNotContained is a policy that admitted an escape: the identity's writes are not bounded.
var ErrNotContained = errors.New("not contained")

// Contained tries each escape as a server-side dry run and returns nil only when every one is
// refused by its own policy. An escape whose object does not exist proves nothing and is
// skipped; one refused by anything else (RBAC, another webhook) is an error naming it.
func (c *Connection) Contained(ctx context.Context, escapes []Escape) error {
	for _, e := range escapes {
		err := c.escape(ctx, e)

		switch {
		case err == nil:
			return fmt.Errorf("%w: the admission policy %s admitted a dry run of %s, a write it exists to refuse", ErrNotContained, e.Policy, e)
		case apierrors.IsNotFound(err), meta.IsNoMatchError(err), errors.Is(err, errNothingToTry):
			continue
		case refusedBy(err, e.Policy):
			continue
		default:
			return fmt.Errorf("%w: a dry run of %s was answered %s, not refused by the admission policy %s",
				ErrNotContained, e, redact.Error(err), e.Policy)
		}
	}

	return nil
}

// refusedBy reports whether err is the API server's ValidatingAdmissionPolicy plugin refusing a
// request by policy.
func refusedBy(err error, policy string) bool {
	return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

var errNothingToTry = errors.New("no object to try the escape on")

var dryRun = metav1.DryRunAll

// escape makes the escape's write as a dry run.
func (c *Connection) escape(ctx context.Context, e Escape) error {
	create := metav1.CreateOptions{DryRun: []string{dryRun}}
	patch := func(body map[string]any) []byte { b, _ := json.Marshal(body); return b }
	opts := metav1.PatchOptions{DryRun: []string{dryRun}}

	switch e.Kind {
	case EscapeTokenSecret, EscapeSecretAnnotate, EscapeOpaqueSecret, EscapeSecretKey, EscapeTemplateKey, EscapeCredentialMark:
		return c.escapeSecrets(ctx, e)
	case EscapeForgedEvent, EscapePod, EscapeWriterPod:
		return c.escapeCreates(ctx, e)
	case EscapeNodeLabel:
		return c.escapeNode(ctx, patch(map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/" + escapeMarker: "true"}}}), opts)
	case EscapeAccountToken:
		_, err := c.Client.CoreV1().ServiceAccounts(e.Namespace).Patch(ctx, e.Name, types.MergePatchType,
			patch(map[string]any{"automountServiceAccountToken": true, "secrets": []any{map[string]any{"name": escapeMarker}}}), opts)

		return err
	case EscapeDeploymentSA:
		_, err := c.Client.AppsV1().Deployments(e.Namespace).Patch(ctx, e.Name, types.StrategicMergePatchType,
			patch(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"serviceAccountName": escapeMarker}}}}), opts)

		return err
	case EscapeDaemonSetSpec:
		_, err := c.Client.AppsV1().DaemonSets(e.Namespace).Patch(ctx, e.Name, types.StrategicMergePatchType,
			patch(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"serviceAccountName": escapeMarker}}}}), opts)

		return err
	case EscapeKustomization:
		return c.escapeCustom(ctx, Kustomizations, e, patch(map[string]any{"spec": map[string]any{"serviceAccountName": escapeMarker}}), opts)
	case EscapeOCIRepository:
		return c.escapeCustom(ctx, OCIRepositories, e, patch(map[string]any{"spec": map[string]any{"url": "oci://" + escapeMarker + ".invalid/escape"}}), opts)
	case EscapeNoExecuteTaint:
		return c.escapeNoExecute(ctx, opts)
	case EscapeForeignLease:
		_, err := c.Client.CoordinationV1().Leases(e.Namespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: escapeMarker, Namespace: e.Namespace}}, create)

		return err
	}

	return fmt.Errorf("unknown escape %q", e.Kind)
}

// escapeCreates makes the escapes that create an object (an Event, a pod) as dry runs.
func (c *Connection) escapeCreates(ctx context.Context, e Escape) error {
	create := metav1.CreateOptions{DryRun: []string{dryRun}}

	switch e.Kind {
	case EscapeForgedEvent:
		now := metav1.Now()
		_, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: escapeMarker, Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: metav1.NamespaceDefault, Name: escapeMarker, APIVersion: "v1"},
			Reason:         "Pulled", Message: "Successfully pulled image", Type: corev1.EventTypeNormal,
			Source:         corev1.EventSource{Component: "kubelet", Host: escapeMarker},
			FirstTimestamp: now, LastTimestamp: now, Count: 1, ReportingController: "kubelet", ReportingInstance: escapeMarker,
		}, create)

		return err
	case EscapePod:
		pod := probe.Pod(escapeMarker, Probe{Image: e.Probe.Image, Namespace: e.Namespace, ServiceAccount: e.Probe.ServiceAccount}, "containment-check")
		pod.Spec.Volumes = []corev1.Volume{{Name: "stolen", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: escapeMarker}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "stolen", MountPath: "/stolen", ReadOnly: true}}
		pod.Spec.Containers[0].Command = []string{"/bin/true"}
		pod.Spec.TerminationGracePeriodSeconds = ptr.To(int64(0))

		_, err := c.Client.CoreV1().Pods(e.Namespace).Create(ctx, pod, create)

		return err
	case EscapeWriterPod:
		pod := keyring.Pod(escapeMarker, e.Writer, keyring.ModeRead, "/", "containment-check")

		_, err := c.Client.CoreV1().Pods(e.Writer.Namespace).Create(ctx, pod, create)

		return err
	}

	return fmt.Errorf("unknown escape %q", e.Kind)
}

// escapeSecrets makes a Secret escape's write as a dry run.
func (c *Connection) escapeSecrets(ctx context.Context, e Escape) error {
	create := metav1.CreateOptions{DryRun: []string{dryRun}}

	switch e.Kind {
	case EscapeTokenSecret:
		_, err := c.Client.CoreV1().Secrets(e.Namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: escapeMarker, Namespace: e.Namespace, Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}},
			Type:       corev1.SecretTypeServiceAccountToken}, create)

		return err
	case EscapeSecretAnnotate: // an update: the right a state Secret's writer holds
		s, err := c.Client.CoreV1().Secrets(e.Namespace).Get(ctx, e.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		metav1.SetMetaDataAnnotation(&s.ObjectMeta, corev1.ServiceAccountNameKey, "default")
		s.ResourceVersion = ""
		_, err = c.Client.CoreV1().Secrets(e.Namespace).Update(ctx, s, metav1.UpdateOptions{DryRun: []string{dryRun}})

		return err
	case EscapeOpaqueSecret:
		_, err := c.Client.CoreV1().Secrets(e.Namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: escapeMarker, Namespace: e.Namespace}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"HCLOUD_TOKEN": []byte(escapeMarker)}}, create)

		return err
	case EscapeSecretKey, EscapeTemplateKey:
		return c.escapeSecret(ctx, e, func(s *corev1.Secret) {
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}

			s.Data[escapeMarker] = []byte(escapeMarker)
		})
	case EscapeCredentialMark:
		return c.escapeSecret(ctx, e, func(s *corev1.Secret) {
			metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.CredentialAnnotation, escapeMarker)
		})
	}

	return fmt.Errorf("unknown Secret escape %q", e.Kind)
}

// escapeSecret updates the Secret e names as change says (one that does not exist proves nothing).
func (c *Connection) escapeSecret(ctx context.Context, e Escape, change func(*corev1.Secret)) error {
	s, err := c.Client.CoreV1().Secrets(e.Namespace).Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}

	change(s)
	s.ResourceVersion = "" // a dry run: no compare-and-swap for a concurrent write to lose to

	_, err = c.Client.CoreV1().Secrets(e.Namespace).Update(ctx, s, metav1.UpdateOptions{DryRun: []string{dryRun}})

	return err
}

// escapeNoExecute adds the steering taint, with effect NoExecute, to the first Node's taints.
func (c *Connection) escapeNoExecute(ctx context.Context, opts metav1.PatchOptions) error {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return err
	}

	if len(list.Items) == 0 {
		return errNothingToTry
	}

	n := list.Items[0]
	t := append(slices.Clone(n.Spec.Taints), corev1.Taint{Key: taints.Steering, Value: taints.RunToken(escapeMarker), Effect: corev1.TaintEffectNoExecute})
	// No resourceVersion: a dry run stores nothing, and a kubelet heartbeat between the list and
	// the patch must not turn the proof into a conflict that fails the preflight.
	body, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": t}})

	_, err = c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, body, opts)

	return err
}

// escapeNode patches the first Node (any will do: the policy bounds them all).
func (c *Connection) escapeNode(ctx context.Context, body []byte, opts metav1.PatchOptions) error {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return err
	}

	if len(list.Items) == 0 {
		return errNothingToTry
	}

	_, err = c.Client.CoreV1().Nodes().Patch(ctx, list.Items[0].Name, types.MergePatchType, body, opts)

	return err
}

func (c *Connection) escapeCustom(ctx context.Context, gvr schema.GroupVersionResource, e Escape, body []byte, opts metav1.PatchOptions) error {
	dyn, err := c.Dynamic()
	if err != nil {
		return err
	}

	_, err = dyn.Resource(gvr).Namespace(e.Namespace).Patch(ctx, e.Name, types.MergePatchType, body, opts)

	return err
}

// ReconcileRequestAnnotation asks a Flux source to reconcile now: the one field ghcrsync writes on
// an OCIRepository.
const ReconcileRequestAnnotation = "reconcile.fluxcd.io/requestedAt"

// RestartedAtAnnotation is what `kubectl rollout restart` (and ghcrsync's restart of a node
// template's reader) sets on a Deployment's pod template: the one field ghcrsync writes there.
const RestartedAtAnnotation = "kubectl.kubernetes.io/restartedAt"

// OCIRepositories is Flux's OCIRepository resource: the source of the root Kustomization.
var OCIRepositories = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "ocirepositories"}
