package apply_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/registryauth"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// An operator cordons a node between plan and apply: apply refuses it; release and the next
// apply's reclaim leave the operator's cordon in place (the claim never landed). Negative
// control: a node ghcrsync did claim and left fenced is released, cordon and all.
func TestOperatorCordonIsNeverUndone(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-2"

	r := newRotation(t, sb, nil, name)
	path := r.plan()

	sandboxtest.Cordon(t, kube, name)
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": false}})
	})

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeFailed || x.Reason != plan.ReasonCordonChanged {
		t.Fatalf("apply over an operator's cordon: %+v", x)
	}

	if rec := r.readState().Record(name); rec.Holds() {
		t.Fatalf("a refused node's record holds a fence: %+v", rec)
	}

	rel := release(t, r.cfg)
	if len(rel.Outcomes) != 0 || !node(t, sb, name).Spec.Unschedulable {
		t.Fatalf("release touched the operator's cordon: %+v", rel.Outcomes)
	}

	// The next apply (the node is planned cordoned now: an admin's cordon) reclaims nothing of
	// it and keeps the cordon.
	r2 := newRotation(t, sb, nil, name)
	st := r.readState()
	_ = writeJSON(t, r2.state, st)
	path2 := r2.plan()

	res2, err := r2.apply(path2, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if len(res2.Reclaimed) != 0 || r2.result(res2, name).Outcome != state.OutcomeDone {
		t.Fatalf("second apply: reclaimed %+v, %+v", res2.Reclaimed, r2.result(res2, name))
	}

	assertReleased(t, sb, name, true)
}

// Every node fails the same way (the probe image cannot be pulled): exactly one node fails, the
// others are never started (no claim, no Talos write), and the result names the budget.
// Negative control: with max_failures = 2, a second node is tried.
func TestFailureBudget(t *testing.T) {
	sb := sandboxtest.Get(t)
	nodes := []string{"prod-worker-1", "prod-worker-2", "prod-worker-3"}

	for _, tc := range []struct {
		budget, failed int
	}{{1, 1}, {2, 2}} {
		r := newRotation(t, sb, func(s string) string {
			s = strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "20s"`, 1)

			return strings.Replace(s, "nodes {", fmt.Sprintf("nodes {\n  max_failures = %d", tc.budget), 1)
		}, nodes...)
		path := r.plan()
		t.Cleanup(func() { sb.Registry().AllowRepository(r.cred.Username, "ghcrsync/private-probe") })
		writesBefore := sb.Fleet().Stats().TalosWrites

		// Once the run has proved the credential, it loses the probe's package: every node's
		// runtime proof fails the same way.
		res, err := r.apply(path, apply.Hooks{BeforeMutation: func(_ string, phase state.Phase) {
			if phase == state.PhaseClaimed {
				sb.Registry().DenyRepository(r.cred.Username, "ghcrsync/private-probe")
			}
		}})
		if err != nil {
			t.Fatal(err)
		}

		counts := map[state.Outcome]int{}

		for _, x := range res.Nodes {
			counts[x.Outcome]++

			if x.Outcome == state.OutcomeSkipped {
				n := node(t, sb, x.Node)
				if n.Annotations[object.OwnerAnnotation] != "" || n.Spec.Unschedulable || sb.Fleet().Stats().TalosWrites[x.Node] != writesBefore[x.Node] {
					t.Fatalf("a node the budget stopped was touched: %s", x.Node)
				}
			}
		}

		if counts[state.OutcomeFailed] != tc.failed || counts[state.OutcomeSkipped] != len(nodes)-tc.failed || res.Failed() != tc.failed+1 /* root held back */ {
			t.Fatalf("budget %d: outcomes %v", tc.budget, counts)
		}

		// Release what the failed nodes keep (the run is over; named explicitly).
		if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
			t.Fatalf("release: %+v", rel.Outcomes)
		}

		for _, n := range nodes {
			waitReady(t, sb, n)
		}
	}
}

// A node whose Talos API accepts calls and never answers fails within the call's bound (the run
// does not hang on it), and the run ends there.
func TestHungTalosFailsWithinItsBound(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-3"

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, "talos {", "talos {\n  timeout = \"2s\"", 1)
	}, name, "prod-worker-1")
	path := r.plan()

	m, _ := sb.Fleet().Machine(name)
	t.Cleanup(func() { m.SetHung(false) })

	var hung time.Time

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node == name && phase == state.PhaseConfigured {
			m.SetHung(true)
			hung = time.Now()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	x := r.result(res, name)
	if x.Outcome != state.OutcomeFailed || !strings.Contains(x.Message, "DeadlineExceeded") {
		t.Fatalf("hung Talos: %+v", x)
	}

	if took := time.Since(hung); took > time.Minute {
		t.Fatalf("the run waited %s on a hung node", took)
	}

	m.SetHung(false)

	if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
		t.Fatalf("release: %+v", rel.Outcomes)
	}

	waitReady(t, sb, name)
}

// plan reads versions and service lists one-to-many: a node whose Talos API hangs holds that call
// to its deadline, and plan then reads the batch node by node, so the hung node alone is left out
// (fail closed, naming the deadline) and the others are planned as usual.
func TestPlanWithAHungTalosNode(t *testing.T) {
	sb := sandboxtest.Get(t)
	const hung, fine = "prod-worker-3", "prod-worker-1"

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, "talos {", "talos {\n  timeout = \"2s\"", 1)
	}, hung, fine)

	m, _ := sb.Fleet().Machine(hung)
	m.SetHung(true)
	t.Cleanup(func() { m.SetHung(false) })

	res, err := planCfg(context.Background(), r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if n, _ := res.Plan.Node(hung); n.Action != plan.ActionDeselect || n.Reason != plan.ReasonTalosUnreachable || !strings.Contains(n.Sentence, "DeadlineExceeded") {
		t.Fatalf("the hung node: %+v", n)
	}

	if n, _ := res.Plan.Node(fine); n.Action != plan.ActionFence {
		t.Fatalf("the node that answers: %+v", n)
	}
}

// An API outage longer than the Lease's duration, with nobody taking the Lease: the run resumes
// when the API is back and completes. Negative control: a usurper takes the Lease during the
// outage: the run stops mutating at its next step, says so, and never reboots the node.
func TestAPIOutageLongerThanTheLease(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	const name = "prod-worker-1"

	for _, usurp := range []bool{false, true} {
		leaseName := "outage-" + map[bool]string{false: "resume", true: "usurped"}[usurp]
		r := newRotation(t, sb, shortLease(leaseName), name)
		path := r.plan()
		rebootsBefore := sb.Fleet().Stats().Reboots[name]

		res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
			if phase != state.PhaseRebooting {
				return
			}

			if _, err := sb.Do(ctx, "api-outage", sandbox.Request{Duration: "9s"}); err != nil {
				t.Error(err)
			}

			if usurp {
				time.Sleep(time.Second)

				l, err := sb.Kube().CoordinationV1().Leases("flux-system").Get(ctx, leaseName, metav1.GetOptions{})
				if err == nil {
					l.Spec.HolderIdentity = ptr.To("usurper")
					_, err = sb.Kube().CoordinationV1().Leases("flux-system").Update(ctx, l, metav1.UpdateOptions{})
				}

				if err != nil {
					t.Error(err)
				}
			}
		}})
		if err != nil {
			t.Fatal(err)
		}

		x := r.result(res, name)

		if !usurp {
			if x.Outcome != state.OutcomeDone || !strings.Contains(r.log.String(), "the API is back and the Lease still names us") {
				t.Fatalf("after a long outage: %+v\n%s", x, r.log.String())
			}

			continue
		}

		if x.Outcome != state.OutcomeFailed || !strings.Contains(x.Message, "lease lost") || !strings.Contains(x.Message, "usurper") ||
			sb.Fleet().Stats().Reboots[name] != rebootsBefore {
			t.Fatalf("with a usurper: %+v (reboots %d → %d)", x, rebootsBefore, sb.Fleet().Stats().Reboots[name])
		}

		if res.ReleaseErr == nil {
			t.Fatal("the run released a Lease it no longer held")
		}

		if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 1 /* the usurper's Lease is not ours to release */ {
			t.Fatalf("release: %+v", rel.Outcomes)
		}

		liftUnproven(t, sb, r.cfg, name) // its config was written before the Lease was lost, never proved

		assertReleased(t, sb, name, false)
	}
}

// The Kubernetes state backend: a state write whose response is lost after it committed, and a
// concurrent `state rm` of another node's record, do not stop the run: it re-reads, recognises its
// own write, keeps the other writer's change, and completes.
func TestKubeStateBackendSurvivesLostWritesAndConcurrentWriters(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-2"

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, `backend = "local"`, `backend = "kubernetes"`+"\n  secret  = \"ghcrsync-state-lossy\"", 1)
	}, name)

	// The state already holds a record of another node (an earlier run's).
	seed, err := pushState(r.cfg, writeJSON(t, r.dir+"/seed.json", &state.State{FormatVersion: state.FormatVersion, Lineage: "lossy-lineage", Serial: 1,
		Records: []state.Record{{Node: "decommissioned", Phase: state.PhaseReleased, Outcome: state.OutcomeDone}}}))
	if err != nil {
		t.Fatal(err)
	}

	path := r.plan()

	d := &responseDropper{}
	cfg := sb.AdminRESTConfig()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { d.next = rt; return d })

	lossy, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	r.storeClient = lossy

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		switch phase {
		case state.PhaseGuarded:
			d.dropNext()
		case state.PhaseDrained:
			if err := removeState(r.cfg, "decommissioned"); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeDone || res.Failed() != 0 {
		t.Fatalf("run with a lost write and a concurrent rm: %+v %+v", x, res.Secrets)
	}

	if !d.dropped() {
		t.Fatal("no state write lost its response")
	}

	st, err := pullState(r.cfg)
	if err != nil || st.Lineage != seed.Lineage || st.Record("decommissioned") != nil || st.Record(name).Outcome != state.OutcomeDone || st.Run.Outcome != "succeeded" {
		t.Fatalf("final state: %v %+v", err, st)
	}
}

// responseDropper loses the response of one state write (a PUT of a Secret): the server commits
// it, the client sees a cut connection.
type responseDropper struct {
	mu     sync.Mutex
	next   http.RoundTripper
	armed  bool
	lostIt bool
}

func (d *responseDropper) dropNext() {
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
}

func (d *responseDropper) dropped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()

	return d.lostIt
}

func (d *responseDropper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(req)

	d.mu.Lock()
	defer d.mu.Unlock()

	if d.armed && err == nil && req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/secrets/") {
		d.armed, d.lostIt = false, true
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()

		return nil, errors.New("http2: client connection lost")
	}

	return resp, err
}

// The runtime proof is the pull, not a command the image may not have: a distroless probe image
// (no shell, no /bin/true, a missing entrypoint) proves. Negative control: once the new
// credential is revoked at the registry, the same proof fails.
func TestProofFromThePull(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)

	distroless := func(s string) string {
		return strings.Replace(s, `image     = "ghcr.io/ghcrsync/private-probe:v1"`, `image     = "ghcr.io/`+registry.DistrolessImage+`"`, 1)
	}

	r := newRotation(t, sb, distroless, "prod-worker-1")

	res, err := r.apply(r.plan(), apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, "prod-worker-1"); x.Outcome != state.OutcomeDone {
		t.Fatalf("distroless probe: %+v", x)
	}

	r2 := newRotation(t, sb, distroless, "prod-worker-1")
	t.Cleanup(func() { sb.Registry().AddCredential(r2.cred.Username, r2.cred.Password) }) // the node keeps it: later tests rotate from it

	res, err = r2.apply(r2.plan(), apply.Hooks{BeforeMutation: func(_ string, phase state.Phase) {
		if phase == state.PhaseProved {
			if _, err := sb.Do(ctx, "revoke-credential", sandbox.Request{User: r2.cred.Username}); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if x := r2.result(res, "prod-worker-1"); x.Outcome != state.OutcomeFailed || !strings.Contains(x.Message, "cannot pull") {
		t.Fatalf("revoked credential: %+v", x)
	}

	if rel := releaseHolder(t, r2.cfg, res.Holder); rel.Held() != 0 {
		t.Fatalf("release: %+v", rel.Outcomes)
	}

	liftUnproven(t, sb, r2.cfg, "prod-worker-1") // rebooted with a credential that cannot pull: never proved
}

// An operator's staged config is never dropped: a node with a staged change beyond the
// credential is refused before anything is done to it, and its staged config is left intact.
// Negative control: a staged config that already carries the desired credential is built on, and
// the operator's change survives the rotation.
func TestStagedConfigIsNeverDropped(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	const name = "prod-worker-3"

	tc := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	m, _ := sb.Fleet().Machine(name)
	nctx := client.WithNode(ctx, m.IP)

	stage := func(cred *sandbox.Credential) {
		mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, tc.COSI, talosconfig.ActiveID)
		if err != nil {
			t.Fatal(err)
		}

		patch, err := configpatcher.LoadPatch([]byte("machine:\n  nodeLabels:\n    example.com/operator-change: \"yes\"\n"))
		if err != nil {
			t.Fatal(err)
		}

		out, err := configpatcher.Apply(configpatcher.WithConfig(mc.Provider()), []configpatcher.Patch{patch})
		if err != nil {
			t.Fatal(err)
		}

		data, err := out.Bytes()
		if err != nil {
			t.Fatal(err)
		}

		text := string(data)

		if cred != nil {
			provider, _ := loadConfig(t, text)
			b, err := registryauth.With(provider, sandbox.RegistryHost, cred.Username, cred.Password)
			if err != nil {
				t.Fatal(err)
			}

			text = string(b)
		}

		if _, err := tc.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: []byte(text), Mode: machine.ApplyConfigurationRequest_STAGED}); err != nil {
			t.Fatal(err)
		}
	}

	r := newRotation(t, sb, nil, name)
	path := r.plan()
	stage(nil) // the operator stages a change after the plan

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	x := r.result(res, name)
	if x.Outcome != state.OutcomeFailed || x.Reason != plan.ReasonStagedConfig || !strings.Contains(x.Message, "never drops an operator's staged change") {
		t.Fatalf("staged operator change: %+v", x)
	}

	assertReleased(t, sb, name, false)

	if persisted(t, nctx, tc).Config().Machine().NodeLabels()["example.com/operator-change"] != "yes" {
		t.Fatal("the operator's staged change was dropped")
	}

	// The operator stages their change together with the new credential: the rotation goes on,
	// and the change is still there.
	r2 := newRotation(t, sb, nil, name)
	stage(&r2.cred)
	r2.mayDeselect = map[string]bool{}

	res, err = r2.apply(r2.plan(), apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := r2.result(res, name); x.Outcome != state.OutcomeDone {
		t.Fatalf("staged change carrying the credential: %+v", x)
	}

	if m.Configured() != r2.cred || persisted(t, nctx, tc).Config().Machine().NodeLabels()["example.com/operator-change"] != "yes" {
		t.Fatal("the rotation dropped the operator's change")
	}
}

func persisted(t *testing.T, nctx context.Context, tc *client.Client) *talosconfig.MachineConfig {
	t.Helper()

	mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, tc.COSI, talosconfig.PersistentID)
	if err != nil {
		t.Fatal(err)
	}

	return mc
}
