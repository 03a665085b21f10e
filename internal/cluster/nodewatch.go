package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/plan"
)

// NodeWatch keeps every Node of the cluster as the API server last said, from one list and one
// watch for the whole run: the drains' destination check, asked before every eviction attempt
// of every pod, reads it instead of listing every Node again (a drain of 100 pods on a 500-node
// cluster would otherwise list 500 Nodes 100 times, and once more every retry of a pod a budget
// holds). The watch's state is as fresh as a new list, less its event's flight.
type NodeWatch struct {
	informer cache.SharedIndexInformer

	waits wakers // Changes, by node name
	clock clock.Clock

	lastEvent atomic.Int64 // unix nanoseconds of the last change the watch delivered (Fresh)
}

// WatchNodes starts the watch, which ends with ctx, and waits (up to timeout) for its first
// list. Node images and managed fields are dropped as they arrive: a Node carries its image
// list (10–40 KB), which no decision here reads.
func (c *Connection) WatchNodes(ctx context.Context, timeout time.Duration) (*NodeWatch, error) {
	client, err := c.watchClient()
	if err != nil {
		return nil, err
	}

	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes", "", fields.Everything())
	informer := cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})

	if err := informer.SetTransform(slimNode); err != nil {
		return nil, err
	}

	go informer.Run(ctx.Done())

	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	if !cache.WaitForCacheSync(sctx.Done(), informer.HasSynced) {
		return nil, fmt.Errorf("watch nodes: the first list did not arrive within %s", timeout)
	}

	w := &NodeWatch{informer: informer, clock: c.Clock}

	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.signal,
		UpdateFunc: func(_, obj any) { w.signal(obj) },
		DeleteFunc: w.signal,
	}); err != nil {
		return nil, err
	}

	return w, nil
}

// signal wakes the waits on the node obj is (or was: a deletion's last state).
func (w *NodeWatch) signal(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}

	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}

	w.lastEvent.Store(w.clock.Now().UnixNano())
	w.waits.wake(n.Name)
}

// Fresh reports whether the watch delivered a change within the last d: a watch cut off (its
// API endpoint away) delivers none, and the client-go reflector retries a refused watch without
// telling. A cluster's Nodes change every few seconds (each kubelet's status), so a busy watch
// is a live one; a quiet one is not trusted, and its reader asks the API.
func (w *NodeWatch) Fresh(d time.Duration) bool {
	return clock.Since(w.clock, time.Unix(0, w.lastEvent.Load())) <= d
}

// Get is the Node as the watch last saw it (a copy: the caller may change it); ok is false when
// the watch holds no such Node (deleted, or never seen).
func (w *NodeWatch) Get(name string) (n *corev1.Node, ok bool) {
	obj, ok, err := w.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}

	node, ok := obj.(*corev1.Node)
	if !ok {
		return nil, false
	}

	return node.DeepCopy(), true
}

// Changes signals, best effort, each time the watch sees the Node change, until ctx ends.
func (w *NodeWatch) Changes(ctx context.Context, name string) <-chan struct{} {
	ch, stop := w.waits.add(name)

	go func() {
		<-ctx.Done()
		stop()
	}()

	return ch
}

// slimNode drops what no decision reads from a Node before it is kept.
func slimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.Status.Images, n.ManagedFields = nil, nil
	}

	return obj, nil
}

// Destinations are every Node as an evicted pod's scheduler sees it, as the watch holds them.
func (w *NodeWatch) Destinations(context.Context) ([]plan.Destination, error) {
	if !w.informer.HasSynced() {
		return nil, errors.New("watch nodes: not synced")
	}

	items := w.informer.GetStore().List()
	out := make([]plan.Destination, 0, len(items))

	for _, obj := range items {
		if n, ok := obj.(*corev1.Node); ok {
			out = append(out, plan.DestinationOf(object.FromNode(n)))
		}
	}

	return out, nil
}
