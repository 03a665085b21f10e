package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/object"
)

// Get reads a Node.
func (c *Connection) Get(ctx context.Context, name string) (*corev1.Node, error) {
	return c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// ReadNode reads a Node; an error other than NotFound names the API and what to check
// (Unreachable).
func (c *Connection) ReadNode(ctx context.Context, name string) (*corev1.Node, error) {
	n, err := c.Get(ctx, name)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, c.Unreachable("read node "+name, err)
	}

	return n, err
}

// ListNodes lists every Node, whole (a partial answer is an error, never fewer nodes); an
// error names the API and what to check (Unreachable).
func (c *Connection) ListNodes(ctx context.Context) ([]corev1.Node, error) {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, c.Unreachable("list nodes", err)
	}

	if err := Whole("list nodes", list.ListMeta); err != nil {
		return nil, err
	}

	return list.Items, nil
}

// ControlPlanes lists every control-plane Node.
func (c *Connection) ControlPlanes(ctx context.Context) ([]corev1.Node, error) {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: object.ControlPlaneLabel})
	if err != nil {
		return nil, err
	}

	return list.Items, nil
}

// CASPatch is a compare-and-swap on a Node: it reads the node, lets check refuse it, builds a
// merge patch carrying the read resourceVersion, and on a 409 Conflict (any concurrent write,
// a kubelet heartbeat included) reads, checks and tries again, up to attempts times. Only a
// genuine change — check's error — fails it. The node as patched is returned.
func (c *Connection) CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
	build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error) {
	return c.CASPatchFrom(ctx, nil, name, attempts, check, build, between)
}

// CASPatchFrom is CASPatch whose first attempt starts from first (a read already made, e.g. the
// run's Node watch) instead of a new read; nil reads. The read may be stale: the patch carries
// its resourceVersion, so a stale read only costs a 409 and a fresh read.
func (c *Connection) CASPatchFrom(ctx context.Context, first *corev1.Node, name string, attempts int, check func(*corev1.Node) error,
	build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error) {
	for attempt := 0; attempt < attempts; attempt++ {
		n := first
		first = nil

		if n == nil {
			var err error
			if n, err = c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return nil, err
			}
		}

		if err := check(n); err != nil {
			return n, err
		}

		patch := build(n)

		var want map[string]any // the patch as built, without the resourceVersion it carries
		normalise(patch, &want)

		meta, _ := patch["metadata"].(map[string]any)

		if meta == nil {
			meta = map[string]any{}
			patch["metadata"] = meta
		}

		meta["resourceVersion"] = n.ResourceVersion

		body, err := json.Marshal(patch)
		if err != nil {
			return nil, err
		}

		if between != nil {
			between(attempt)
		}

		out, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		if apierrors.IsConflict(err) {
			continue
		}

		if answer.Lost(err) {
			if landed, ok := c.landed(ctx, name, want); ok {
				return landed, nil // the answer was lost, the patch was not
			}
		}

		return out, err
	}

	return nil, fmt.Errorf("%s: %w after %d attempts", name, object.ErrConflictLimit, attempts)
}

// landedReads bounds the reads that look for a patch whose answer was lost (the API may be
// unreachable a moment: the endpoint's node rebooting cut the connection).
const landedReads = 20

// landed reads the node until it can, and reports whether it shows the patch: then the write
// landed though its answer was lost, and is adopted.
func (c *Connection) landed(ctx context.Context, name string, want map[string]any) (*corev1.Node, bool) {
	for range landedReads {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return n, Reflects(n, want)
		}

		if !answer.Transient(err) {
			return nil, false
		}

		if clock.Sleep(ctx, c.Clock, 500*time.Millisecond) != nil {
			return nil, false
		}
	}

	return nil, false
}

// StaticPodsReady reports an error unless the node's static pods (their mirror pods: the
// control plane's kube-apiserver, controller manager, scheduler) are all there and Ready.
func (c *Connection) StaticPodsReady(ctx context.Context, node string) error {
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return c.Unreachable("list the pods of "+node, err)
	}

	var static, notReady []string

	for i := range pods.Items {
		p := &pods.Items[i]
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; !mirror {
			continue
		}

		static = append(static, p.Name)

		if !podReady(p) {
			notReady = append(notReady, p.Namespace+"/"+p.Name)
		}
	}

	switch {
	case len(static) == 0:
		return fmt.Errorf("no static pod is seen on %s", node)
	case len(notReady) > 0:
		return fmt.Errorf("static pods on %s are not Ready: %s", node, strings.Join(notReady, ", "))
	}

	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}

	return false
}
