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

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Outcome is what became of a pull secret.
type Outcome string

// Outcomes of a pull secret.
const (
	Written   Outcome = "written"
	Unchanged Outcome = "unchanged"
	Skipped   Outcome = "skipped"
	Failed    Outcome = "failed"
	HeldBack  Outcome = "held-back"
)

// Result is one pull secret's or node template's outcome.
type Result struct {
	Namespace, Secret, Role string
	Key                     string // a node template's key in the Secret ("" for a pull secret)
	Outcome                 Outcome
	Message                 string
}

// RecordName is the name the state records the write under: the Secret, or for a node template
// the Secret and its key.
func (r Result) RecordName() string { return recordName(r.Secret, r.Key) }

func recordName(secret, key string) string {
	if key == "" {
		return secret
	}

	return secret + "[" + key + "]"
}

// Hooks let tests act at exact points.
type Hooks struct {
	// BetweenReadAndWrite runs after a secret was read and before it is written.
	BetweenReadAndWrite func(namespace, name string, attempt int)
	// BetweenTemplateReadAndWrite runs after a node template was read and rewritten in memory,
	// before the update.
	BetweenTemplateReadAndWrite func(t config.NodeTemplate, attempt int)
}

// Options configure a fan-out.
type Options struct {
	Data []byte // the dockerconfigjson to write
	// Tenants are the tenant credentials' dockerconfigjson, by credential name: a pull secret of
	// a tenant (its plan entry's Credential) receives its tenant's, never Data.
	Tenants map[string][]byte
	// Configuration and Credential are the marks every written pull secret carries (the
	// configuration's identity, the cluster credential's name; a tenant's secret its own).
	Configuration, Credential string
	// Registry, Username and Password are the credential the node templates receive.
	Registry, Username, Password string
	// Templates are the configured node templates (their plan entries say which need a write).
	Templates     []config.NodeTemplate
	OCIRepository string // reconciled after the root secret changed ("" = none)
	// Assert reports an error unless the run still holds its Lease, read from the API now: it
	// runs before each write is recorded and again between the write's read and the write
	// itself, so a Lease taken or deleted since the heartbeat's last look writes nothing.
	Assert func(context.Context) error
	Record func(namespace, name, role, outcome string) error // state write before each mutation
	Hooks  Hooks
	// Log receives the full text of an API answer a result names only by class (redact.Logged).
	Log hclog.Logger
	// Clock times the restarts and the waits between attempts (nil: clock.System).
	Clock clock.Clock

	dryRun bool // every write is a server-side dry run (DryRun)
}

// clock is the fan-out's clock (Options.Clock, clock.System when unset).
func (o Options) clock() clock.Clock { return clock.Or(o.Clock) }

// data is what the pull secret receives: its credential's dockerconfigjson (nil: a tenant this
// run was not given, which writes nothing).
func (o Options) data(sp plan.SecretPlan) []byte {
	if sp.Credential == "" {
		return o.Data
	}

	return o.Tenants[sp.Credential]
}

// marks are the annotations that say which configuration and credential wrote the secret.
func (o Options) marks(sp plan.SecretPlan) map[string]string {
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
func (o Options) writeMode() []string {
	if o.dryRun {
		return []string{metav1.DryRunAll}
	}

	return nil
}

// Consumers writes every consumer pull secret of the plan.
func Consumers(ctx context.Context, kube kubernetes.Interface, p *plan.Plan, o Options) []Result {
	var out []Result

	for _, sp := range p.Secrets {
		if sp.Role != plan.RoleRoot {
			out = append(out, write(ctx, kube, sp, o))
		}
	}

	return out
}

// Templates writes the node templates: before any node is fenced, so machines created during
// the run boot with the new credential.
func Templates(ctx context.Context, kube kubernetes.Interface, p *plan.Plan, o Options) []Result {
	out := make([]Result, 0, len(o.Templates))

	for _, t := range o.Templates {
		out = append(out, writeTemplate(ctx, kube, t, p, o))
	}

	return out
}

// Root writes the root Flux secret — last, and only when heldBack is "": otherwise it keeps its
// old credential and heldBack says why (something still uses the old one). A written root is
// followed by a reconcile request of the OCIRepository, if one is configured.
func Root(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, p *plan.Plan, o Options, heldBack string) []Result {
	var out []Result

	for _, sp := range p.Secrets {
		if sp.Role != plan.RoleRoot {
			continue
		}

		switch {
		case sp.Action != plan.SecretCreate && sp.Action != plan.SecretUpdate:
			out = append(out, result(sp, skippedOrUnchanged(sp), sp.Reason))
		case heldBack != "":
			out = append(out, result(sp, HeldBack, "the root Flux secret keeps its old credential: "+heldBack))
		default:
			r := write(ctx, kube, sp, o)
			if r.Outcome == Written && o.OCIRepository != "" {
				r.Message += "; " + reconcile(ctx, dyn, sp.Namespace, o.OCIRepository, o.clock().Now())
			}

			out = append(out, r)
		}
	}

	return out
}

func result(sp plan.SecretPlan, outcome Outcome, msg string) Result {
	return Result{Namespace: sp.Namespace, Secret: sp.Secret, Role: sp.Role, Outcome: outcome, Message: msg}
}

func skippedOrUnchanged(sp plan.SecretPlan) Outcome {
	if sp.Action == plan.SecretSkip {
		return Skipped
	}

	return Unchanged
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
func write(ctx context.Context, kube kubernetes.Interface, sp plan.SecretPlan, o Options) Result {
	if sp.Action != plan.SecretCreate && sp.Action != plan.SecretUpdate {
		return result(sp, skippedOrUnchanged(sp), sp.Reason)
	}

	fail := func(err error) Result { return result(sp, Failed, redact.Logged(o.Log, err)) }

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
		if err := o.Record(sp.Namespace, sp.Secret, sp.Role, string(Skipped)); err != nil {
			return fail(err)
		}

		return result(sp, Skipped, err.Error()+" (or is being deleted): no pod there can pull with it; nothing written")
	}

	if err != nil {
		return fail(err)
	}

	back, err := secrets.Get(ctx, sp.Secret, metav1.GetOptions{})
	switch {
	case err != nil:
		return fail(fmt.Errorf("read-back of %s failed: %w", where, err))
	case !bytes.Equal(back.Data[corev1.DockerConfigJsonKey], o.data(sp)):
		return fail(fmt.Errorf("read-back of %s does not match what was written", where))
	}

	for _, sa := range sp.ServiceAccounts {
		if err := addPullSecret(ctx, kube, sp.Namespace, sa, sp.Secret); err != nil {
			return fail(err)
		}
	}

	if err := o.Record(sp.Namespace, sp.Secret, sp.Role, string(Written)); err != nil {
		return fail(err)
	}

	msg := "written and read back"
	if retries > 0 {
		msg += fmt.Sprintf(" (after %d concurrent write(s), re-read and retried)", retries)
	}

	if len(sp.ServiceAccounts) > 0 {
		msg += "; referenced from service account(s) " + fmt.Sprint(sp.ServiceAccounts)
	}

	return result(sp, Written, msg)
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
func put(ctx context.Context, secrets typedcorev1.SecretInterface, sp plan.SecretPlan, o Options) (retries int, err error) {
	where := sp.Namespace + "/" + sp.Secret

	data := o.data(sp)
	if len(data) == 0 {
		return 0, fmt.Errorf("%s: this run holds no credential %q to write; not written", where, sp.Credential)
	}

	return landed(ctx, o.clock(), where, func(attempt int) error {
		cur, err := secrets.Get(ctx, sp.Secret, metav1.GetOptions{})

		switch {
		case apierrors.IsNotFound(err):
			o.Hooks.between(sp, attempt)

			if err := o.Assert(ctx); err != nil {
				return fmt.Errorf("%s not written: %w", where, err)
			}

			_, err = secrets.Create(ctx, pullSecret(sp, data, o.marks(sp)), metav1.CreateOptions{DryRun: o.writeMode()})
			if namespaceGone(err) {
				return fmt.Errorf("%s: %w", where, errNamespaceGone)
			}
		case err != nil:
			return fmt.Errorf("read %s: %w", where, err)
		case cluster.Foreign(cur) != "":
			return fmt.Errorf("%s became managed by %s since the plan: %w; not written", where, cluster.Foreign(cur), errForeign)
		case cur.Type != corev1.SecretTypeDockerConfigJson:
			return fmt.Errorf("%s is now of type %s: not written", where, cur.Type)
		case bytes.Equal(cur.Data[corev1.DockerConfigJsonKey], data) && marked(cur, o.marks(sp)):
			return nil
		default:
			o.Hooks.between(sp, attempt)

			if err := o.Assert(ctx); err != nil {
				return fmt.Errorf("%s not written: %w", where, err)
			}

			_, err = secrets.Update(ctx, withCredential(cur, data, o.marks(sp)), metav1.UpdateOptions{DryRun: o.writeMode()})
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

func (h Hooks) betweenTemplate(t config.NodeTemplate, attempt int) {
	if h.BetweenTemplateReadAndWrite != nil {
		h.BetweenTemplateReadAndWrite(t, attempt)
	}
}

func (h Hooks) between(sp plan.SecretPlan, attempt int) {
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
func reconcile(ctx context.Context, dyn dynamic.Interface, ns, name string, now time.Time) string {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		cluster.ReconcileRequestAnnotation: now.UTC().Format(time.RFC3339Nano),
	}}})

	_, err := dyn.Resource(cluster.OCIRepositories).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})

	switch {
	case err == nil:
		return "reconcile of OCIRepository " + ns + "/" + name + " requested"
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return "no OCIRepository " + ns + "/" + name + " to reconcile"
	}

	return "requesting a reconcile of OCIRepository " + ns + "/" + name + " failed: " + redact.Error(err)
}
