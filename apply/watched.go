package apply

import (
	"context"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/plan"
)

// watched serves the executor's Node reads from one Node watch for the run (started here,
// ended with ctx): the guards' reads before each step, the waits' wake-ups and the drains'
// destinations; and the proofs' pods and Events from one probe watch. Should a watch not
// start, its reads go to the API as asked.
func (r *run) watched(ctx context.Context) (Nodes, Workloads) {
	// The watches last until the run returns (stopWatching), a cancelled run's undoes included.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.stopWatch = cancel

	w, err := r.in.Watches.WatchNodes(ctx, watchStart)
	if err != nil {
		r.log.Warn("the Node watch did not start: every guard and drain reads the API instead", "error", err)

		return r.in.NodeAPI, r.in.Workloads
	}

	wn := &watchedNodes{Nodes: r.in.NodeAPI, workloads: r.in.Workloads, kube: r.in.Watches, watch: w, wrote: map[string]*corev1.Node{}}

	if ns := r.probe().Namespace; ns != "" {
		if wn.probes, err = r.in.Watches.WatchProbes(ctx, ns, watchStart); err != nil {
			r.log.Warn("the probe watch did not start: each proof follows its pod and lists its Events itself", "error", err)
		} else {
			r.stopWatch = func() { cancel(); wn.probes.Wait() } // the last proofs' pods deleted
		}
	}

	return wn, wn
}

// watchStart bounds the wait for a watch's first list: a watch that cannot start (the API slow,
// a right missing) costs the run this much, then its reads go to the API.
const watchStart = 30 * time.Second

// stopWatching ends the run's watches, once its proofs' pods are deleted.
func (r *run) stopWatching() {
	if r.stopWatch != nil {
		r.stopWatch()
	}
}

// watchedNodes is the cluster with its Node reads served by the run's Node watch.
//
// A read from the watch is as fresh as the watch, less an event's flight, and is made only while
// the watch is busy (watchFresh). That is safe here: every write to a Node is a compare-and-swap
// carrying the resourceVersion read, so a stale read costs a 409 and a fresh read
// (CASPatchFrom), never a lost update; the run's own writes are read back at once (wrote),
// newer than the watch until it catches up; and a Talos write judged on a read from the watch
// is judged on the Node as it was at most an event's flight ago — a GET is stale by its own
// round-trip too, and nothing is read and written atomically across the two APIs.
type watchedNodes struct {
	Nodes
	workloads Workloads // the drains: through the API (Drain); the rest served here
	kube      Watches
	watch     NodeWatch
	probes    ProbeWatch // nil: each proof follows its own pod

	mu    sync.Mutex
	wrote map[string]*corev1.Node // each Node as the run's last write to it answered
}

// watchFresh is how recent the Node watch's last change must be for its Nodes to be read
// instead of the API's: a read from the watch is then at most this much staler than a GET.
const watchFresh = 2 * time.Second

// Get is the newer of the watch's Node and the run's own last write to it; a Node the watch
// does not hold is read from the API (it may have joined a moment ago, or be gone: NotFound),
// and so is every Node while the watch is quiet (Fresh): an API outage is then met, and ridden
// out, as without the watch.
func (w *watchedNodes) Get(ctx context.Context, name string) (*corev1.Node, error) {
	if !w.watch.Fresh(watchFresh) { // quiet, or cut off: the API answers, or says it cannot
		return w.Nodes.Get(ctx, name)
	}

	n, ok := w.watch.Get(name)

	w.mu.Lock()
	own := w.wrote[name]
	w.mu.Unlock()

	switch {
	case ok && own != nil && newer(own, n):
		return own.DeepCopy(), nil
	case ok:
		return n, nil
	}

	return w.Nodes.Get(ctx, name)
}

// newer reports whether a is a later version of the Node than b: resourceVersions are opaque,
// but the API server's are etcd revisions, which only grow; one that is not a number is not
// taken to be newer (the watch's copy is used).
func newer(a, b *corev1.Node) bool {
	av, aerr := strconv.ParseUint(a.ResourceVersion, 10, 64)
	bv, berr := strconv.ParseUint(b.ResourceVersion, 10, 64)

	return aerr == nil && berr == nil && av > bv
}

// CASPatch starts from the Node as read (Get): a stale read answers 409 and is read afresh.
func (w *watchedNodes) CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
	build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error) {
	first, err := w.Get(ctx, name)
	if err != nil {
		first = nil // the patch reads it itself, and answers as the API does
	}

	out, err := w.kube.CASPatchFrom(ctx, first, name, attempts, check, build, between)
	if err == nil && out != nil {
		w.mu.Lock()
		w.wrote[name] = out.DeepCopy()
		w.mu.Unlock()
	}

	return out, err
}

// ProveRuntime follows the probe's pod and its Events in the run's probe watch.
func (w *watchedNodes) ProveRuntime(ctx context.Context, node string, probe plan.Probe, timeout time.Duration) error {
	if w.probes == nil {
		return w.workloads.ProveRuntime(ctx, node, probe, timeout)
	}

	return w.probes.ProveRuntime(ctx, node, probe, timeout)
}

func (w *watchedNodes) Drain(ctx context.Context, node string, timeout time.Duration, report progress.Func, check drain.Check) error {
	return w.workloads.Drain(ctx, node, timeout, report, check)
}

func (w *watchedNodes) Destinations(ctx context.Context) ([]plan.Destination, error) {
	return w.watch.Destinations(ctx)
}

func (w *watchedNodes) Changes(ctx context.Context, name string) <-chan struct{} {
	return w.watch.Changes(ctx, name)
}
