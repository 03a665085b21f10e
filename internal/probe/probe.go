// Package probe is the runtime proof's own rules, with no client: the probe pod (pinned to its
// node, pulling every time, with no pull secret and no token, PodSecurity "restricted"), what
// admission may not change of it, and how one sight of the pod and its kubelet's events are
// judged — pulled with the node's own credential, refused, or not proved. internal/cluster
// creates the pod, watches it and reads its events; this package decides.
package probe

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/plan"
)

// pullFailure reports a waiting reason that means the image could not be pulled.
func pullFailure(reason string) bool {
	switch reason {
	case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "RegistryUnavailable":
		return true
	}

	return false
}

// Label marks ghcrsync's runtime probe pods (its value: the node); AttemptLabel tells
// one create from another, so a create whose answer was lost is found and adopted.
const (
	Label        = "ghcrsync.dev/probe-node"
	AttemptLabel = "ghcrsync.dev/probe-attempt"
)

// Each is p once per image it pulls.
func Each(p plan.Probe) []plan.Probe {
	pulls := p.Pulls()
	out := make([]plan.Probe, 0, len(pulls))

	for _, img := range pulls {
		out = append(out, plan.Probe{Image: img, Namespace: p.Namespace, ServiceAccount: p.ServiceAccount})
	}

	return out
}

// uid run the probe as nobody in particular: PodSecurity "restricted" wants a
// non-root user, and the image's own user is unknown.
const uid = 65532

// Pod is the one probe pod: pinned to node, tolerating everything, pulling the image every
// time (never a copy already on the node), with no pull secret and no token, and satisfying
// PodSecurity "restricted" (non-root, no privilege escalation, every capability dropped, the
// runtime's default seccomp profile).
func Pod(node string, p plan.Probe, attempt string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "ghcrsync-probe-",
			Namespace:    p.Namespace,
			Labels:       map[string]string{Label: node, AttemptLabel: attempt, "app.kubernetes.io/managed-by": "ghcrsync"},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			ServiceAccountName:            p.ServiceAccount,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(uid)), RunAsGroup: ptr.To(int64(uid)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "probe", Image: p.Image, ImagePullPolicy: corev1.PullAlways,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// Admitted checks the probe pod as admission left it: a pod that gained a pull secret (the
// ServiceAccount admission plugin adds its account's imagePullSecrets, a policy engine may add
// one) or another image, container or account would prove a pull made with that secret, not
// with the node's own credential — so it proves nothing.
func Admitted(pod *corev1.Pod, p plan.Probe) error {
	var changed []string

	if n := len(pod.Spec.ImagePullSecrets); n > 0 {
		names := make([]string, 0, n)
		for _, s := range pod.Spec.ImagePullSecrets {
			names = append(names, s.Name)
		}

		changed = append(changed, "imagePullSecrets "+strings.Join(names, ", "))
	}

	if len(pod.Spec.InitContainers)+len(pod.Spec.EphemeralContainers) > 0 || len(pod.Spec.Containers) != 1 {
		changed = append(changed, "containers")
	} else if c := pod.Spec.Containers[0]; c.Image != p.Image || c.ImagePullPolicy != corev1.PullAlways {
		changed = append(changed, fmt.Sprintf("the image (%s, pull policy %s)", c.Image, c.ImagePullPolicy))
	}

	if pod.Spec.ServiceAccountName != p.ServiceAccount {
		changed = append(changed, "the service account ("+pod.Spec.ServiceAccountName+")")
	}

	if len(changed) == 0 {
		return nil
	}

	return fmt.Errorf("admission changed the runtime probe pod in %s (%s): a pull through it would not prove the node's own credential; "+
		"exempt ghcrsync's probe (namespace %s, service account %s) from the mutation", p.Namespace, strings.Join(changed, "; "), p.Namespace, p.ServiceAccount)
}

// Verdict judges one sight of a probe pod on node: done when it pulled image (verdict nil),
// could not pull it, or failed before pulling (the verdict says which); not done while it waits.
func Verdict(p *corev1.Pod, node, image string) (done bool, verdict error) {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && pullFailure(w.Reason) {
			return true, &PullError{Node: node, Image: image, Reason: w.Reason, Message: w.Message}
		}

		if cs.ImageID != "" {
			return true, nil // pulled: proved
		}
	}

	switch {
	case p.Status.Phase == corev1.PodFailed && p.Status.Reason != "":
		// The kubelet refused to run it at all (OutOfmemory, OutOfcpu, NodeAffinity, ...):
		// nothing was pulled, and waiting longer changes nothing.
		return true, fmt.Errorf("the kubelet of %s rejected runtime probe %s/%s before pulling anything (%s: %s); "+
			"make room for the probe on the node (its requests come from the namespace's LimitRange, if any), then run plan and apply again",
			node, p.Namespace, p.Name, p.Status.Reason, p.Status.Message)
	case p.Status.Phase == corev1.PodFailed:
		return true, fmt.Errorf("runtime probe %s/%s on %s failed before its image was pulled: %s", p.Namespace, p.Name, node, p.Status.Message)
	}

	return false, nil
}

// PullError is a probe's pull the node's runtime could not make, as its kubelet reported it.
type PullError struct {
	Node, Image     string
	Reason, Message string
}

func (e *PullError) Error() string {
	return fmt.Sprintf("the container runtime of %s cannot pull %s with its own credential (%s: %s)", e.Node, e.Image, e.Reason, e.Message)
}

// PullMessage is the runtime's own words (what says whether the registry refused or was busy).
func (e *PullError) PullMessage() string { return e.Message }

// PullEvidence reads a probe pod's Pulled events: ok once there is one, with "" for a real pull
// or the kubelet's words when it started from an image already present.
func PullEvidence(events []corev1.Event) (verdict string, ok bool) {
	for _, e := range events {
		if strings.HasPrefix(e.Message, "Successfully pulled image") {
			return "", true
		}
	}

	for _, e := range events {
		if strings.Contains(e.Message, "already present on machine") {
			return e.Message, true
		}
	}

	return "", false
}

// Describe is what was last observed of a pod: its phase, the conditions that are not True,
// each container's state — what an operator needs to see why a probe stalled.
func Describe(p *corev1.Pod) string {
	st := p.Status
	if st.Phase == "" && len(st.Conditions) == 0 && len(st.ContainerStatuses) == 0 {
		return "no status at all: the kubelet of its node never reported on it"
	}

	parts := []string{"phase " + string(st.Phase)}
	if st.Reason != "" {
		parts = append(parts, "reason "+st.Reason)
	}

	for _, c := range st.Conditions {
		if c.Status != corev1.ConditionTrue {
			parts = append(parts, fmt.Sprintf("%s=%s (%s)", c.Type, c.Status, strings.TrimSpace(c.Reason+" "+c.Message)))
		}
	}

	for _, cs := range st.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("container %s waiting: %s", cs.Name, strings.TrimSpace(cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)))
		case cs.State.Running != nil:
			parts = append(parts, "container "+cs.Name+" running")
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("container %s terminated: %s", cs.Name, cs.State.Terminated.Reason))
		}
	}

	if len(st.ContainerStatuses) == 0 {
		parts = append(parts, "no container status")
	}

	return strings.Join(parts, "; ")
}
