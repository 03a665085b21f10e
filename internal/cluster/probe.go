package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Probe is a runtime probe: each of its images (by digest) pulled in Namespace as
// ServiceAccount, one pod per image. The plan's own type: what the plan proved is what is pulled.
type Probe = plan.Probe

// ProbeAdmissible creates the probe pod for node with a server-side dry run (dryRun=All: every
// admission plugin and webhook runs, nothing is stored) and checks what admission made of it:
// a denial (PodSecurity, a webhook, a policy, a quota, a missing namespace or service account)
// or a mutation that would make the proof vacuous is found before any node is touched.
func (c *Connection) ProbeAdmissible(ctx context.Context, node string, proof Probe) error {
	for _, p := range probe.Each(proof) {
		pod, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, probe.Pod(node, p, "dry-run"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return fmt.Errorf("the runtime probe pod would not be admitted in namespace %s: %w", p.Namespace, err)
		}

		if err := probe.Admitted(pod, p); err != nil {
			return err
		}
	}

	return nil
}

// ProveRuntime shows the node's container runtime pulls the probe image with its own
// credential: a pod pinned to the node, with no pull secret (checked as admission left it), must
// get the image pulled — the runtime reports its image ID. What the image then does (a
// distroless image has no shell, its entrypoint may fail) proves nothing either way and is not
// asked. ErrImagePull, or no pull before timeout, is a failed proof. The pod is deleted
// afterwards.
func (c *Connection) ProveRuntime(ctx context.Context, node string, proof Probe, timeout time.Duration) error {
	return c.proveRuntime(ctx, node, proof, timeout, c)
}

// probeSource is where a proof follows its pod and reads its kubelet's Events: the API, a watch
// and a list per proof (Connection), or the run's ProbeWatch.
type probeSource interface {
	await(ctx context.Context, p *corev1.Pod, timeout time.Duration, judge func(*corev1.Pod) bool) error
	podEvents(ctx context.Context, p *corev1.Pod, reason string) ([]corev1.Event, error)
	// eventsChanged signals a change of the pod's Events (nil: never; the reader polls).
	eventsChanged(p *corev1.Pod) (<-chan struct{}, func())
	// retireLater deletes the pod of a finished proof: at once, or with the watch's next batch.
	retireLater(p *corev1.Pod)
}

func (c *Connection) proveRuntime(ctx context.Context, node string, proof Probe, timeout time.Duration, src probeSource) error {
	for _, p := range probe.Each(proof) {
		if err := c.proveImage(ctx, node, p, timeout, src); err != nil {
			return err
		}
	}

	return nil
}

// proveImage is one image's proof on the node: one pod, one real pull.
func (c *Connection) proveImage(ctx context.Context, node string, p Probe, timeout time.Duration, src probeSource) error {
	namespace, image := p.Namespace, p.Image

	if err := c.probeNamespace(ctx, namespace); err != nil {
		return err
	}

	pod, err := c.createProbe(ctx, node, p, timeout)
	if err != nil {
		return err
	}

	defer src.retireLater(pod)

	if err := probe.Admitted(pod, p); err != nil {
		return err
	}

	var verdict error

	seen := pod

	judge := func(p *corev1.Pod) bool {
		seen = p

		var done bool
		done, verdict = probe.Verdict(p, node, image)

		return done
	}

	if err := src.await(ctx, pod, timeout, judge); err != nil {
		return fmt.Errorf("runtime probe %s/%s on %s did not complete: %w; last seen: %s", namespace, pod.Name, node, err, probe.Describe(seen))
	}

	if pe, ok := verdict.(*probe.PullError); ok && pe.Reason == "ImagePullBackOff" {
		pe.Message = failedPull(ctx, src, pod, pe.Message)
	}

	if verdict != nil {
		return verdict
	}

	return pulled(ctx, c.Clock, src, node, pod, image, min(timeout, pulledEventWait))
}

// pulledEventWait bounds the wait for the kubelet's Pulled event after the pod's status named
// the image (the kubelet sends the event first; its delivery can trail the status).
const pulledEventWait = 15 * time.Second

// pulled checks the kubelet really pulled the image for the probe pod: its Pulled event says
// "Successfully pulled image". An image ID in the status alone may be a copy already on the node
// (the event then says "already present on machine"), which proves nothing about the credential
// the runtime holds now.
func pulled(ctx context.Context, clk clock.Clock, src probeSource, node string, pod *corev1.Pod, image string, wait time.Duration) error {
	changed, stop := src.eventsChanged(pod)
	defer stop()

	deadline := clk.Now().Add(wait)

	for {
		events, err := src.podEvents(ctx, pod, "Pulled")
		if err != nil {
			return fmt.Errorf("runtime probe %s/%s on %s: read its kubelet's events (list events in %s): %w", pod.Namespace, pod.Name, node, pod.Namespace, err)
		}

		if verdict, ok := probe.PullEvidence(events); ok {
			if verdict != "" {
				return fmt.Errorf("the container runtime of %s did not pull %s for the probe: %s; a copy on the node proves nothing about its credential: "+
					"make sure nothing rewrites the probe's pull policy (Always), then run plan and apply again", node, image, verdict)
			}

			return nil
		}

		if clk.Now().After(deadline) {
			return fmt.Errorf("runtime probe %s/%s on %s: its image was reported, but the kubelet sent no Pulled event within %s, so the pull is unproven; "+
				"the node stays fenced: run ghcrsync apply again", pod.Namespace, pod.Name, node, wait)
		}

		if err := clock.SleepOr(ctx, clk, 250*time.Millisecond, changed); err != nil {
			return fmt.Errorf("runtime probe %s/%s on %s: %w", pod.Namespace, pod.Name, node, err)
		}
	}
}

// failedPull is the runtime's words for the probe pod's last failed pull (its kubelet's Failed
// event): what a back-off's own message may leave out. The back-off's message where there is
// no such event.
func failedPull(ctx context.Context, src probeSource, pod *corev1.Pod, backoff string) string {
	events, err := src.podEvents(ctx, pod, "Failed")
	if err != nil || len(events) == 0 {
		return backoff
	}

	last := events[0]
	for _, e := range events[1:] {
		if e.LastTimestamp.After(last.LastTimestamp.Time) || e.EventTime.After(last.EventTime.Time) {
			last = e
		}
	}

	return last.Message
}

// probeCreateAttempts bounds the probe create's retries of an admission timeout.
const probeCreateAttempts = 4

// createProbe creates the probe pod (createPod).
func (c *Connection) createProbe(ctx context.Context, node string, p Probe, timeout time.Duration) (*corev1.Pod, error) {
	pod, err := c.createPod(ctx, p.Namespace, probe.AttemptLabel, func(attempt string) *corev1.Pod { return probe.Pod(node, p, attempt) }, timeout)
	if err != nil {
		return nil, fmt.Errorf("create runtime probe pod on %s: %w", node, err)
	}

	return pod, nil
}

// createPod creates the pod build makes for a new attempt (labelled attemptLabel=attempt). An
// admission timeout (a webhook that did not answer in time) is retried, a few times; an answer
// that never came (the connection dropped, a timeout after the pod may have been stored) is
// looked up by the attempt's label: a pod that was stored is adopted, never left behind, and
// never created twice.
func (c *Connection) createPod(ctx context.Context, namespace, attemptLabel string, build func(attempt string) *corev1.Pod, timeout time.Duration) (*corev1.Pod, error) {
	pods := c.Client.CoreV1().Pods(namespace)

	var last error

	for i := range probeCreateAttempts {
		attempt := newAttempt()

		pod, err := pods.Create(ctx, build(attempt), metav1.CreateOptions{})
		if err == nil {
			return pod, nil
		}

		last = err

		if ctx.Err() != nil || !answer.Lost(err) {
			break
		}

		// The pod may have been stored although its answer was lost: adopt it.
		if list, lerr := pods.List(ctx, metav1.ListOptions{LabelSelector: attemptLabel + "=" + attempt}); lerr == nil && len(list.Items) > 0 {
			return &list.Items[0], nil
		}

		if i < probeCreateAttempts-1 {
			if err := clock.Sleep(ctx, c.Clock, min(time.Duration(i+1)*time.Second, timeout)); err != nil {
				return nil, err
			}
		}
	}

	return nil, last
}

func newAttempt() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)

	return hex.EncodeToString(b)
}

// await follows a pod by watch from the version given until judge decides (the moment the
// kubelet reports, not the next poll). A watch that ends — the apiserver restarted, the watch
// timed out — is read again and reopened; a pod deleted under it is an error at once.
func (c *Connection) await(ctx context.Context, p *corev1.Pod, timeout time.Duration, judge func(*corev1.Pod) bool) error {
	wctx, cancel := c.Clock.WithTimeout(ctx, timeout)
	defer cancel()

	pods := c.Client.CoreV1().Pods(p.Namespace)

	var last error

	for {
		decided, err := followPod(wctx, pods, p, judge)
		if decided {
			return nil
		}

		if err != nil {
			last = err
		}

		if ctx.Err() != nil { // the run was cancelled: say so, not "timed out"
			return ctx.Err()
		}

		if clock.Sleep(wctx, c.Clock, retryAfter(err)) != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case last != nil:
				return fmt.Errorf("timed out after %s: %w", timeout, last)
			}

			return fmt.Errorf("timed out after %s", timeout)
		}

		again, err := pods.Get(wctx, p.Name, metav1.GetOptions{})

		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("pod %s/%s was deleted before it was judged", p.Namespace, p.Name)
		case err != nil:
			last = err
		case judge(again):
			return nil
		default:
			p = again
		}
	}
}

// podEvents lists the Events about the pod with reason.
func (c *Connection) podEvents(ctx context.Context, p *corev1.Pod, reason string) ([]corev1.Event, error) {
	selector := fields.Set{"involvedObject.uid": string(p.UID), "reason": reason}.String()

	list, err := c.Client.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return nil, err
	}

	return list.Items, nil
}

// retireLater deletes the probe pod at once, even while the run winds down.
func (c *Connection) retireLater(p *corev1.Pod) {
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_ = c.Client.CoreV1().Pods(p.Namespace).Delete(dctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
}

// eventsChanged: the API is polled.
func (c *Connection) eventsChanged(*corev1.Pod) (<-chan struct{}, func()) { return nil, func() {} }

// probeNamespace checks once per connection that the runtime probe namespace exists.
func (c *Connection) probeNamespace(ctx context.Context, namespace string) error {
	if _, ok := c.probeNamespaces.Load(namespace); ok {
		return nil
	}

	c.probeNamespaceMu.Lock()
	defer c.probeNamespaceMu.Unlock()

	if _, ok := c.probeNamespaces.Load(namespace); ok { // asked while this one waited
		return nil
	}

	_, err := c.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("the runtime probe namespace %s does not exist: create it (deploy/rbac/namespace.yaml), or set nodes.runtime_probe.namespace", namespace)
	}

	if err == nil {
		c.probeNamespaces.Store(namespace, true)
	}

	return nil
}

// followPod watches one pod from the version read until judge decides (true) or the watch ends.
func followPod(ctx context.Context, pods typedcorev1.PodInterface, p *corev1.Pod, judge func(*corev1.Pod) bool) (bool, error) {
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name).String(), ResourceVersion: p.ResourceVersion,
	})
	if err != nil {
		return false, err
	}
	defer w.Stop()

	for {
		ev, ok := receive(ctx, w.ResultChan())
		if !ok {
			return false, nil // the caller tells a timeout or a cancel from a watch that ended
		}

		switch ev.Type {
		case watch.Error:
			return false, apierrors.FromObject(ev.Object)
		case watch.Deleted:
			return false, nil // the next read says NotFound
		}

		if pod, ok := ev.Object.(*corev1.Pod); ok && judge(pod) {
			return true, nil
		}
	}
}

// retryAfter is the pause before reading again: a moment after a watch that simply ended, a
// longer one after an error (the apiserver may be restarting).
func retryAfter(err error) time.Duration {
	if err == nil {
		return 100 * time.Millisecond
	}

	return 500 * time.Millisecond
}
