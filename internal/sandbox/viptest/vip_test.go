// Package viptest runs a sandbox whose API endpoint is a VIP failing over across control
// planes: rebooting any one control plane must not interrupt the kubeconfig's endpoint.
package viptest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 3, VIP: true, NoWorkloads: true, AutoscalerPaused: true})
}

func TestVIPSurvivesControlPlaneReboot(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sandboxtest.Kube(t)
	direct := sb.Kube()
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	const name = "prod-control-plane-1"

	m, _ := sb.Fleet().Machine(name)
	endpoint := strings.TrimPrefix(sb.EndpointURL(), "https://")

	if host, _, _ := net.SplitHostPort(endpoint); host == m.IP {
		t.Fatalf("with --vip the endpoint %s must not be a node address", endpoint)
	}

	// Fence it so the witness accepts the reboot (control planes run no evictable pods here).
	fence := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"vip-test"}},"spec":{"unschedulable":true}}`, sandbox.OwnerAnnotation)
	if _, err := direct.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, fence, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	boot := m.BootID()

	if err := talos.Reboot(client.WithNode(ctx, m.IP)); err != nil {
		t.Fatal(err)
	}

	// Probe the endpoint throughout the reboot window: every call must succeed.
	var failures atomic.Int32

	deadline := time.Now().Add(sb.Options().Reboot + 2*time.Second)
	for time.Now().Before(deadline) {
		if _, err := kube.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			failures.Add(1)
			t.Logf("endpoint call failed during the reboot: %v", err)
		}

		time.Sleep(100 * time.Millisecond)
	}

	sandboxtest.Eventually(t, 60*time.Second, name+" rebooted", func() error {
		if b := m.BootID(); b == "" || b == boot {
			return errors.New("not rebooted yet")
		}

		return nil
	})

	if failures.Load() > 0 {
		t.Fatalf("%d API calls through the VIP failed while one control plane rebooted", failures.Load())
	}

	if got := sb.Fleet().Stats().UnsafeWrites; got != 0 {
		t.Fatalf("unsafe writes: %d", got)
	}
}
