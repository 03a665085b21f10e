// Package fanout writes the rotated credential into the copies Kubernetes holds: the node
// templates new machines boot from (before the nodes), the consumer pull secrets (after them),
// and last the root Flux secret — only when nothing uses the old credential any more, since the
// root secret is what lets the cluster deliver its own fixes.
package fanout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// clockOf is the fan-out's clock (Options.Clock, clock.System when unset).
func clockOf(o secretwrite.Options) clock.Clock { return clock.Or(o.Clock) }

// dataFor is what the pull secret receives: its credential's dockerconfigjson (nil: a tenant this
// run was not given, which writes nothing).
func dataFor(o secretwrite.Options, sp plan.SecretPlan) []byte {
	if sp.Credential == "" {
		return o.Data
	}

	return o.Tenants[sp.Credential]
}

// marksFor are the annotations that say which configuration and credential wrote the secret.
func marksFor(o secretwrite.Options, sp plan.SecretPlan) map[string]string {
	name := cluster.CredentialMark(sp.Credential, o.Credential)

	out := map[string]string{}
	if o.Configuration != "" {
		out[object.ConfigurationAnnotation] = o.Configuration
	}

	if name != "" {
		out[object.CredentialAnnotation] = name
	}

	return out
}

// writeMode is the write's dryRun option: All in a dry run, none otherwise.
func writeMode(o secretwrite.Options) []string {
	if o.DryRun {
		return []string{metav1.DryRunAll}
	}

	return nil
}

// Consumers writes every consumer pull secret of the plan.
func Consumers(ctx context.Context, kube kubernetes.Interface, p *plan.Plan, o secretwrite.Options) []secretwrite.Result {
	var out []secretwrite.Result

	for _, sp := range p.Secrets {
		if sp.Role != plan.RoleRoot {
			out = append(out, write(ctx, kube, sp, o))
		}
	}

	return out
}

// Templates writes the node templates: before any node is fenced, so machines created during
// the run boot with the new credential.
func Templates(ctx context.Context, kube kubernetes.Interface, p *plan.Plan, o secretwrite.Options) []secretwrite.Result {
	out := make([]secretwrite.Result, 0, len(o.Templates))

	for _, t := range o.Templates {
		out = append(out, writeTemplate(ctx, kube, t, p, o))
	}

	return out
}

// Root writes the root Flux secret — last, and only when heldBack is "": otherwise it keeps its
// old credential and heldBack says why (something still uses the old one). A written root is
// followed by a reconcile request of the OCIRepository, if one is configured.
func Root(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, p *plan.Plan, o secretwrite.Options, heldBack string) []secretwrite.Result {
	var out []secretwrite.Result

	for _, sp := range p.Secrets {
		if sp.Role != plan.RoleRoot {
			continue
		}

		switch {
		case sp.Action != plan.SecretCreate && sp.Action != plan.SecretUpdate:
			out = append(out, result(sp, skippedOrUnchanged(sp), sp.Reason))
		case heldBack != "":
			out = append(out, result(sp, secretwrite.HeldBack, "the root Flux secret keeps its old credential: "+heldBack))
		default:
			r := write(ctx, kube, sp, o)
			if r.Outcome == secretwrite.Written && o.OCIRepository != "" {
				r = reconcileRoot(ctx, dyn, sp.Namespace, o, r)
			}

			out = append(out, r)
		}
	}

	return out
}

func result(sp plan.SecretPlan, outcome secretwrite.Outcome, msg string) secretwrite.Result {
	return secretwrite.Result{Namespace: sp.Namespace, Secret: sp.Secret, Role: sp.Role, Outcome: outcome, Message: msg}
}

func skippedOrUnchanged(sp plan.SecretPlan) secretwrite.Outcome {
	if sp.Action == plan.SecretSkip {
		return secretwrite.Skipped
	}

	return secretwrite.Unchanged
}

var (
	errForeign       = errors.New("managed by another controller")
	errNamespaceGone = errors.New("its namespace was deleted since the plan")
)

// namespaceGone reports whether a create was refused because the namespace no longer exists or
// is being deleted.
func namespaceGone(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}

	details := st.Status().Details

	return (apierrors.IsNotFound(err) && details != nil && details.Kind == "namespaces") ||
		apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)
}

// write creates or compare-and-swap updates the secret, reads it back, and adds it to its
// service accounts.
func write(ctx context.Context, kube kubernetes.Interface, sp plan.SecretPlan, o secretwrite.Options) secretwrite.Result {
	if sp.Action != plan.SecretCreate && sp.Action != plan.SecretUpdate {
		return result(sp, skippedOrUnchanged(sp), sp.Reason)
	}

	fail := func(err error) secretwrite.Result { return result(sp, secretwrite.Failed, redact.Logged(o.Log, err)) }

	if err := o.Assert(ctx); err != nil {
		return fail(fmt.Errorf("not written: %w", err))
	}

	if err := o.Record(sp.Namespace, sp.Secret, sp.Role, state.SecretWriting); err != nil {
		return fail(err)
	}

	secrets := kube.CoreV1().Secrets(sp.Namespace)
	where := sp.Namespace + "/" + sp.Secret

	retries, err := put(ctx, secrets, sp, o)
	if errors.Is(err, errNamespaceGone) {
		if err := o.Record(sp.Namespace, sp.Secret, sp.Role, string(secretwrite.Skipped)); err != nil {
			return fail(err)
		}

		return result(sp, secretwrite.Skipped, err.Error()+" (or is being deleted): no pod there can pull with it; nothing written")
	}

	if err != nil {
		return fail(err)
	}

	back, err := secrets.Get(ctx, sp.Secret, metav1.GetOptions{})
	switch {
	case err != nil:
		return fail(fmt.Errorf("read-back of %s failed: %w", where, err))
	case !bytes.Equal(back.Data[corev1.DockerConfigJsonKey], dataFor(o, sp)):
		return fail(fmt.Errorf("read-back of %s does not match what was written", where))
	}

	for _, sa := range sp.ServiceAccounts {
		if err := addPullSecret(ctx, kube, sp.Namespace, sa, sp.Secret); err != nil {
			return fail(err)
		}
	}

	if err := o.Record(sp.Namespace, sp.Secret, sp.Role, string(secretwrite.Written)); err != nil {
		return fail(err)
	}

	msg := "written and read back"
	if retries > 0 {
		msg += fmt.Sprintf(" (after %d concurrent write(s), re-read and retried)", retries)
	}

	if len(sp.ServiceAccounts) > 0 {
		msg += "; referenced from service account(s) " + fmt.Sprint(sp.ServiceAccounts)
	}

	return result(sp, secretwrite.Written, msg)
}

// pullSecret is the pull secret sp names, as ghcrsync creates it: dockerconfigjson holding data,
// labelled as ghcrsync's, with its marks.
func pullSecret(sp plan.SecretPlan, data []byte, marks map[string]string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sp.Secret, Namespace: sp.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "ghcrsync"}, Annotations: marks},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: data},
	}
}

// withCredential is cur holding data under its dockerconfigjson key, with the marks added.
func withCredential(cur *corev1.Secret, data []byte, marks map[string]string) *corev1.Secret {
	next := cur.DeepCopy()
	if next.Data == nil {
		next.Data = map[string][]byte{}
	}

	next.Data[corev1.DockerConfigJsonKey] = data

	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}

	maps.Copy(next.Annotations, marks)

	return next
}

// put creates the secret, or compare-and-swap updates it (carrying the read resourceVersion),
// re-reading and retrying when another writer got in between. It refuses a secret that became
// managed by another controller or changed type since the plan.
func put(ctx context.Context, secrets typedcorev1.SecretInterface, sp plan.SecretPlan, o secretwrite.Options) (retries int, err error) {
	where := sp.Namespace + "/" + sp.Secret

	data := dataFor(o, sp)
	if len(data) == 0 {
		return 0, fmt.Errorf("%s: this run holds no credential %q to write; not written", where, sp.Credential)
	}

	return landed(ctx, clockOf(o), where, func(attempt int) error {
		cur, err := secrets.Get(ctx, sp.Secret, metav1.GetOptions{})

		switch {
		case apierrors.IsNotFound(err):
			between(o.Hooks, sp, attempt)

			if err := o.Assert(ctx); err != nil {
				return fmt.Errorf("%s not written: %w", where, err)
			}

			_, err = secrets.Create(ctx, pullSecret(sp, data, marksFor(o, sp)), metav1.CreateOptions{DryRun: writeMode(o)})
			if namespaceGone(err) {
				return fmt.Errorf("%s: %w", where, errNamespaceGone)
			}
		case err != nil:
			return fmt.Errorf("read %s: %w", where, err)
		case cluster.Foreign(cur) != "":
			return fmt.Errorf("%s became managed by %s since the plan: %w; not written", where, cluster.Foreign(cur), errForeign)
		case cur.Type != corev1.SecretTypeDockerConfigJson:
			return fmt.Errorf("%s is now of type %s: not written", where, cur.Type)
		case bytes.Equal(cur.Data[corev1.DockerConfigJsonKey], data) && marked(cur, marksFor(o, sp)):
			return nil
		default:
			between(o.Hooks, sp, attempt)

			if err := o.Assert(ctx); err != nil {
				return fmt.Errorf("%s not written: %w", where, err)
			}

			_, err = secrets.Update(ctx, withCredential(cur, data, marksFor(o, sp)), metav1.UpdateOptions{DryRun: writeMode(o)})
		}

		if err != nil {
			return fmt.Errorf("write %s: %w", where, err)
		}

		return nil
	})
}

// marked reports whether s carries every one of marks.
func marked(s *corev1.Secret, marks map[string]string) bool {
	for k, v := range marks {
		if s.Annotations[k] != v {
			return false
		}
	}

	return true
}

// landed runs read-modify-write attempts until one lands. An attempt reads, decides, and
// returns its write's error (nil: written, or nothing to write) or a refusal; an attempt whose
// write lost to a concurrent writer (Conflict on update, AlreadyExists on create) is retried
// from a fresh read, up to 5 attempts in all.
//
// A write whose answer was lost (answer.Lost) is tried again the same way: its fresh read
// finds it landed (the Secret already holds what was written) or not.
func landed(ctx context.Context, clk clock.Clock, where string, attempt func(n int) error) (retries int, err error) {
	for n := range 5 {
		err := attempt(n)

		switch {
		case answer.Lost(err):
			_ = clock.Sleep(ctx, clk, time.Duration(n+1)*500*time.Millisecond) // a cancel: the next attempt's read says so
		case !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err):
			return retries, err
		}

		retries++
	}

	return retries, fmt.Errorf("%s kept changing under concurrent writers; not written", where)
}

func betweenTemplate(h secretwrite.Hooks, t config.NodeTemplate, attempt int) {
	if h.BetweenTemplateReadAndWrite != nil {
		h.BetweenTemplateReadAndWrite(t, attempt)
	}
}

func between(h secretwrite.Hooks, sp plan.SecretPlan, attempt int) {
	if h.BetweenReadAndWrite != nil {
		h.BetweenReadAndWrite(sp.Namespace, sp.Secret, attempt)
	}
}

// addPullSecret adds secret to the service account's imagePullSecrets once (CAS on update).
func addPullSecret(ctx context.Context, kube kubernetes.Interface, ns, name, secret string) error {
	for range 5 {
		sa, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // ghcrsync does not create service accounts
		}

		if err != nil {
			return err
		}

		if slices.ContainsFunc(sa.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == secret }) {
			return nil
		}

		// Only the list, and only if the account is still as read (its resourceVersion): a merge
		// patch replaces the list whole. A lost answer is looked for at the next read (the
		// reference is there, or not).
		patch, _ := json.Marshal(map[string]any{
			"metadata":         map[string]any{"resourceVersion": sa.ResourceVersion},
			"imagePullSecrets": append(slices.Clone(sa.ImagePullSecrets), corev1.LocalObjectReference{Name: secret}),
		})

		if _, err = kube.CoreV1().ServiceAccounts(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsConflict(err) && !answer.Lost(err) {
			return err
		}
	}

	return fmt.Errorf("service account %s/%s kept changing; %s not added", ns, name, secret)
}

// reconcile asks Flux to reconcile the OCIRepository now.
func reconcile(ctx context.Context, dyn dynamic.Interface, ns, name, token string) (msg string, asked bool) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		cluster.ReconcileRequestAnnotation: token,
	}}})

	_, err := dyn.Resource(cluster.OCIRepositories).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})

	switch {
	case err == nil:
		return "reconcile of OCIRepository " + ns + "/" + name + " requested", true
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return "no OCIRepository " + ns + "/" + name + " to reconcile", false
	}

	return "requesting a reconcile of OCIRepository " + ns + "/" + name + " failed: " + redact.Error(err), false
}

// reconcileRoot asks Flux to reconcile the root's OCIRepository after its secret was written
// and, under RootProof, waits for source-controller to have handled that request and judges the
// source then: Ready is a pull with the new credential; anything else, or no answer within
// RootProof, leaves the root not proved (NotProved says why).
func reconcileRoot(ctx context.Context, dyn dynamic.Interface, ns string, o secretwrite.Options, r secretwrite.Result) secretwrite.Result {
	clk, name := clockOf(o), o.OCIRepository
	token := clk.Now().UTC().Format(time.RFC3339Nano)

	msg, asked := reconcile(ctx, dyn, ns, name, token)
	r.Message += "; " + msg

	if o.RootProof <= 0 {
		return r
	}

	if !asked { // fail closed: a misnamed source would leave Flux's real one unproved
		r.NotProved = msg + " (flux_root.oci_repository names none Flux reconciles; without Flux, set flux_root.prove = false)"
		r.Message += "; Flux could not pull with the new root credential: " + r.NotProved

		return r
	}

	var proof rootProof

	_ = clock.Until(ctx, clk, o.RootProof, time.Second, func() (bool, error) { // its own answer (timed out, cancelled) is proof.handled false
		src, err := dyn.Resource(cluster.OCIRepositories).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			proof = rootProof{why: "OCIRepository " + ns + "/" + name + " could not be read: " + redact.Error(err)}

			return false, nil // read again until the bound: the API may be back
		}

		proof = judgeRoot(src.Object, token)

		return proof.handled, nil
	})

	switch {
	case proof.handled && proof.ready:
		r.Message += "; Flux's source-controller pulled it with the new credential (" + proof.why + ")"
	case proof.handled:
		r.NotProved = proof.why
	default: // the bound passed, or the run was cancelled, before an answer
		r.NotProved = "no answer within " + o.RootProof.String() + " (flux_root.proof_timeout): " + proof.why
	}

	if r.NotProved != "" {
		r.Message += "; Flux could not pull with the new root credential: " + r.NotProved
	}

	return r
}

// rootProof is the root source as judged after a reconcile request: whether source-controller
// handled it, whether the source was Ready then, and what it says.
type rootProof struct {
	handled, ready bool
	why            string
}

// judgeRoot judges an OCIRepository (its object, as read) after the reconcile requested with
// token: handled once its status.lastHandledReconcileAt is token; then Ready=True (for the
// object's generation) is a pull with the credential the secret holds, naming the artifact, and
// anything else says why not.
func judgeRoot(obj map[string]any, token string) rootProof {
	handled, _, _ := unstructured.NestedString(obj, "status", "lastHandledReconcileAt")
	if handled != token {
		return rootProof{why: "source-controller has not handled the reconcile asked at " + token + " yet"}
	}

	gen, _, _ := unstructured.NestedInt64(obj, "metadata", "generation")
	conds, _, _ := unstructured.NestedSlice(obj, "status", "conditions")

	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != "Ready" {
			continue
		}

		status, _ := m["status"].(string)
		reason, _ := m["reason"].(string)
		message, _ := m["message"].(string)
		observed, _, _ := unstructured.NestedInt64(m, "observedGeneration")

		switch {
		case observed != 0 && observed != gen:
			return rootProof{handled: true, why: fmt.Sprintf("its Ready condition is of generation %d, not %d", observed, gen)}
		case status == "True":
			digest, _, _ := unstructured.NestedString(obj, "status", "artifact", "digest")

			return rootProof{handled: true, ready: true, why: "artifact " + digest}
		}

		return rootProof{handled: true, why: reason + ": " + redact.Scrub(message)}
	}

	return rootProof{handled: true, why: "it reports no Ready condition"}
}
