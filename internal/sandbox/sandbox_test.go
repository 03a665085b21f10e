package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/getsops/sops/v3/decrypt"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 3, Workers: 3, Autoscaled: 2})
}

// A JSON patch whose `test` op fails is refused with 422 Invalid and changes nothing; a stale
// resourceVersion in an update is a 409 Conflict. These are the two failure shapes ghcrsync's
// compare-and-swap claims must classify.
func TestJSONPatchTestFailureIs422AndStaleUpdateIs409(t *testing.T) {
	ctx := context.Background()
	kube := sandboxtest.Kube(t)
	const name = "prod-worker-1"

	before := node(t, kube, name)
	patch := []byte(`[{"op":"test","path":"/spec/unschedulable","value":true},
		{"op":"add","path":"/metadata/annotations/ghcrsync.dev~1probe","value":"x"}]`)

	_, err := kube.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("failing test op: want 422 Invalid, got %v", err)
	}

	if _, ok := node(t, kube, name).Annotations["ghcrsync.dev/probe"]; ok {
		t.Fatal("a patch whose test op failed still wrote its add op")
	}

	// A test on the resourceVersion is 422 too, not 409.
	rvPatch := fmt.Appendf(nil, `[{"op":"test","path":"/metadata/resourceVersion","value":"1"},
		{"op":"add","path":"/metadata/annotations/ghcrsync.dev~1probe","value":"x"}]`)
	if _, err := kube.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, rvPatch, metav1.PatchOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("failing resourceVersion test op: want 422 Invalid, got %v", err)
	}

	// Negative control: the same patch with a test that holds is applied.
	okPatch := fmt.Appendf(nil, `[{"op":"test","path":"/metadata/uid","value":%q},
		{"op":"add","path":"/metadata/labels/ghcrsync.dev~1probe","value":"x"}]`, before.UID)
	if _, err := kube.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, okPatch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("passing test op refused: %v", err)
	}

	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/probe": nil}}})
	})

	if before.Spec.Unschedulable {
		t.Fatalf("%s unexpectedly cordoned", name)
	}

	// A stale resourceVersion in an update is 409 Conflict.
	stale := before.DeepCopy()
	stale.Labels["ghcrsync.dev/probe"] = "y"

	if _, err := kube.CoreV1().Nodes().Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale update: want 409 Conflict, got %v", err)
	}
}

// Pins the apiserver's JSON-patch semantics for asserting that an annotation is absent
// (`test` against null): it holds for an absent key of an existing annotations map, fails with
// 422 for a present key, and fails with 422 when the annotations map itself is absent. (The last
// case is pinned on a ConfigMap: on a Node, kube-controller-manager's TTL controller re-adds an
// annotation as soon as the map is gone.)
func TestJSONPatchTestNullSemantics(t *testing.T) {
	ctx := context.Background()
	kube := sandboxtest.Kube(t)
	const name = "prod-worker-3"

	claim := []byte(`[{"op":"test","path":"/metadata/annotations/ghcrsync.dev~1owner","value":null},
		{"op":"add","path":"/metadata/annotations/ghcrsync.dev~1owner","value":"run-a"}]`)

	cm, err := kube.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "null-semantics"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = kube.CoreV1().ConfigMaps("default").Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
	})

	if cm.Annotations != nil {
		t.Fatalf("fresh ConfigMap has annotations %v", cm.Annotations)
	}

	if _, err := kube.CoreV1().ConfigMaps("default").Patch(ctx, cm.Name, types.JSONPatchType, claim, metav1.PatchOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("absent annotations map: want 422 Invalid, got %v", err)
	}

	apply := func() error {
		_, err := kube.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, claim, metav1.PatchOptions{})

		return err
	}

	// A map without the key: the test holds and the add lands.
	sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"ghcrsync.dev/probe": "x"}}})

	if err := apply(); err != nil {
		t.Fatalf("absent key in an existing map: want success, got %v", err)
	}

	// The key is now present: the same claim is refused.
	if err := apply(); !apierrors.IsInvalid(err) {
		t.Fatalf("present key: want 422 Invalid, got %v", err)
	}

	sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		"ghcrsync.dev/probe": nil, "ghcrsync.dev/owner": nil,
	}}})
}

// The kubelet's status heartbeat alone bumps the Node's resourceVersion: the race that broke
// the predecessor's resourceVersion-based claims.
func TestKubeletHeartbeatBumpsNodeResourceVersion(t *testing.T) {
	kube := sandboxtest.Kube(t)
	const name = "prod-worker-2"

	before := node(t, kube, name)
	beat := func(n *corev1.Node) time.Time {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.LastHeartbeatTime.Time
			}
		}

		return time.Time{}
	}

	sandboxtest.Eventually(t, 15*time.Second, "heartbeat bumps resourceVersion", func() error {
		after := node(t, kube, name)
		if after.ResourceVersion == before.ResourceVersion {
			return errors.New("resourceVersion unchanged")
		}

		if !beat(after).After(beat(before)) {
			return errors.New("resourceVersion changed but not by a heartbeat yet")
		}

		return nil
	})

	lease, err := kube.CoordinationV1().Leases("kube-node-lease").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || lease.Spec.RenewTime == nil || time.Since(lease.Spec.RenewTime.Time) > 10*time.Second {
		t.Fatalf("node lease not renewed: %v %+v", err, lease)
	}
}

// An eviction that would break a PodDisruptionBudget is refused with 429, with the budget's
// status computed by the real disruption controller; once the budget allows it, it succeeds.
func TestEvictionBlockedByPDBIs429(t *testing.T) {
	ctx := context.Background()
	kube := sandboxtest.Kube(t)
	ns := "pdb-test"

	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	labels := map[string]string{"app": "guarded"}
	_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Containers:                    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	sandboxtest.Budget(t, kube, ns, "guarded", labels, sandboxtest.MinAvailable(1), 1)

	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=guarded"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want 1 pod: %v %d", err, len(pods.Items))
	}

	evict := func() error {
		return kube.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pods.Items[0].Name, Namespace: ns}})
	}

	if err := evict(); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("eviction against the budget: want 429, got %v", err)
	}

	// Negative control: a budget that allows the disruption lets the eviction through.
	patch := []byte(`{"spec":{"minAvailable":0}}`)
	if _, err := kube.PolicyV1().PodDisruptionBudgets(ns).Patch(ctx, "guarded", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 30*time.Second, "eviction allowed once the budget permits it", evict)
}

// The machinery client reads the machine configuration (os:admin), is refused it with
// os:reader, and sees Talos 1.13's rules for a registry-auth change: no-reboot accepts it and
// the runtime keeps the old credential, staged keeps it for the next boot, and a reboot of a fenced node makes it effective (new
// boot ID, NotReady then Ready). The witness counts no unsafe write.
func TestTalosReadApplyAndReboot(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sandboxtest.Kube(t)
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	const name = "prod-worker-3"

	nctx := onNode(ctx, t, name)

	ver, err := talos.Version(nctx)
	if err != nil {
		t.Fatal(err)
	}

	if got := ver.Messages[0].GetVersion().GetTag(); got != "v1.13.9" {
		t.Fatalf("Talos version %q", got)
	}

	mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, talos.COSI, talosconfig.ActiveID)
	if err != nil {
		t.Fatal(err)
	}

	if auth := mc.Config().RegistryAuthConfigs()[sandbox.RegistryHost]; auth == nil || auth.Username() != sb.OldCredential().Username {
		t.Fatalf("machine config registry auth: %+v", auth)
	}

	// os:reader sees the version but not the (sensitive) machine config.
	reader := sandboxtest.Talos(t, sandbox.TalosconfigReaderFile)
	if _, err := reader.Version(nctx); err != nil {
		t.Fatalf("reader Version: %v", err)
	}

	if _, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, reader.COSI, talosconfig.ActiveID); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader reads machine config: want PermissionDenied, got %v", err)
	}

	if _, err := reader.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader applies config: want PermissionDenied, got %v", err)
	}

	data := withRegistryAuth(t, mc.Provider(), sb.NewCredential())

	m, _ := sb.Fleet().Machine(name)

	// Talos 1.13 compares only the v1alpha1 document: a registry-auth change is "applied without a
	// reboot", and the runtime keeps the credential it booted with (applied, not loaded).
	resp, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_NO_REBOOT})
	if err != nil || resp.GetMessages()[0].GetModeDetails() != "Applied configuration without a reboot" {
		t.Fatalf("no-reboot registry-auth change on Talos 1.13: want machined's answer, got %v %v", resp, err)
	}

	if m.Configured() != sb.NewCredential() || m.Effective() != sb.OldCredential() {
		t.Fatalf("after a no-reboot apply: configured %s, effective %s; want the new configured and the old loaded",
			m.Configured().Username, m.Effective().Username)
	}

	if _, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_STAGED}); err != nil {
		t.Fatal(err)
	}

	persistent, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, talos.COSI, talosconfig.PersistentID)
	if err != nil {
		t.Fatal(err)
	}

	if got := persistent.Config().RegistryAuthConfigs()[sandbox.RegistryHost].Username(); got != sb.NewCredential().Username {
		t.Fatalf("staged config holds %q", got)
	}

	if m.Effective() != sb.OldCredential() {
		t.Fatal("a staged config changed the running credential")
	}

	unsafeBefore := stats(t).UnsafeWrites
	unfence := fence(t, kube, name)
	bootBefore := node(t, kube, name).Status.NodeInfo.BootID

	if err := talos.Reboot(nctx); err != nil {
		t.Fatal(err)
	}

	// NotReady while down, with the node-lifecycle controller's taint.
	sandboxtest.Eventually(t, 30*time.Second, name+" NotReady with not-ready taint", func() error {
		n := node(t, kube, name)
		if sandbox.NodeReady(n) {
			return errors.New("still Ready")
		}

		if !slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == corev1.TaintNodeNotReady }) {
			return errors.New("no not-ready taint yet")
		}

		return nil
	})

	if _, err := talos.Version(nctx); status.Code(err) != codes.Unavailable {
		t.Errorf("Talos API of a rebooting machine: want Unavailable, got %v", err)
	}

	after := waitRebooted(t, kube, name, bootBefore)
	sandboxtest.Eventually(t, 30*time.Second, "lifecycle taints cleared", func() error {
		if slices.ContainsFunc(node(t, kube, name).Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == corev1.TaintNodeNotReady }) {
			return errors.New("not-ready taint still present")
		}

		return nil
	})

	if m.Effective() != sb.NewCredential() || m.Configured() != sb.NewCredential() {
		t.Fatalf("after reboot the runtime should use the staged credential")
	}

	unfence()

	if got := stats(t).UnsafeWrites - unsafeBefore; got != 0 {
		t.Fatalf("fenced reboot counted as unsafe (%d): %+v", got, stats(t).Unsafe)
	}

	t.Logf("%s rebooted: boot %s -> %s", name, bootBefore, after.Status.NodeInfo.BootID)
}

// A reboot of a node that is not fenced (not cordoned, no owner, running pods) is counted and
// described by the safety witness.
func TestUnfencedRebootIsCountedUnsafe(t *testing.T) {
	ctx := context.Background()
	kube := sandboxtest.Kube(t)
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	const name = "prod-worker-1"

	before := stats(t)
	bootBefore := node(t, kube, name).Status.NodeInfo.BootID

	if _, err := talos.RebootWithResponse(onNode(ctx, t, name)); err != nil {
		t.Fatal(err)
	}

	after := stats(t)
	if after.UnsafeWrites != before.UnsafeWrites+1 {
		t.Fatalf("unsafe writes %d -> %d", before.UnsafeWrites, after.UnsafeWrites)
	}

	last := after.Unsafe[len(after.Unsafe)-1]
	if last.Node != name || !slices.Contains(last.Reasons, "not cordoned") || !slices.Contains(last.Reasons, "no "+sandbox.OwnerAnnotation+" annotation") {
		t.Fatalf("unsafe write record: %+v", last)
	}

	if after.Reboots[name] != before.Reboots[name]+1 || after.TalosWrites[name] <= before.TalosWrites[name] {
		t.Fatalf("counters: reboots %v talos_writes %v", after.Reboots, after.TalosWrites)
	}

	waitRebooted(t, kube, name, bootBefore)
}

// A pod on a node whose runtime still uses a revoked credential fails with ErrImagePull even
// though the node's config already has a valid one; after the node's reboot it pulls.
func TestStaleEffectiveCredentialFailsUntilReboot(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sandboxtest.Kube(t)
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	const name = "prod-worker-2"

	nctx := onNode(ctx, t, name)
	m, _ := sb.Fleet().Machine(name)

	// Give this node alone a credential of its own, so revoking it touches no other node.
	credA := sandbox.Credential{Username: "only-" + name, Password: "pw-a-" + t.Name()}
	credB := sandbox.Credential{Username: "next-" + name, Password: "pw-b-" + t.Name()}
	sb.Registry().AddCredential(credA.Username, credA.Password)
	sb.Registry().AddCredential(credB.Username, credB.Password)

	stageAndReboot := func(cred sandbox.Credential, reboot bool) {
		t.Helper()

		mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, talos.COSI, talosconfig.ActiveID)
		if err != nil {
			t.Fatal(err)
		}

		if _, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{
			Data: withRegistryAuth(t, mc.Provider(), cred), Mode: machine.ApplyConfigurationRequest_STAGED,
		}); err != nil {
			t.Fatal(err)
		}

		if reboot {
			unfence := fence(t, kube, name)
			boot := node(t, kube, name).Status.NodeInfo.BootID

			if err := talos.Reboot(nctx); err != nil {
				t.Fatal(err)
			}

			waitRebooted(t, kube, name, boot)
			unfence()
		}
	}

	stageAndReboot(credA, true)

	if m.Effective() != credA {
		t.Fatal("credential A not effective after reboot")
	}

	stageAndReboot(credB, false) // configured B, runtime still A
	sb.Registry().RevokeCredential(credA.Username)

	probe := func(podName string) *corev1.Pod {
		p, err := kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName},
			Spec: corev1.PodSpec{
				NodeName:                      name,
				TerminationGracePeriodSeconds: ptr.To(int64(0)),
				// Always: asks the registry with the runtime's credential, never a copy on the node.
				Containers: []corev1.Container{{Name: "probe", Image: sandbox.RegistryHost + "/ghcrsync/private-probe:v1", ImagePullPolicy: corev1.PullAlways}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}

		return p
	}

	podState := func(podName string) (phase corev1.PodPhase, waiting string) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return "", err.Error()
		}

		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Waiting != nil {
				waiting = cs.State.Waiting.Reason
			}
		}

		return p.Status.Phase, waiting
	}

	deniedBefore := stats(t).Pulls.Denied
	probe("stale-probe")

	sandboxtest.Eventually(t, 30*time.Second, "ErrImagePull with the stale runtime credential", func() error {
		if phase, waiting := podState("stale-probe"); waiting != "ErrImagePull" {
			return fmt.Errorf("phase %s waiting %q", phase, waiting)
		}

		return nil
	})

	if stats(t).Pulls.Denied <= deniedBefore {
		t.Fatal("denied pull not counted")
	}

	if err := kube.CoreV1().Pods("default").Delete(ctx, "stale-probe", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 30*time.Second, "probe pod gone", func() error {
		if _, err := kube.CoreV1().Pods("default").Get(ctx, "stale-probe", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}

		return nil
	})

	// Reboot: the runtime loads the configured credential B.
	unfence := fence(t, kube, name)
	boot := node(t, kube, name).Status.NodeInfo.BootID

	if err := talos.Reboot(nctx); err != nil {
		t.Fatal(err)
	}

	waitRebooted(t, kube, name, boot)
	unfence()

	probe("fresh-probe")
	sandboxtest.Eventually(t, 30*time.Second, "pull succeeds after the reboot", func() error {
		if phase, waiting := podState("fresh-probe"); phase != corev1.PodRunning {
			return fmt.Errorf("phase %s waiting %q", phase, waiting)
		}

		return nil
	})

	_ = kube.CoreV1().Pods("default").Delete(ctx, "fresh-probe", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
}

// The autoscaler adds and removes the candidate taint — each add with a fresh timestamp, never
// rewritten while present, as the real one — never touches a node with scale-down disabled, and
// scales a node down (taint, cordon, evict, delete Node and machine).
func TestAutoscalerChurnsCandidateTaintAndDeletesNode(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sandboxtest.Kube(t)

	var managed []string

	for _, m := range sb.Fleet().Machines() {
		if m.Autoscaled {
			managed = append(managed, m.Name)
		}
	}

	if len(managed) < 2 {
		t.Fatalf("want 2 autoscaled machines, have %v", managed)
	}

	protected, victim := managed[0], managed[1]
	sandboxtest.PatchNode(t, kube, protected, map[string]any{"metadata": map[string]any{"annotations": map[string]any{sandbox.ScaleDownDisabledAnnotation: "true"}}})

	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, protected, map[string]any{"metadata": map[string]any{"annotations": map[string]any{sandbox.ScaleDownDisabledAnnotation: nil}}})
	})

	candidateValue := func(name string) (string, bool) {
		for _, tt := range node(t, kube, name).Spec.Taints {
			if tt.Key == sandbox.DeletionCandidateTaint {
				if tt.Effect != corev1.TaintEffectPreferNoSchedule {
					t.Fatalf("candidate taint effect %s", tt.Effect)
				}

				return tt.Value, true
			}
		}

		return "", false
	}

	seen := map[string]bool{}
	removed, protectedTainted, last := false, 0, ""
	deadline := time.Now().Add(30 * time.Second)

	for time.Now().Before(deadline) && (len(seen) < 2 || !removed) {
		v, ok := candidateValue(victim)
		if ok {
			if last != "" && v != last {
				t.Fatalf("the candidate taint on %s was rewritten while present: %s -> %s", victim, last, v)
			}

			seen[v], last = true, v
		} else {
			removed, last = removed || len(seen) > 0, ""
		}

		if _, ok := candidateValue(protected); ok {
			protectedTainted++
		}

		time.Sleep(200 * time.Millisecond)
	}

	if len(seen) < 2 || !removed {
		t.Fatalf("candidate taint on %s did not churn: values %v, removed %t", victim, seen, removed)
	}

	// The protected node may carry a taint from before the annotation for one loop, no longer.
	if protectedTainted > 10 {
		t.Fatalf("autoscaler kept a candidate taint on %s despite %s", protected, sandbox.ScaleDownDisabledAnnotation)
	}

	if _, err := sb.Do(ctx, "scale-down", sandbox.Request{Node: protected}); err == nil {
		t.Fatal("scale-down of a node with scale-down disabled was accepted")
	}

	if _, err := sb.Do(ctx, "scale-down", sandbox.Request{Node: victim}); err != nil {
		t.Fatal(err)
	}

	if _, err := kube.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("scaled-down node still exists: %v", err)
	}

	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	if _, err := talos.Version(onNodeIPOrName(ctx, victim)); status.Code(err) != codes.Unavailable {
		t.Fatalf("Talos API of a deleted machine: want Unavailable, got %v", err)
	}

	out, err := sb.Do(ctx, "scale-up", sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}

	added := out.(map[string]string)["added"]
	if !strings.HasPrefix(added, "autoscale-cx43-") || len(added) != len("autoscale-cx43-")+16 {
		t.Fatalf("scale-up added %q", added)
	}
}

// Rebooting the control-plane node that serves the kubeconfig's endpoint refuses connections
// for the reboot window; the endpoint comes back with the node.
func TestEndpointNodeRebootRefusesConnections(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sandboxtest.Kube(t)
	direct := sb.Kube()
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	const name = "prod-control-plane-1"

	endpoint := strings.TrimPrefix(sb.EndpointURL(), "https://")
	if host, _, _ := net.SplitHostPort(endpoint); host != machineIP(t, name) {
		t.Fatalf("endpoint %s is not %s's address", endpoint, name)
	}

	unfence := fence(t, direct, name)
	defer unfence()

	boot := node(t, direct, name).Status.NodeInfo.BootID

	if err := talos.Reboot(onNode(ctx, t, name)); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 10*time.Second, "endpoint refuses connections", func() error {
		c, err := net.DialTimeout("tcp", endpoint, time.Second)
		if err == nil {
			c.Close()

			return errors.New("endpoint still accepts connections")
		}

		if !strings.Contains(err.Error(), "connection refused") {
			return err
		}

		return nil
	})

	if _, err := kube.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err == nil {
		t.Fatal("kubeconfig client reached the API while its endpoint node rebooted")
	}

	waitRebooted(t, direct, name, boot)

	sandboxtest.Eventually(t, 30*time.Second, "kubeconfig client reaches the API again", func() error {
		_, err := kube.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})

		return err
	})
}

// The fixtures are real: the SOPS file decrypts with the age key to the new credential, and
// ghcrsync.hcl is valid HCL pointing at the sandbox registry.
func TestFixtures(t *testing.T) {
	sb := sandboxtest.Get(t)

	t.Setenv("SOPS_AGE_KEY_FILE", sb.Path(sandbox.AgeKeyFile))

	plain, err := decrypt.File(sb.Path(sandbox.SecretFile), "yaml")
	if err != nil {
		t.Fatal(err)
	}

	raw, err := os.ReadFile(sb.Path(sandbox.SecretFile))
	if err != nil {
		t.Fatal(err)
	}

	if strings.Contains(string(raw), sb.NewCredential().Password) {
		t.Fatal("the encrypted file contains the plaintext password")
	}

	var doc struct {
		StringData map[string]string `json:"stringData"`
	}

	if err := yamlUnmarshal(plain, &doc); err != nil {
		t.Fatal(err)
	}

	cred, err := credential.Parse([]byte(doc.StringData["ghcr_dockerconfigjson"]), sandbox.RegistryHost)
	if err != nil || cred.Username != sb.NewCredential().Username || cred.Password() != sb.NewCredential().Password {
		t.Fatalf("decrypted credential is not the new one: %v", err)
	}

	// A different age key cannot decrypt it.
	other := t.TempDir() + "/other.key"
	if err := os.WriteFile(other, []byte("AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ\n"), 0o600); err == nil {
		t.Setenv("SOPS_AGE_KEY_FILE", other)

		if _, err := decrypt.File(sb.Path(sandbox.SecretFile), "yaml"); err == nil {
			t.Fatal("decrypted with the wrong age key")
		}
	}

	f, diags := hclparse.NewParser().ParseHCLFile(sb.Path(sandbox.ConfigFile))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}

	if !strings.Contains(string(f.Bytes), sb.Registry().URL()) || !strings.Contains(string(f.Bytes), `"15s"`) {
		t.Fatalf("ghcrsync.hcl not filled in:\n%s", f.Bytes)
	}

	env, err := os.ReadFile(sb.Path(sandbox.EnvFile))
	if err != nil {
		t.Fatal(err)
	}

	for _, v := range []string{"KUBECONFIG=", "TALOSCONFIG=", "SOPS_AGE_KEY_FILE=", "GHCRSYNC_SANDBOX_ADMIN="} {
		if !strings.Contains(string(env), "export "+v) {
			t.Errorf("env lacks %s", v)
		}
	}
}

// The CI fake answers the GitHub Actions run-attempt endpoint with the status set at run time.
func TestCIAPIRunAttemptStatus(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)

	get := func() (int, string) {
		resp, err := httpGet(ctx, sb.CIURL()+"/repos/org/repo/actions/runs/42/attempts/1")
		if err != nil {
			t.Fatal(err)
		}

		var body struct{ Status string }
		_ = json.Unmarshal(resp.body, &body)

		return resp.code, body.Status
	}

	if code, _ := get(); code != 404 {
		t.Fatalf("unknown run: %d", code)
	}

	for _, st := range []string{"in_progress", "completed"} {
		if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: "42", Attempt: "1", Status: st}); err != nil {
			t.Fatal(err)
		}

		if code, got := get(); code != 200 || got != st {
			t.Fatalf("status %d %q, want %q", code, got, st)
		}
	}
}

// The audit log attributes writes to identities and records no reads: the evidence a
// read-only command is checked against.
func TestAuditLogRecordsWritesByIdentity(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	path := t.TempDir() + "/kubeconfig"

	if err := sb.WriteKubeconfig(path, "audit-probe", "system:masters"); err != nil {
		t.Fatal(err)
	}

	t.Setenv("KUBECONFIG", path)

	kube := sandboxtest.KubeFrom(t, path)
	if _, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}

	if writes, err := sb.AuditedWrites("audit-probe"); err != nil || len(writes) != 0 {
		t.Fatalf("a read was audited as a write: %v %+v", err, writes)
	}

	if _, err := kube.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "audit-probe"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 5*time.Second, "write audited", func() error {
		writes, err := sb.AuditedWrites("audit-probe")
		if err != nil {
			return err
		}

		if len(writes) != 1 || writes[0].Verb != "create" {
			return fmt.Errorf("audited writes %+v", writes)
		}

		return nil
	})
}

// The kubelet follows the pull policy: Always asks the registry every time (and says
// "Successfully pulled image"), IfNotPresent starts from the copy on the node ("already present
// on machine") — even once the registry denies the node's credential the repository, as a real
// kubelet does for an image pulled with the node's own credential. So only an Always pull is a
// proof of the credential: the Always pod then fails with ErrImagePull (the control).
func TestKubeletFollowsThePullPolicy(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sandboxtest.Kube(t)
	const name = "prod-worker-1"

	image := sandbox.RegistryHost + "/ghcrsync/private-probe:v1"
	m, _ := sb.Fleet().Machine(name)

	run := func(podName string, policy corev1.PullPolicy) {
		t.Helper()

		_, err := kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName},
			Spec: corev1.PodSpec{
				NodeName: name, TerminationGracePeriodSeconds: ptr.To(int64(0)),
				Containers: []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: policy}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}

		t.Cleanup(func() {
			_ = kube.CoreV1().Pods("default").Delete(context.Background(), podName, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		})
	}

	await := func(podName, wantWaiting, wantEvent string) {
		t.Helper()

		sandboxtest.Eventually(t, 30*time.Second, podName+" "+wantEvent, func() error {
			p, err := kube.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
			if err != nil {
				return err
			}

			waiting := ""
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Waiting != nil {
					waiting = cs.State.Waiting.Reason
				}
			}

			if wantWaiting == "" && p.Status.Phase != corev1.PodRunning || wantWaiting != "" && waiting != wantWaiting {
				return fmt.Errorf("phase %s, waiting %q", p.Status.Phase, waiting)
			}

			evs, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
			if err != nil {
				return err
			}

			for _, e := range evs.Items {
				if strings.Contains(e.Message, wantEvent) && e.Source.Component == "kubelet" && e.Source.Host == name {
					return nil
				}
			}

			return fmt.Errorf("no kubelet event %q among %d", wantEvent, len(evs.Items))
		})
	}

	run("policy-always", corev1.PullAlways)
	await("policy-always", "", "Successfully pulled image")

	pulls := stats(t).Pulls.OK

	run("policy-if-not-present", corev1.PullIfNotPresent)
	await("policy-if-not-present", "", "already present on machine")

	if got := stats(t).Pulls.OK; got != pulls {
		t.Fatalf("IfNotPresent with the image on the node pulled (%d pulls, want %d)", got, pulls)
	}

	user := m.Effective().Username
	sb.Registry().DenyRepository(user, "ghcrsync/private-probe")
	t.Cleanup(func() { sb.Registry().AllowRepository(user, "ghcrsync/private-probe") })

	run("denied-if-not-present", corev1.PullIfNotPresent)
	await("denied-if-not-present", "", "already present on machine")

	run("denied-always", corev1.PullAlways)
	await("denied-always", "ErrImagePull", "Failed to pull image")
}

// With a scale rate, the autoscaler's own loop scales down a node that stayed a candidate for
// more than one loop (its taint kept, as the real one keeps it); a node annotated
// scale-down-disabled is never its candidate, so never scaled down (the control).
func TestAutoscalerLoopScalesDownALongStandingCandidate(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 0, Autoscaled: 2, NoWorkloads: true, Seed: 21,
		AutoscalerScaleRate: 1, AutoscalerInterval: 500 * time.Millisecond, Heartbeat: time.Second,
	})
	kube := sb.Kube()

	var managed []string

	for _, m := range sb.Fleet().Machines() {
		if m.Autoscaled {
			managed = append(managed, m.Name)
		}
	}

	protected := managed[0]
	sandboxtest.PatchNode(t, kube, protected, map[string]any{"metadata": map[string]any{"annotations": map[string]any{sandbox.ScaleDownDisabledAnnotation: "true"}}})

	sandboxtest.Eventually(t, time.Minute, "the loop to scale down the unprotected node", func() error {
		if _, ok := sb.Fleet().Machine(managed[1]); ok {
			return fmt.Errorf("%s still there", managed[1])
		}

		return nil
	})

	if _, ok := sb.Fleet().Machine(protected); !ok {
		t.Fatalf("the loop scaled down %s despite %s", protected, sandbox.ScaleDownDisabledAnnotation)
	}
}
