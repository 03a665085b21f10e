package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"
)

// pullFailure reports a waiting reason that means the image could not be pulled.
func pullFailure(reason string) bool {
	switch reason {
	case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "RegistryUnavailable":
		return true
	}

	return false
}

// ProbeLabel marks ghcrsync's runtime probe pods.
const ProbeLabel = "ghcrsync.dev/probe-node"

// ProveRuntime shows the node's container runtime pulls image with its own credential: a pod
// pinned to the node, with no pull secret, must get the image pulled — the runtime reports its
// image ID. What the image then does (a distroless image has no shell, its entrypoint may
// fail) proves nothing either way and is not asked. ErrImagePull, or no pull before timeout, is
// a failed proof. The pod is deleted afterwards.
func (c *Connection) ProveRuntime(ctx context.Context, node, namespace, image string, timeout time.Duration) error {
	if err := c.probeNamespace(ctx, namespace); err != nil {
		return err
	}

	pod, err := c.Client.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "ghcrsync-probe-",
			Labels:       map[string]string{ProbeLabel: node, "app.kubernetes.io/managed-by": "ghcrsync"},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers:                    []corev1.Container{{Name: "probe", Image: image, ImagePullPolicy: corev1.PullAlways}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create runtime probe pod on %s: %w", node, err)
	}

	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		_ = c.Client.CoreV1().Pods(namespace).Delete(dctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	}()

	var verdict error

	judge := func(p *corev1.Pod) bool {
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && pullFailure(w.Reason) {
				verdict = fmt.Errorf("the container runtime of %s cannot pull %s with its own credential (%s: %s)", node, image, w.Reason, w.Message)

				return true
			}

			if cs.ImageID != "" {
				return true // pulled: proved
			}
		}

		if p.Status.Phase == corev1.PodFailed {
			verdict = fmt.Errorf("runtime probe %s/%s on %s failed before its image was pulled: %s", namespace, p.Name, node, p.Status.Message)

			return true
		}

		return false
	}

	if err := c.awaitPod(ctx, pod, timeout, judge); err != nil {
		return fmt.Errorf("runtime probe on %s did not complete: %w", node, err)
	}

	return verdict
}

// awaitPod follows a pod by watch from the version given until judge decides (the moment the
// kubelet reports, not the next poll). A watch that ends — the apiserver restarted, the watch
// timed out — is read again and reopened; a pod deleted under it is an error at once.
func (c *Connection) awaitPod(ctx context.Context, p *corev1.Pod, timeout time.Duration, judge func(*corev1.Pod) bool) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
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

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wctx.Done():
			if last != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, last)
			}

			return fmt.Errorf("timed out after %s", timeout)
		case <-time.After(retryAfter(err)):
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

// probeNamespace checks once per connection that the runtime probe namespace exists.
func (c *Connection) probeNamespace(ctx context.Context, namespace string) error {
	if _, ok := c.probeNamespaces.Load(namespace); ok {
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
