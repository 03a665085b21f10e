package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
)

// PodLiveness judges a run from the pod it ran in (its run ref pod:NAMESPACE/NAME/UID, holder.RunRef), as
// the API server sees it:
//   - the pod ended (phase Succeeded or Failed: its kubelet reported every container
//     terminated — a Job's pod killed by SIGKILL or OOM, or evicted) — the run's process is gone:
//     Unique, proof beyond its Lease;
//   - the pod is gone, or its name is another pod's now (another UID) — terminated, but not
//     Unique: a pod force-deleted from a partitioned node may still run there, so this is
//     evidence only where no live Lease vouches for the holder;
//   - the pod is running, or the API cannot say — not terminated (fail closed).
//
// It reads the pod with a list by name (the list right plan and apply hold already).
type PodLiveness struct {
	Client kubernetes.Interface
}

// Check judges the holder's pod; a holder whose run ref names no pod is not judged. Unique is set
// for a pod that ended: proof beyond its Lease.
func (p PodLiveness) Check(ctx context.Context, id holder.ID) (liveness.Verdict, error) {
	ns, name, uid, ok := holder.ParsePodRef(id.RunRef)
	if !ok || p.Client == nil {
		return liveness.Verdict{}, nil
	}

	list, err := p.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		if apierrors.IsForbidden(err) {
			return liveness.Verdict{}, fmt.Errorf("pod %s/%s of the run: %w (the identity needs list pods in %s)", ns, name, err, ns)
		}

		return liveness.Verdict{}, fmt.Errorf("pod %s/%s of the run: %w", ns, name, err)
	}

	var pod *corev1.Pod

	for i := range list.Items {
		if list.Items[i].Name == name && string(list.Items[i].UID) == uid {
			pod = &list.Items[i]
		}
	}

	switch {
	case pod == nil:
		return liveness.Verdict{Applicable: true, Terminal: true,
			Evidence: fmt.Sprintf("pod %s/%s (uid %s) of the run no longer exists", ns, name, uid)}, nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return liveness.Verdict{Applicable: true, Terminal: true, Unique: true,
			Evidence: fmt.Sprintf("pod %s/%s (uid %s) of the run has ended (%s%s)", ns, name, uid, pod.Status.Phase, reason(pod))}, nil
	}

	return liveness.Verdict{Applicable: true,
		Evidence: fmt.Sprintf("pod %s/%s (uid %s) of the run is %s on %s", ns, name, uid, pod.Status.Phase, pod.Spec.NodeName)}, nil
}

// reason is how the pod's container ended (": OOMKilled, exit 137").
func reason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf(": %s, exit %d", t.Reason, t.ExitCode)
		}
	}

	if pod.Status.Reason != "" {
		return ": " + pod.Status.Reason
	}

	return ""
}
