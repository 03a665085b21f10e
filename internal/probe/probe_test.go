package probe

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/plan"
)

// What admission left of a probe pod: a pull secret, another image, container or account makes
// the proof vacuous; the pod as ghcrsync made it is fine.
func TestAdmitted(t *testing.T) {
	p := plan.Probe{Image: "ghcr.io/acme/probe@sha256:1", Namespace: "ghcrsync-system", ServiceAccount: "ghcrsync-probe"}

	for _, tc := range []struct {
		name   string
		change func(*corev1.Pod)
		want   string
	}{
		{"as made", func(*corev1.Pod) {}, ""},
		{"a pull secret", func(pod *corev1.Pod) { pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}} }, "imagePullSecrets regcred"},
		{"another image", func(pod *corev1.Pod) { pod.Spec.Containers[0].Image = "mirror.example.com/probe@sha256:1" }, "the image"},
		{"a pull policy that reuses an image", func(pod *corev1.Pod) { pod.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent }, "pull policy IfNotPresent"},
		{"a sidecar", func(pod *corev1.Pod) { pod.Spec.InitContainers = []corev1.Container{{Name: "proxy"}} }, "containers"},
		{"another account", func(pod *corev1.Pod) { pod.Spec.ServiceAccountName = "default" }, "the service account (default)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := Pod("w1", p, "x")
			tc.change(pod)

			err := Admitted(pod, p)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("admitted: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("admitted = %v, want %q", err, tc.want)
			}
		})
	}
}

// The proof is the kubelet's word for a pull: "Successfully pulled image" proves, "already
// present on machine" refuses, nothing yet waits.
func TestPullEvidence(t *testing.T) {
	pulled := corev1.Event{Reason: "Pulled", Message: `Successfully pulled image "ghcr.io/acme/probe@sha256:1" in 1.2s (1.2s including waiting). Image size: 1 bytes.`}
	present := corev1.Event{Reason: "Pulled", Message: `Container image "ghcr.io/acme/probe@sha256:1" already present on machine`}

	for _, tc := range []struct {
		name    string
		events  []corev1.Event
		refused bool
		ok      bool
	}{
		{"a pull", []corev1.Event{pulled}, false, true},
		{"already present", []corev1.Event{present}, true, true},
		{"present, then pulled", []corev1.Event{present, pulled}, false, true},
		{"no event yet", nil, false, false},
		{"another event", []corev1.Event{{Reason: "Pulled", Message: "Pulling image"}}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verdict, ok := PullEvidence(tc.events)
			if ok != tc.ok || (verdict != "") != tc.refused {
				t.Fatalf("PullEvidence = %q, %v; want refused %v, ok %v", verdict, ok, tc.refused, tc.ok)
			}
		})
	}
}

// One sight of the probe pod: pulled proves, a pull failure refuses, a kubelet's rejection or a
// failure before the pull ends the wait with its reason; a pod still waiting (creating, an
// unrelated waiting reason) is not judged yet.
func TestProbeVerdict(t *testing.T) {
	pod := func(phase corev1.PodPhase, reason string, cs ...corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ghcrsync-system", Name: "probe-x"},
			Status:     corev1.PodStatus{Phase: phase, Reason: reason, ContainerStatuses: cs},
		}
	}

	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "m"}}}
	}

	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		done bool
		err  string
	}{
		{"pulled", pod(corev1.PodRunning, "", corev1.ContainerStatus{ImageID: "sha256:abc"}), true, ""},
		{"pull refused", pod(corev1.PodPending, "", waiting("ErrImagePull")), true, "cannot pull ghcr.io/org/img:v1 with its own credential (ErrImagePull: m)"},
		{"backing off", pod(corev1.PodPending, "", waiting("ImagePullBackOff")), true, "ImagePullBackOff"},
		{"still creating", pod(corev1.PodPending, "", waiting("ContainerCreating")), false, ""},
		{"no status yet", pod(corev1.PodPending, ""), false, ""},
		{"rejected by the kubelet", pod(corev1.PodFailed, "OutOfcpu"), true, "rejected runtime probe ghcrsync-system/probe-x before pulling anything (OutOfcpu"},
		{"failed before the pull", pod(corev1.PodFailed, ""), true, "failed before its image was pulled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, err := Verdict(tc.pod, "worker-1", "ghcr.io/org/img:v1")

			switch {
			case done != tc.done:
				t.Fatalf("done %t, want %t", done, tc.done)
			case tc.err == "" && err != nil:
				t.Fatalf("unexpected verdict: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("verdict %v, want %q", err, tc.err)
			}
		})
	}
}
