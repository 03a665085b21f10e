package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return fmt.Errorf("the runtime probe namespace %s does not exist: create it (deploy/rbac/namespace.yaml), or set nodes.runtime_probe.namespace", namespace)
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

	err = WaitFor(ctx, timeout, 500*time.Millisecond, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}

		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && pullFailure(w.Reason) {
				verdict = fmt.Errorf("the container runtime of %s cannot pull %s with its own credential (%s: %s)", node, image, w.Reason, w.Message)

				return true, nil
			}

			if cs.ImageID != "" {
				return true, nil // pulled: proved
			}
		}

		if p.Status.Phase == corev1.PodFailed {
			verdict = fmt.Errorf("runtime probe %s/%s on %s failed before its image was pulled: %s", namespace, p.Name, node, p.Status.Message)

			return true, nil
		}

		return false, nil
	})
	if err != nil {
		return fmt.Errorf("runtime probe on %s did not complete: %w", node, err)
	}

	return verdict
}
