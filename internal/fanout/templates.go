package fanout

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// writeTemplate rewrites the credential in a node template when its plan entries say so: a
// compare-and-swap update of the Secret's key (re-read, re-checked and rewritten when another
// writer got in between, so their change and ours are both kept), read back and checked, then the
// optional rollout restart of the autoscaler that reads it.
func writeTemplate(ctx context.Context, kube kubernetes.Interface, t config.NodeTemplate, p *plan.Plan, o secretwrite.Options) secretwrite.Result {
	res := secretwrite.Result{Namespace: t.Namespace, Secret: t.Secret, Key: t.Key, Role: plan.RoleTemplate}
	pools, update, restartOnly := templateActions(p, t)

	if !update {
		return leaveTemplate(ctx, kube, t, o, res, restartOnly)
	}

	return rewriteTemplate(ctx, kube, t, o, res, pools)
}

// templateActions are the plan's entries for the template: its pools, whether any needs the
// credential written, whether its reader only needs a restart.
func templateActions(p *plan.Plan, t config.NodeTemplate) (pools []string, update, restartOnly bool) {
	for _, tp := range p.Templates {
		if tp.Name == t.Name {
			pools = append(pools, tp.Pool)
			update = update || tp.Action == plan.TemplateUpdate
			restartOnly = restartOnly || tp.Action == plan.TemplateRestart
		}
	}

	return pools, update, restartOnly
}

// leaveTemplate is a template that carries the credential already: unchanged, its reader
// restarted when it had not read it since it changed.
func leaveTemplate(ctx context.Context, kube kubernetes.Interface, t config.NodeTemplate, o secretwrite.Options, res secretwrite.Result, restartOnly bool) secretwrite.Result {
	unchanged := "already carries the credential (auth digest " + human.Short(authdigest.Of(o.Username, o.Password)) + ")"
	res.Outcome, res.Message = secretwrite.Unchanged, unchanged

	if !restartOnly || t.RestartDeployment == "" {
		return res
	}

	fail := func(err error) secretwrite.Result {
		res.Outcome, res.Message = secretwrite.Failed, redact.Logged(o.Log, err)

		return res
	}

	if err := o.Assert(ctx); err != nil {
		return fail(fmt.Errorf("its reader not restarted: %w", err))
	}

	if err := restart(ctx, clockOf(o), kube, t.RestartDeployment); err != nil {
		return fail(fmt.Errorf("%s, but its reader had not restarted since it changed, and the rollout restart of deployment %s failed: %w (restart it by hand)",
			unchanged, t.RestartDeployment, err))
	}

	res.Message = unchanged + "; deployment " + t.RestartDeployment + ", which had not restarted since it changed, restarted to read it"

	return res
}

// rewriteTemplate writes the credential into the template's pools (recorded before and after),
// reads it back and restarts its reader.
func rewriteTemplate(ctx context.Context, kube kubernetes.Interface, t config.NodeTemplate, o secretwrite.Options, res secretwrite.Result, pools []string) secretwrite.Result {
	if err := o.Assert(ctx); err != nil {
		res.Outcome, res.Message = secretwrite.Failed, redact.Logged(o.Log, fmt.Errorf("not written: %w", err))

		return res
	}

	record := secretwrite.RecordNameOf(t.Secret, t.Key)

	if err := o.Record(t.Namespace, record, plan.RoleTemplate, state.SecretWriting); err != nil {
		res.Outcome, res.Message = secretwrite.Failed, redact.Logged(o.Log, err)

		return res
	}

	// From here a failure is recorded as such: the state must not say a write is in flight.
	fail := func(err error) secretwrite.Result {
		if rerr := o.Record(t.Namespace, record, plan.RoleTemplate, string(secretwrite.Failed)); rerr != nil {
			err = fmt.Errorf("%w (and recording the failure in the state failed: %w)", err, rerr)
		}

		res.Outcome, res.Message = secretwrite.Failed, redact.Logged(o.Log, err)

		return res
	}

	retries, err := putTemplate(ctx, kube, t, o)
	if err != nil {
		return fail(err)
	}

	if err := readBackTemplate(ctx, kube, t, o); err != nil {
		return fail(err)
	}

	msg := fmt.Sprintf("credential written in %s, read back", describePools(pools))
	if retries > 0 {
		msg += fmt.Sprintf(" (after %d concurrent write(s), re-read and retried)", retries)
	}

	if t.RestartDeployment != "" {
		if err := restart(ctx, clockOf(o), kube, t.RestartDeployment); err != nil {
			return fail(fmt.Errorf("%s; but the rollout restart of deployment %s failed: %w (restart it by hand so the autoscaler reads the template)",
				msg, t.RestartDeployment, err))
		}

		msg += "; deployment " + t.RestartDeployment + " restarted to read it"
	}

	if err := o.Record(t.Namespace, record, plan.RoleTemplate, string(secretwrite.Written)); err != nil {
		return fail(err)
	}

	res.Outcome, res.Message = secretwrite.Written, msg

	return res
}

func describePools(pools []string) string {
	if len(pools) == 1 && pools[0] == "" {
		return "the machine config"
	}

	return "pool(s) " + strings.Join(pools, ", ")
}

// putTemplate is the compare-and-swap loop: read, rewrite the credential only, update carrying
// the read resourceVersion; on a conflict start over from a fresh read.
func putTemplate(ctx context.Context, kube kubernetes.Interface, t config.NodeTemplate, o secretwrite.Options) (retries int, err error) {
	secrets := kube.CoreV1().Secrets(t.Namespace)
	where := fmt.Sprintf("node template %s/%s[%s]", t.Namespace, t.Secret, t.Key)

	return landed(ctx, clockOf(o), where, func(attempt int) error {
		cur, err := secrets.Get(ctx, t.Secret, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read %s: %w; not written", where, err)
		}

		value, ok := cur.Data[t.Key]
		if !ok {
			return fmt.Errorf("%s: the key is gone since the plan; not written", where)
		}

		next, err := nodetemplate.Rewrite(t.Format, value, t.Pools, o.Registry, o.Username, o.Password)
		if err != nil {
			return fmt.Errorf("%s: %w; not written", where, err)
		}

		if bytes.Equal(next, value) {
			return nil
		}

		betweenTemplate(o.Hooks, t, attempt)

		if err := o.Assert(ctx); err != nil {
			return fmt.Errorf("%s not written: %w", where, err)
		}

		upd := cur.DeepCopy()
		upd.Data[t.Key] = next

		if _, err := secrets.Update(ctx, upd, metav1.UpdateOptions{DryRun: writeMode(o)}); err != nil {
			return fmt.Errorf("write %s: %w", where, err)
		}

		return nil
	})
}

// readBackTemplate checks that every selected config of the template now carries the credential.
func readBackTemplate(ctx context.Context, kube kubernetes.Interface, t config.NodeTemplate, o secretwrite.Options) error {
	where := fmt.Sprintf("node template %s/%s[%s]", t.Namespace, t.Secret, t.Key)

	back, err := kube.CoreV1().Secrets(t.Namespace).Get(ctx, t.Secret, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read back %s: %w", where, err)
	}

	pools, err := nodetemplate.Read(t.Format, back.Data[t.Key], t.Pools, o.Registry)
	if err != nil {
		return fmt.Errorf("read back %s: %w", where, err)
	}

	want := authdigest.Of(o.Username, o.Password)
	for _, p := range pools {
		if p.Digest != want {
			return fmt.Errorf("read back %s: %s does not carry the new credential (another writer replaced it)", where, describePools([]string{p.Name}))
		}
	}

	return nil
}

// restart rolls a deployment the way `kubectl rollout restart` does.
// restart is `kubectl rollout restart` and `kubectl rollout status`: the pod template changes,
// and it returns once every replica runs the new one (its pods read the template as they
// start), or after rolloutTimeout.
func restart(ctx context.Context, clk clock.Clock, kube kubernetes.Interface, nsName string) error {
	ns, name, _ := strings.Cut(nsName, "/")
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{%q:%q}}}}}`, cluster.RestartedAtAnnotation, clk.Now().UTC().Format(time.RFC3339))

	deployments := kube.AppsV1().Deployments(ns)
	if _, err := deployments.Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return err
	}

	ctx, cancel := clk.WithTimeout(ctx, rolloutTimeout)
	defer cancel()

	for {
		d, err := deployments.Get(ctx, name, metav1.GetOptions{})
		if err == nil && cluster.RolledOut(d) {
			return nil
		}

		if clock.Sleep(ctx, clk, 500*time.Millisecond) != nil {
			if err == nil {
				err = fmt.Errorf("%d of %d replicas updated, %d available", d.Status.UpdatedReplicas, d.Status.Replicas, d.Status.AvailableReplicas)
			}

			return fmt.Errorf("restarted, but its rollout did not finish within %s: %w", rolloutTimeout, err)
		}
	}
}

// rolloutTimeout bounds the wait for a restarted reader's rollout.
const rolloutTimeout = 3 * time.Minute
