package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

// await's rules with a fake clientset (pure: the sandbox tests prove a probe on a real
// kubelet): it decides on the watch event that carries the answer, fails at once when the pod is
// deleted under it, times out naming the timeout, and says cancelled when the run is.
func TestAwaitPod(t *testing.T) {
	pulled := func(p *corev1.Pod) bool {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.ImageID != "" {
				return true
			}
		}

		return false
	}

	tests := []struct {
		name    string
		act     func(ctx context.Context, cancel context.CancelFunc, c *fake.Clientset, p *corev1.Pod) // after the watch opened
		timeout time.Duration
		wantErr string
	}{
		{
			name: "the kubelet reports the pull",
			act: func(ctx context.Context, _ context.CancelFunc, c *fake.Clientset, p *corev1.Pod) {
				p = p.DeepCopy()
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "probe", ImageID: "ghcr.io/acme/probe@sha256:1"}}
				_, _ = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			},
			timeout: time.Minute,
		},
		{
			name: "the pod is deleted under the watch",
			act: func(ctx context.Context, _ context.CancelFunc, c *fake.Clientset, p *corev1.Pod) {
				_ = c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
			},
			timeout: time.Minute,
			wantErr: "was deleted before it was judged",
		},
		{
			name:    "nothing is reported",
			act:     func(context.Context, context.CancelFunc, *fake.Clientset, *corev1.Pod) {},
			timeout: 300 * time.Millisecond,
			wantErr: "timed out after 300ms",
		},
		{
			name:    "the run is cancelled",
			act:     func(_ context.Context, cancel context.CancelFunc, _ *fake.Clientset, _ *corev1.Pod) { cancel() },
			timeout: time.Minute,
			wantErr: context.Canceled.Error(),
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ghcrsync-probe-x", Namespace: "ghcrsync-system"}}
			client := fake.NewClientset(pod)
			c := &Connection{Client: client, Clock: clock.System}

			done := make(chan error, 1)

			go func() { done <- c.await(ctx, pod, tt.timeout, pulled) }()

			// The fake records the watch just before its tracker registers the watcher: wait for
			// the action, then a moment more.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if len(client.Actions()) > 0 && client.Actions()[len(client.Actions())-1].GetVerb() == "watch" {
					time.Sleep(50 * time.Millisecond)

					break
				}
			}

			tt.act(ctx, cancel, client, pod)

			select {
			case err := <-done:
				switch {
				case tt.wantErr == "" && err != nil:
					t.Fatalf("await: %v", err)
				case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
					t.Fatalf("await = %v, want an error containing %q", err, tt.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("await did not return")
			}
		})
	}
}

// Changes: a change to the watched Node signals; a burst of changes leaves one pending signal;
// the watch ends with its context.
func TestChanges(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "prod-worker-1"}}
	client := fake.NewClientset(node)
	c := &Connection{Client: client, Clock: clock.System}

	ctx, cancel := context.WithCancel(t.Context())
	changed := c.Changes(ctx, node.Name)

	touch := func(v string) {
		n, err := client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}

		n.Annotations = map[string]string{"touched": v}
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Wait for the watch (the fake records it just before registering it).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if acts := client.Actions(); len(acts) > 0 && acts[len(acts)-1].GetVerb() == "watch" {
			time.Sleep(50 * time.Millisecond)

			break
		}
	}

	touch("1")

	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("a change to the node did not signal")
	}

	for i := range 5 {
		touch(fmt.Sprint("burst-", i))
	}

	time.Sleep(100 * time.Millisecond)

	if got := len(changed); got != 1 {
		t.Fatalf("after a burst of 5 changes %d signals are pending, want 1", got)
	}

	<-changed
	cancel()
	time.Sleep(100 * time.Millisecond)

	ctx = t.Context()
	touch("after")
	time.Sleep(100 * time.Millisecond)

	if got := len(changed); got != 0 {
		t.Fatalf("a change after the context ended signalled (%d pending)", got)
	}
}

// createProbe's rules with a fake clientset whose creates answer as a slow admission webhook
// does: a timeout is retried, a pod stored although its answer was lost is adopted (never made
// twice), a refusal is not retried, and timeouts that go on fail closed after a few attempts.
func TestCreateProbe(t *testing.T) {
	timeout := apierrors.NewTimeoutError("admission webhook \"slow.example.com\" did not answer", 1)
	denied := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("denied"))

	for _, tc := range []struct {
		name string
		// answers are the creates' errors, in turn; store, whether each stored the pod anyway.
		answers []error
		store   []bool
		want    string // "" = a pod
		creates int
		pods    int
	}{
		{"admitted at once", []error{nil}, []bool{true}, "", 1, 1},
		{"one admission timeout, then admitted", []error{timeout, nil}, []bool{false, true}, "", 2, 1},
		{"three timeouts, then admitted", []error{timeout, timeout, timeout, nil}, []bool{false, false, false, true}, "", 4, 1},
		{"stored, but the answer was a timeout", []error{timeout}, []bool{true}, "", 1, 1},
		{"stored, the connection dropped", []error{&url.Error{Op: "Post", URL: "https://api/pods", Err: syscall.ECONNRESET}}, []bool{true}, "", 1, 1},
		{"refused: not retried", []error{denied}, []bool{false}, "denied", 1, 0},
		{"timeouts go on: fails closed", []error{timeout, timeout, timeout, timeout, timeout}, []bool{false, false, false, false, false}, "did not answer", probeCreateAttempts, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			creates := 0

			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				i := creates
				creates++

				pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
				pod.Name = fmt.Sprintf("ghcrsync-probe-%d", i)

				if i < len(tc.store) && tc.store[i] {
					if err := client.Tracker().Create(corev1.SchemeGroupVersion.WithResource("pods"), pod, pod.Namespace); err != nil {
						return true, nil, err
					}
				}

				if i < len(tc.answers) && tc.answers[i] != nil {
					return true, nil, tc.answers[i]
				}

				return true, pod, nil
			})

			c := &Connection{Client: client, Clock: clock.System}
			pod, err := c.createProbe(t.Context(), "w1", Probe{Image: "ghcr.io/acme/probe@sha256:1", Namespace: "ghcrsync-system", ServiceAccount: "ghcrsync-probe"}, time.Millisecond)

			switch {
			case tc.want == "" && (err != nil || pod == nil):
				t.Fatalf("createProbe: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("createProbe = %v, want an error containing %q", err, tc.want)
			}

			list, _ := client.CoreV1().Pods("ghcrsync-system").List(t.Context(), metav1.ListOptions{})
			if creates != tc.creates || len(list.Items) != tc.pods {
				t.Fatalf("%d creates, %d pods stored; want %d and %d", creates, len(list.Items), tc.creates, tc.pods)
			}
		})
	}
}
