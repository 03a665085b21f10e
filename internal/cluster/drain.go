package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubedrain "k8s.io/kubectl/pkg/drain"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Drain evicts the node's pods through the Eviction API (PodDisruptionBudgets honoured,
// DaemonSet pods left alone), bounded by timeout, with progress lines on out. A drain that does
// not finish names the pods left and the PodDisruptionBudgets that hold them.
//
// Cancelling ctx stops the drain at its next step, never inside an eviction request: one
// abandoned after the API server admitted it can leave the pod counted as disrupted by its
// budget for two minutes (the budget's disruptedPods entry) although the pod keeps running —
// and every drain behind that budget is refused meanwhile.
//
// The node is listed again after each round of evictions, until a listing finds nothing to
// evict: a pod that arrived meanwhile (one tolerating the cordon, or bound by nodeName) is
// evicted too before the drain counts as done.
//
// check, if set, is asked before every eviction request (with how many pods are left to evict):
// a refusal stops the drain, a transient error is asked again.
func (c *Connection) Drain(ctx context.Context, node string, timeout time.Duration, report progress.Func, check drain.Check) error {
	prefixed := progress.Lines(report, node)
	h := &kubedrain.Helper{Ctx: ctx, Client: c.Client, GracePeriodSeconds: -1, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true, Out: prefixed, ErrOut: prefixed}

	dctx, cancel := c.Clock.WithTimeout(ctx, timeout)
	defer cancel()

	for {
		list, errs := h.GetPodsForDeletion(node)
		if len(errs) > 0 && allTransient(errs) && dctx.Err() == nil {
			// The API did not answer the listing: ask again (the drain's deadline bounds it).
			_ = clock.Sleep(dctx, c.Clock, time.Second) // the loop's next listing says what an ended drain means

			continue
		}

		if len(errs) > 0 {
			msgs := make([]string, 0, len(errs))
			for _, e := range errs {
				msgs = append(msgs, e.Error())
			}

			return fmt.Errorf("cannot drain %s: %s (ghcrsync does not force-delete pods)", node, strings.Join(msgs, "; "))
		}

		pods := list.Pods()
		if len(pods) == 0 {
			return nil
		}

		if err := c.evictAll(ctx, dctx, node, timeout, pods, report, check); err != nil {
			return err
		}
	}
}

// allTransient: every error is the API not answering (a pod the drain may not evict — a bare
// pod, say — is an error of its own, never retried).
func allTransient(errs []error) bool {
	for _, err := range errs {
		var status apierrors.APIStatus
		if !answer.Lost(err) && !(errors.As(err, &status) && answer.Transient(err)) {
			return false
		}
	}

	return true
}

// evictAll evicts pods concurrently, each until it is gone or the drain's deadline passes.
func (c *Connection) evictAll(ctx, dctx context.Context, node string, timeout time.Duration, pods []corev1.Pod, report progress.Func, check drain.Check) error {
	results := make(chan error, len(pods))

	for i := range pods {
		go func(p *corev1.Pod) {
			results <- c.evict(dctx, node, p, report, func(ctx context.Context) error { return check.Ask(ctx, len(pods)) })
		}(&pods[i])
	}

	var failed []error

	for range pods {
		if err := <-results; err != nil {
			failed = append(failed, err)
		}
	}

	var refused *drain.Refused

	switch {
	case len(failed) == 0:
		return nil
	case errors.As(errors.Join(failed...), &refused):
		return fmt.Errorf("drain of %s stopped: %w", node, refused)
	case ctx.Err() != nil:
		return fmt.Errorf("drain of %s stopped (the run was cancelled)%s: %w", node, c.blockers(node), errors.Join(failed...))
	default:
		return fmt.Errorf("drain of %s did not finish within %s%s: %w", node, timeout, c.blockers(node), errors.Join(failed...))
	}
}

// evictBackoff paces the requests for one pod's eviction while a budget holds it (429), the
// API does not answer, or its destinations cannot be read: 1 s, doubling to 8 s, each drawn up
// to half again longer, so that the pods one budget holds do not ask in lockstep (a drain's
// requests while a budget holds grow with its log, not with the hold).
func evictBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: 8 * time.Second}
}

// evict asks for the pod's eviction until its budget allows it, then waits for the pod to go.
// Each request runs to its answer (bounded by the client's request timeout) whatever ctx says;
// ctx is checked between requests.
func (c *Connection) evict(ctx context.Context, node string, p *corev1.Pod, report progress.Func, check func(context.Context) error) error {
	name := p.Namespace + "/" + p.Name
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
	}

	backoff := evictBackoff()
	pause := func() { _ = clock.Sleep(ctx, c.Clock, backoff.Step()) } // the loop checks ctx first

	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return fmt.Errorf("pod %s not evicted: %w", name, ctx.Err())
		}

		if err := check(ctx); err != nil {
			var refused *drain.Refused
			if errors.As(err, &refused) {
				return refused
			}

			report.Emit(progress.EvictionRetry{Node: node, Pod: name, In: backoff.Duration, Why: redact.Error(err), Destinations: true, Attempt: attempt})
			pause()

			continue
		}

		report.Emit(progress.Evicting{Node: node, Pod: name})

		err := c.Client.PolicyV1().Evictions(p.Namespace).Evict(context.WithoutCancel(ctx), ev)

		switch {
		case err == nil:
			return c.waitGone(ctx, p)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			return nil // gone, or replaced by a pod of the same name: not this pod any more
		case apierrors.IsTooManyRequests(err), apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause),
			answer.Transient(err):
			// A budget holds it, or the API did not answer (the answer may be lost: asking
			// again finds the pod gone, or evicts it).
			report.Emit(progress.EvictionRetry{Node: node, Pod: name, In: backoff.Duration, Why: redact.Error(err), Attempt: attempt})
			pause()
		default:
			return fmt.Errorf("eviction of pod %s: %w", name, err)
		}
	}
}

// waitGone polls until the evicted pod is deleted (or replaced under its name).
func (c *Connection) waitGone(ctx context.Context, p *corev1.Pod) error {
	for {
		cur, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && cur.UID != p.UID {
			return nil
		}

		if err := clock.Sleep(ctx, c.Clock, time.Second); err != nil {
			return fmt.Errorf("pod %s/%s evicted but still terminating: %w", p.Namespace, p.Name, err)
		}
	}
}

// blockers describes the evictable pods still on the node and the budgets that cover them.
func (c *Connection) blockers(node string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return ""
	}

	var parts []string

	for i := range pods.Items {
		p := &pods.Items[i]
		if !drain.Evictable(p) {
			continue
		}

		desc := p.Namespace + "/" + p.Name

		pdbs, err := c.Client.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for j := range pdbs.Items {
				if pdb := &pdbs.Items[j]; drain.Selects(pdb, p) {
					desc += fmt.Sprintf(" (held by PodDisruptionBudget %s/%s: %d disruptions allowed)", pdb.Namespace, pdb.Name, pdb.Status.DisruptionsAllowed)
				}
			}
		}

		parts = append(parts, desc)
	}

	if len(parts) == 0 {
		return ""
	}

	return "; still running: " + strings.Join(parts, ", ")
}

// PodsObs is what one LIST of every pod tells: per node, the pods a drain would evict and what
// would hold their eviction; and the pull secrets pods reference for images on the registry.
type PodsObs struct {
	Evictable map[string]int
	Blockers  map[string][]plan.DrainBlocker
	Refs      []plan.PullSecretRef
}

// Pods reads every pod (one LIST, the whole list or an error) and the PodDisruptionBudgets.
func (c *Connection) Pods(ctx context.Context, registry string) (PodsObs, error) {
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return PodsObs{}, c.Unreachable("list pods", err)
	}

	if err := Whole("list pods", pods.ListMeta); err != nil {
		return PodsObs{}, err
	}

	pdbs, err := c.Client.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return PodsObs{}, c.Unreachable("list PodDisruptionBudgets", err)
	}

	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return PodsObs{}, c.Unreachable("list nodes", err)
	}

	out := PodsObs{Evictable: map[string]int{}, Blockers: drain.Blockers(pods.Items, pdbs.Items, nodes.Items), Refs: PullSecretRefs(pods.Items, registry)}

	for i := range pods.Items {
		if p := &pods.Items[i]; p.Spec.NodeName != "" && drain.Evictable(p) {
			out.Evictable[p.Spec.NodeName]++
		}
	}

	return out, nil
}

// PullSecretRefs are the pull secrets pods reference (spec.imagePullSecrets, their service
// account's included: admission copies them into the pod) while pulling an image from registry,
// with how many pods do, by namespace and name. Finished pods pull nothing more and are left out.
func PullSecretRefs(pods []corev1.Pod, registry string) []plan.PullSecretRef {
	byRef := map[string]*plan.PullSecretRef{}

	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || len(p.Spec.ImagePullSecrets) == 0 || !pullsFrom(p, registry) {
			continue
		}

		for _, s := range p.Spec.ImagePullSecrets {
			key := p.Namespace + "/" + s.Name

			r := byRef[key]
			if r == nil {
				r = &plan.PullSecretRef{Namespace: p.Namespace, Name: s.Name}
				byRef[key] = r
			}

			r.Pods++
			if len(r.Examples) < 3 {
				r.Examples = append(r.Examples, p.Name)
			}
		}
	}

	out := make([]plan.PullSecretRef, 0, len(byRef))
	for _, r := range byRef {
		out = append(out, *r)
	}

	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })

	return out
}

// pullsFrom reports whether one of the pod's containers runs an image on registry.
func pullsFrom(p *corev1.Pod, registry string) bool {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			if host, _, ok := strings.Cut(c.Image, "/"); ok && host == registry {
				return true
			}
		}
	}

	return false
}
