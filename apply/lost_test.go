package apply_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/state"
)

// The answer to every kind of write a run makes is lost once, after the server carried it out
// (a timeout, a connection cut by the endpoint's reboot): the run finds what landed and adopts
// it — the node rotated, the state and the cluster agreeing, nothing left held, the verdict
// clean. The bash predecessor refused its own landed claim as "cordoned since the plan" and
// failed a node whose release had landed.
func TestLostAnswersAreAdopted(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name = "prod-worker-2"

	node := "/api/v1/nodes/" + name
	cases := []struct {
		what, method, path, body string
		before                   func(t *testing.T)
	}{
		{"the claim", "PATCH", node, `"unschedulable":true`, nil},
		{"a phase mirror", "PATCH", node, `"` + object.PhaseAnnotation + `":"drained"`, nil},
		{"the verified marker", "PATCH", node, object.VerifiedRevisionAnnotation, nil},
		{"the release", "PATCH", node, `"` + object.OwnerAnnotation + `":null`, nil},
		{"an eviction", "POST", "/eviction", "", func(t *testing.T) {
			sandboxtest.PinnedDeployment(t, sb.Kube(), "lost-eviction", "pinned", name) // a pod to evict
		}},
		{"the probe pod's create", "POST", "/namespaces/" + sandbox.ProbeNamespace + "/pods", "", nil},
		{"the Lease's create", "POST", "/leases", "", nil},
		{"the Lease's release", "PATCH", "/leases/", `"op":"test"`, nil},
		{"a consumer's update", "PUT", "/namespaces/" + sandbox.ConsumerNamespaces[0] + "/secrets/" + sandbox.ConsumerSecret, "", nil},
		{"a consumer's create", "POST", "/namespaces/" + sandbox.ConsumerNamespaces[1] + "/secrets", "", func(t *testing.T) {
			_ = sb.Kube().CoreV1().Secrets(sandbox.ConsumerNamespaces[1]).Delete(ctx, sandbox.ConsumerSecret, metav1.DeleteOptions{})
		}},
		{"a service account's reference", "PATCH", "/namespaces/" + sandbox.ConsumerNamespaces[1] + "/serviceaccounts/default", "", func(t *testing.T) {
			sa, err := sb.Kube().CoreV1().ServiceAccounts(sandbox.ConsumerNamespaces[1]).Get(ctx, "default", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			sa.ImagePullSecrets = nil
			if _, err := sb.Kube().CoreV1().ServiceAccounts(sandbox.ConsumerNamespaces[1]).Update(ctx, sa, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"the node template's update", "PUT", "/namespaces/" + sandbox.TemplateNamespace + "/secrets/" + sandbox.TemplateSecret, "", nil},
		{"the root's update", "PUT", "/namespaces/" + sandbox.RootNamespace + "/secrets/" + sandbox.RootSecret, "", nil},
		{"Talos's apply of the config", "/machine.MachineService/ApplyConfiguration", "", "", nil},
		{"Talos's reboot", "/machine.MachineService/Reboot", "", "", nil},
	}

	for i, tc := range cases {
		t.Run(strings.ReplaceAll(tc.what, " ", "_"), func(t *testing.T) {
			if tc.before != nil {
				tc.before(t)
			}

			d := &sandboxtest.Dropper{}
			lease := fmt.Sprintf("lost-%d", i)
			r := newRotation(t, sb, shortLease(lease), name)
			r.faults = &workspace.Faults{Kube: d.Kube, Talos: d.Talos()}
			path := r.plan()

			if strings.HasPrefix(tc.method, "/") {
				d.Arm(tc.method, tc.method, "", 1)
			} else {
				d.Arm(tc.method, tc.path, tc.body, 1)
			}

			res, err := r.apply(path, apply.Hooks{})
			if err != nil {
				t.Fatal(err)
			}

			if len(d.Fired()) == 0 {
				t.Fatalf("no answer was lost: the case tests nothing")
			}

			if x := r.result(res, name); x.Outcome != state.OutcomeDone || res.Failed() != 0 || !res.SafeToRevoke() || res.ReleaseErr != nil {
				t.Fatalf("with the answer of %s lost (%v): %+v; secrets %+v; lease %v; verdict %+v", tc.what, d.Fired(), x, res.Secrets, res.ReleaseErr, res.Verdict)
			}

			assertReleased(t, sb, name, false)
			assertLeaseFree(t, sb, lease)

			if rec := r.readState().Record(name); rec == nil || rec.Outcome != state.OutcomeDone || rec.Holds() {
				t.Fatalf("the state disagrees with the cluster: %+v", rec)
			}

			if rep := fences(t, r.cfg, ""); len(rep.Fences) != 0 {
				t.Fatalf("something is left held: %+v", rep.Fences)
			}
		})
	}
}
