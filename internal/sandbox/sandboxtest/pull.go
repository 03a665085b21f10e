package sandboxtest

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
)

// PullOutcome waits until the pod's container runs or has exited 0 ("ok") or waits on a pull
// failure ("ErrImagePull"), and says which, with how its image came: "pulled" (the kubelet's
// "Successfully pulled" event) or "present" (its "already present on machine" event).
func PullOutcome(t testing.TB, sb *sandbox.Sandbox, ns, name string) (state, image string) {
	t.Helper()

	kube := sb.Kube()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}

		cs := p.Status.ContainerStatuses[0]

		switch {
		case cs.State.Running != nil, cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			state = "ok"
		case cs.State.Waiting != nil && (cs.State.Waiting.Reason == "ErrImagePull" || cs.State.Waiting.Reason == "ImagePullBackOff"):
			state = "ErrImagePull"
		default:
			return false, nil
		}

		events, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.name": name, "reason": "Pulled"}.String()})
		if err != nil {
			return false, nil
		}

		for _, e := range events.Items {
			switch {
			case strings.Contains(e.Message, "Successfully pulled"):
				image = "pulled"
			case strings.Contains(e.Message, "already present"):
				image = "present"
			}
		}

		return state == "ErrImagePull" || image != "", nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s: no outcome (%q, %q): %v", ns, name, state, image, err)
	}

	return state, image
}
