package object

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/state"
)

// The claim is one patch: owner, phase, record and the cordon, and the scale-down guard only
// when ghcrsync sets it (with its provenance).
func TestClaimPatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  state.Fence
		want string
	}{
		{"a node the autoscaler may not take anyway", state.Fence{UID: "u1", DesiredRevision: "r2"},
			`{"metadata":{"annotations":{"ghcrsync.dev/owner":"run-a","ghcrsync.dev/phase":"claimed",` +
				`"ghcrsync.dev/record":"{\"uid\":\"u1\",\"was_cordoned\":false,\"initial_taints\":null,\"desired_revision\":\"r2\",\"scale_down_guard_ours\":false}"}},` +
				`"spec":{"unschedulable":true}}`},
		{"ghcrsync sets the scale-down guard, and says so", state.Fence{UID: "u1", ScaleDownGuardOurs: true},
			`{"metadata":{"annotations":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":"true","ghcrsync.dev/owner":"run-a","ghcrsync.dev/phase":"claimed",` +
				`"ghcrsync.dev/record":"{\"uid\":\"u1\",\"was_cordoned\":false,\"initial_taints\":null,\"desired_revision\":\"\",\"scale_down_guard_ours\":true}",` +
				`"ghcrsync.dev/scale-down-disabled-by":"run-a"}},"spec":{"unschedulable":true}}`},
		{"an operator's cordon is recorded, and the cordon still set", state.Fence{UID: "u1", WasCordoned: true, InitialTaints: []string{"dedicated=gpu:NoSchedule"}},
			`{"metadata":{"annotations":{"ghcrsync.dev/owner":"run-a","ghcrsync.dev/phase":"claimed",` +
				`"ghcrsync.dev/record":"{\"uid\":\"u1\",\"was_cordoned\":true,\"initial_taints\":[\"dedicated=gpu:NoSchedule\"],\"desired_revision\":\"\",\"scale_down_guard_ours\":false}"}},` +
				`"spec":{"unschedulable":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := patchJSON(t, ClaimPatch("run-a", tc.rec)); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}

			// The record the claim writes reads back as the fence it was built from.
			var p struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}

			_ = json.Unmarshal([]byte(tc.want), &p)

			if rec, err := ParseRecord(p.Metadata.Annotations[RecordAnnotation]); err != nil || rec.UID != tc.rec.UID || rec.WasCordoned != tc.rec.WasCordoned {
				t.Fatalf("the record does not read back: %+v %v", rec, err)
			}
		})
	}
}

// The release undoes exactly the fence: an operator's cordon stays, the scale-down guard goes
// only when it is ghcrsync's (by the record, or by the guard's provenance when the record says
// otherwise), another's guard and another run's steering stay.
func TestReleasePatch(t *testing.T) {
	const holder = "run-a"

	node := func(ann map[string]string, tt ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Spec: corev1.NodeSpec{Taints: tt}}
	}

	steering := func(by string) corev1.Taint {
		return corev1.Taint{Key: taints.Steering, Value: taints.RunToken(by), Effect: corev1.TaintEffectPreferNoSchedule}
	}

	const fenceOff = `"ghcrsync.dev/owner":null,"ghcrsync.dev/phase":null,"ghcrsync.dev/record":null`

	proved := func(revision, markerBoot, boot string) *corev1.Node {
		n := node(map[string]string{VerifiedRevisionAnnotation: revision, VerifiedBootAnnotation: markerBoot})
		n.Status.NodeInfo.BootID = boot

		return n
	}

	for _, tc := range []struct {
		name string
		node *corev1.Node
		rec  state.Fence
		hold bool
		want string
	}{
		{"a node ghcrsync cordoned is uncordoned", node(nil), state.Fence{}, false,
			`{"metadata":{"annotations":{` + fenceOff + `}},"spec":{"unschedulable":false}}`},
		{"an operator's cordon stays", node(nil), state.Fence{WasCordoned: true}, false,
			`{"metadata":{"annotations":{` + fenceOff + `}}}`},
		{"the guard ghcrsync set goes", node(nil), state.Fence{ScaleDownGuardOurs: true}, false,
			`{"metadata":{"annotations":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null,` + fenceOff + `,"ghcrsync.dev/scale-down-disabled-by":null}},"spec":{"unschedulable":false}}`},
		{"the guard goes by its provenance when the record was lost", node(map[string]string{ScaleDownDisabledAnnotation: "true", ScaleDownGuardByAnnotation: holder}), state.Fence{}, false,
			`{"metadata":{"annotations":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null,` + fenceOff + `,"ghcrsync.dev/scale-down-disabled-by":null}},"spec":{"unschedulable":false}}`},
		{"an operator's guard stays", node(map[string]string{ScaleDownDisabledAnnotation: "true"}), state.Fence{}, false,
			`{"metadata":{"annotations":{` + fenceOff + `}},"spec":{"unschedulable":false}}`},
		{"another run's guard stays", node(map[string]string{ScaleDownDisabledAnnotation: "true", ScaleDownGuardByAnnotation: "run-b"}), state.Fence{}, false,
			`{"metadata":{"annotations":{` + fenceOff + `}},"spec":{"unschedulable":false}}`},
		{"this run's steering goes with the fence", node(map[string]string{SteeredByAnnotation: holder}, steering(holder), corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}), state.Fence{}, false,
			`{"metadata":{"annotations":{` + fenceOff + `,"ghcrsync.dev/steered-by":null}},"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}],"unschedulable":false}}`},
		{"another run's steering stays", node(map[string]string{SteeredByAnnotation: "run-b"}, steering("run-b")), state.Fence{WasCordoned: true}, false,
			`{"metadata":{"annotations":{` + fenceOff + `}}}`},
		{"an unproven node keeps ghcrsync's cordon, marked as its hold", node(nil), state.Fence{DesiredRevision: "rev"}, true,
			`{"metadata":{"annotations":{` + fenceOff + `,"ghcrsync.dev/unproven":"rev"}}}`},
		{"an unproven node an operator had cordoned stays theirs, not marked", node(nil), state.Fence{WasCordoned: true, DesiredRevision: "rev"}, true,
			`{"metadata":{"annotations":{` + fenceOff + `}}}`},
		{"a node proved on its current boot is uncordoned, whatever the phase said", proved("rev", "boot-2", "boot-2"), state.Fence{DesiredRevision: "rev"}, true,
			`{"metadata":{"annotations":{` + fenceOff + `}},"spec":{"unschedulable":false}}`},
		{"a marker of an earlier boot proves nothing: held", proved("rev", "boot-1", "boot-2"), state.Fence{DesiredRevision: "rev"}, true,
			`{"metadata":{"annotations":{` + fenceOff + `,"ghcrsync.dev/unproven":"rev"}}}`},
		{"a marker of another revision proves nothing: held", proved("old", "boot-2", "boot-2"), state.Fence{DesiredRevision: "rev"}, true,
			`{"metadata":{"annotations":{` + fenceOff + `,"ghcrsync.dev/unproven":"rev"}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := patchJSON(t, ReleasePatch(tc.node, holder, tc.rec, tc.hold)); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func patchJSON(t *testing.T, p map[string]any) string {
	t.Helper()

	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}

	return string(b)
}
