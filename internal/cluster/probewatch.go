package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/probe"
)

// ProbeWatch follows every runtime probe pod of a namespace, and its kubelet's Events, from one
// list and one watch of each for the whole run: a proof then costs its pod's create and delete
// only, where following each pod by a watch of its own and listing its Events cost two more
// requests a node (four hundred a minute, rotating live at scale).
type ProbeWatch struct {
	c            *Connection
	namespace    string
	pods, events cache.SharedIndexInformer

	waits wakers // by pod name: its changes and its Events

	mu      sync.Mutex
	retired []*corev1.Pod // finished proofs' pods, awaiting their batch's deletion
	closed  bool          // the last batch is taken: a pod retired now is deleted at once
	flushed chan struct{} // closed when the last batch is deleted (ctx ended)
}

// retireEvery is how often the pods of finished proofs are deleted, in one request; retireBatch
// bounds one request's pods (its label selector's length).
const (
	retireEvery = time.Second
	retireBatch = 100
)

// WatchProbes starts the watch of namespace's probe pods and their Events, which ends with ctx,
// and waits (up to timeout) for the first lists.
func (c *Connection) WatchProbes(ctx context.Context, namespace string, timeout time.Duration) (*ProbeWatch, error) {
	client, err := c.watchClient()
	if err != nil {
		return nil, err
	}

	core := client.CoreV1()
	w := &ProbeWatch{c: c, namespace: namespace, flushed: make(chan struct{})}

	podOpts := func(o *metav1.ListOptions) { o.LabelSelector = probe.Label }
	eventOpts := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("involvedObject.kind", "Pod").String()
	}

	w.pods = informer(&corev1.Pod{}, podOpts,
		func(o metav1.ListOptions) (runtime.Object, error) { return core.Pods(namespace).List(ctx, o) },
		func(o metav1.ListOptions) (watch.Interface, error) { return core.Pods(namespace).Watch(ctx, o) })
	w.events = informer(&corev1.Event{}, eventOpts,
		func(o metav1.ListOptions) (runtime.Object, error) { return core.Events(namespace).List(ctx, o) },
		func(o metav1.ListOptions) (watch.Interface, error) { return core.Events(namespace).Watch(ctx, o) })

	for _, inf := range []cache.SharedIndexInformer{w.pods, w.events} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: w.signal, UpdateFunc: func(_, obj any) { w.signal(obj) }, DeleteFunc: w.signal,
		}); err != nil {
			return nil, err
		}

		go inf.Run(ctx.Done())
	}

	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	if !cache.WaitForCacheSync(sctx.Done(), w.pods.HasSynced, w.events.HasSynced) {
		return nil, fmt.Errorf("watch runtime probe pods and their events in %s: the first lists did not arrive within %s", namespace, timeout)
	}

	go w.retiring(ctx)

	return w, nil
}

// Wait returns once the watch's ctx has ended and the last finished proofs' pods are deleted.
func (w *ProbeWatch) Wait() { <-w.flushed }

// retire queues a finished proof's pod for deletion with the next batch.
func (w *ProbeWatch) retire(p *corev1.Pod) {
	w.mu.Lock()
	closed := w.closed

	if !closed {
		w.retired = append(w.retired, p)
	}
	w.mu.Unlock()

	if closed { // the watch has ended: no batch follows
		w.c.retireLater(p)
	}
}

// retiring deletes the finished proofs' pods every retireEvery, and the last ones when ctx ends.
func (w *ProbeWatch) retiring(ctx context.Context) {
	defer close(w.flushed)

	// A janitor beside the run, not a wait it makes: on the machine's clock (a Fake's time
	// passes only by waiting, and this would make it race ahead).
	tick := time.NewTicker(retireEvery)
	defer tick.Stop()

	for {
		select {
		case <-tick.C:
			w.deleteRetired(ctx)
		case <-ctx.Done():
			w.mu.Lock()
			w.closed = true // the batch below is the last: later pods are deleted at once
			w.mu.Unlock()

			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			w.deleteRetired(dctx)
			cancel()

			return
		}
	}
}

// deleteRetired deletes the queued pods, a batch per request (a label selector on their
// attempts); should a batch be refused, its pods one by one.
func (w *ProbeWatch) deleteRetired(ctx context.Context) {
	w.mu.Lock()
	retired := w.retired
	w.retired = nil
	w.mu.Unlock()

	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}
	pods := w.c.Client.CoreV1().Pods(w.namespace)

	for batch := range slices.Chunk(retired, retireBatch) {
		attempts := make([]string, 0, len(batch))
		for _, p := range batch {
			attempts = append(attempts, p.Labels[probe.AttemptLabel])
		}

		sel := probe.AttemptLabel + " in (" + strings.Join(attempts, ",") + ")"
		if pods.DeleteCollection(ctx, now, metav1.ListOptions{LabelSelector: sel}) == nil {
			continue
		}

		for _, p := range batch {
			_ = pods.Delete(ctx, p.Name, now)
		}
	}
}

// informer is a list and watch of one kind, narrowed by opts.
func informer(obj runtime.Object, opts func(*metav1.ListOptions),
	list func(metav1.ListOptions) (runtime.Object, error), watchFn func(metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListFunc:  func(o metav1.ListOptions) (runtime.Object, error) { opts(&o); return list(o) },
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) { opts(&o); return watchFn(o) },
	}

	return cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
}

// signal wakes the waits on the pod obj is, or is an Event about.
func (w *ProbeWatch) signal(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}

	switch o := obj.(type) {
	case *corev1.Pod:
		w.waits.wake(o.Name)
	case *corev1.Event:
		w.waits.wake(o.InvolvedObject.Name)
	}
}

// ProveRuntime is Connection.ProveRuntime, its pods followed and their Events read from the
// watch.
func (w *ProbeWatch) ProveRuntime(ctx context.Context, node string, probe Probe, timeout time.Duration) error {
	return w.c.proveRuntime(ctx, node, probe, timeout, w)
}

// await follows the pod in the watch until judge decides. The pod as created stands until the
// watch sees it; a pod the watch saw and then lost was deleted.
func (w *ProbeWatch) await(ctx context.Context, p *corev1.Pod, timeout time.Duration, judge func(*corev1.Pod) bool) error {
	if p.Namespace != w.namespace {
		return w.c.await(ctx, p, timeout, judge)
	}

	changed, stop := w.waits.add(p.Name)
	defer stop()

	wctx, cancel := w.c.Clock.WithTimeout(ctx, timeout)
	defer cancel()

	seen := false

	for {
		obj, ok, _ := w.pods.GetStore().GetByKey(p.Namespace + "/" + p.Name)

		switch pod, _ := obj.(*corev1.Pod); {
		case ok && pod != nil:
			seen = true

			if judge(pod.DeepCopy()) {
				return nil
			}
		case seen:
			return fmt.Errorf("pod %s/%s was deleted before it was judged", p.Namespace, p.Name)
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wctx.Done():
			return fmt.Errorf("timed out after %s", timeout)
		case <-changed:
		}
	}
}

// retireLater queues the pod for the next batch (retire).
func (w *ProbeWatch) retireLater(p *corev1.Pod) {
	if p.Namespace != w.namespace {
		w.c.retireLater(p)

		return
	}

	w.retire(p)
}

// podEvents are the Events the watch holds about the pod, with reason.
func (w *ProbeWatch) podEvents(ctx context.Context, p *corev1.Pod, reason string) ([]corev1.Event, error) {
	if p.Namespace != w.namespace {
		return w.c.podEvents(ctx, p, reason)
	}

	var out []corev1.Event

	for _, obj := range w.events.GetStore().List() {
		if e, ok := obj.(*corev1.Event); ok && e.InvolvedObject.UID == p.UID && e.Reason == reason {
			out = append(out, *e.DeepCopy())
		}
	}

	return out, nil
}

// eventsChanged signals a change of the pod or its Events, until stop is called.
func (w *ProbeWatch) eventsChanged(p *corev1.Pod) (<-chan struct{}, func()) {
	if p.Namespace != w.namespace {
		return nil, func() {}
	}

	return w.waits.add(p.Name)
}
