package apply_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The run is cancelled while an eviction request is on the wire (the API server has it; its
// answer is slow): the drain lets that request finish, then stops. Abandoning it is what the
// chaos campaign caught in CI: the API server went on to count the pod as disrupted by its
// PodDisruptionBudget although the pod was never deleted, and every drain behind the budget
// was refused for two minutes. (That a cancelled drain stops at all, rather than waiting out
// its budget, is TestSIGTERMDuringDrain's.)
func TestCancelledDrainFinishesTheEvictionInFlight(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	const node = "prod-worker-3"

	ns := "drain-cancel"
	sandboxtest.PinnedDeployment(t, kube, ns, "slow", node)

	var pod corev1.Pod

	sandboxtest.Eventually(t, 60*time.Second, "the pod runs", func() error {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pods %v (%v)", pods, err)
		}

		pod = pods.Items[0]

		return nil
	})

	conn, err := cluster.Connect(sb.Path("kubeconfig"), "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	slow := &slowEviction{pod: "/namespaces/" + ns + "/pods/" + pod.Name + "/eviction", cancel: cancel}
	conn.Config.Wrap(func(rt http.RoundTripper) http.RoundTripper { slow.next = rt; return slow })

	if conn.Client, err = kubernetes.NewForConfig(conn.Config); err != nil {
		t.Fatal(err)
	}

	err = conn.Drain(runCtx, node, time.Minute, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("a cancelled drain returned %v", err)
	}

	if slow.abandoned.Load() {
		t.Fatal("the eviction in flight was abandoned when the run was cancelled")
	}

	sandboxtest.Eventually(t, 30*time.Second, "the evicted pod is gone", func() error {
		_, err := kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}

		return fmt.Errorf("pod %s still exists (%v)", pod.Name, err)
	})
}

// slowEviction answers the eviction of one pod a second late, cancels the run while that
// answer is on its way, and records whether the caller gave up on it.
type slowEviction struct {
	next      http.RoundTripper
	pod       string
	cancel    context.CancelFunc
	abandoned atomic.Bool
}

func (s *slowEviction) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, s.pod) {
		return s.next.RoundTrip(req)
	}

	resp, err := s.next.RoundTrip(req)
	s.cancel()

	select {
	case <-time.After(time.Second):
		return resp, err
	case <-req.Context().Done():
		s.abandoned.Store(true)

		return nil, req.Context().Err()
	}
}
