package apply_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	talosconfigprovider "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/planning"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
	"github.com/ghcrsync/ghcrsync/state/kubestate"
)

// rotation is one test's rotation: its own config (selector over its nodes), credential,
// state file and plan.
type rotation struct {
	t       *testing.T
	sb      *sandbox.Sandbox
	dir     string
	cfg     string
	state   string
	cred    sandbox.Credential
	group   string
	log     *sandboxtest.SyncBuffer
	planned *plan.Plan
	// storeClient, if set, is the client the run's Kubernetes state backend writes with.
	storeClient kubernetes.Interface
	// mayDeselect lets the plan leave these nodes alone (a test that wants a deselection).
	mayDeselect map[string]bool
	// faults stand between the run and the cluster (nil: none).
	faults *workspace.Faults
}

var groupSeq int

// newRotation labels nodes into a group of their own, adds a fresh credential to the registry,
// encrypts it into a SOPS file, and writes a config selecting only that group.
func newRotation(t *testing.T, sb *sandbox.Sandbox, edit func(string) string, nodes ...string) *rotation {
	t.Helper()

	groupSeq++
	group := fmt.Sprintf("g%d", groupSeq)
	kube := sb.Kube()

	for _, n := range nodes {
		sandboxtest.PatchNode(t, kube, n, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": group}}})
	}

	t.Cleanup(func() {
		for _, n := range nodes {
			b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": nil}}})
			_, _ = kube.CoreV1().Nodes().Patch(context.Background(), n, types.MergePatchType, b, metav1.PatchOptions{})
		}
	})

	dir := t.TempDir()
	cred := sandbox.Credential{Username: "rot-" + group, Password: fmt.Sprintf("ghp_%s_%d", group, time.Now().UnixNano())}
	sb.Registry().AddCredential(cred.Username, cred.Password)

	enc, err := sb.EncryptSecret(sandbox.DockerConfigJSON(cred))
	if err != nil {
		t.Fatal(err)
	}

	secret := filepath.Join(dir, "secret.enc.yaml")
	if err := os.WriteFile(secret, enc, 0o600); err != nil {
		t.Fatal(err)
	}

	text, _ := os.ReadFile(sb.Path(sandbox.ConfigFile))
	s := string(text)

	for _, f := range []string{"kubeconfig", "talosconfig"} {
		s = strings.Replace(s, `"`+f+`"`, `"`+sb.Path(f)+`"`, 1)
	}

	s = strings.Replace(s, `"secret.enc.yaml"`, `"`+secret+`"`, 1)
	s = strings.Replace(s, `"ghcrsync.state.json"`, `"`+filepath.Join(dir, "state.json")+`"`, 1)
	// The group is what the test rotates and judges: the shared sandbox's other groups are not.
	s = strings.Replace(s, "nodes {", "nodes {\n  selector = \"ghcrsync.dev/test-group="+group+"\"\n  verdict  = \"selected\"", 1)
	s = strings.Replace(s, `ready_timeout         = "2m"`, `ready_timeout         = "60s"`, 1)

	if edit != nil {
		s = edit(s)
	}

	cfg := filepath.Join(dir, "ghcrsync.hcl")
	if err := os.WriteFile(cfg, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Setenv("SOPS_AGE_KEY_FILE", sb.Path(sandbox.AgeKeyFile))

	// The shared sandbox is clean for the next test: an unproven hold this test's run left on
	// its nodes (a Talos write never proved: release keeps the cordon) is lifted as `release
	// --node NAME --uncordon-unproven` does. Runs before the group label goes.
	t.Cleanup(func() {
		for _, n := range nodes {
			got, err := kube.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
			if err != nil || got.Annotations[object.UnprovenAnnotation] == "" {
				continue
			}

			if _, err := recoverWith(context.Background(), cfg, fence.RecoveryOptions{Node: n, InventoryOptions: fence.InventoryOptions{UncordonUnproven: true}}); err != nil {
				t.Logf("lifting the unproven hold on %s: %v", n, err)
			}
		}
	})

	return &rotation{t: t, sb: sb, dir: dir, cfg: cfg, state: filepath.Join(dir, "state.json"), cred: cred, group: group, log: &sandboxtest.SyncBuffer{}}
}

// plan plans and saves the plan.
func (r *rotation) plan() string {
	r.t.Helper()

	res, err := planCfg(context.Background(), r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}

	r.planned = res.Plan

	// Every node of the rotation must be acted on: a silently deselected node would make the
	// test prove nothing (the pull secrets alone always have work to do).
	for _, n := range res.Plan.Nodes {
		if n.Action != plan.ActionFence && n.Action != plan.ActionApplyLive && !r.mayDeselect[n.Name] {
			var b bytes.Buffer
			for _, x := range res.Plan.Nodes {
				fmt.Fprintf(&b, "%s: %s %s\n", x.Name, x.Action, x.Sentence)
			}

			r.t.Fatalf("the rotation's plan does not act on %s:\n%s", n.Name, b.String())
		}
	}

	path := filepath.Join(r.dir, "plan.out")

	if err := plan.Save(path, res.Plan, res.Key); err != nil {
		r.t.Fatal(err)
	}

	return path
}

// apply applies the saved plan with hooks.
func (r *rotation) apply(path string, hooks apply.Hooks) (*apply.Result, error) {
	r.t.Helper()

	log := hclog.New(&hclog.LoggerOptions{Name: "ghcrsync", Level: hclog.Debug, Output: r.log})

	res, err := applyCfg(context.Background(), applyOptions{
		ConfigPath: r.cfg, PlanPath: path, Logger: log, Progress: r.log, Hooks: hooks, StoreClient: r.storeClient, Faults: r.faults,
	})
	if r.t.Failed() || err != nil {
		r.t.Logf("apply log:\n%s", r.log.String())
	}

	return res, err
}

func (r *rotation) result(res *apply.Result, node string) apply.NodeResult {
	r.t.Helper()

	for _, x := range res.Nodes {
		if x.Node == node {
			return x
		}
	}

	r.t.Fatalf("no result for %s in %+v", node, res.Nodes)

	return apply.NodeResult{}
}

func (r *rotation) readState() *state.State {
	r.t.Helper()

	st, err := state.ReadLocal(r.state)
	if err != nil {
		r.t.Fatal(err)
	}

	return st
}

func node(t *testing.T, sb *sandbox.Sandbox, name string) *corev1.Node {
	t.Helper()

	n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return n
}

// assertReleased checks that no ghcrsync fence is left on the node.
func assertReleased(t *testing.T, sb *sandbox.Sandbox, name string, wantCordoned bool) {
	t.Helper()

	n := node(t, sb, name)
	for _, a := range []string{object.OwnerAnnotation, object.PhaseAnnotation, object.RecordAnnotation, "ghcrsync.dev/scale-down-disabled-by"} {
		if v, ok := n.Annotations[a]; ok {
			t.Errorf("%s still has %s=%q", name, a, v)
		}
	}

	if n.Annotations["cluster-autoscaler.kubernetes.io/scale-down-disabled"] != "" {
		t.Errorf("%s still has ghcrsync's scale-down guard", name)
	}

	if n.Spec.Unschedulable != wantCordoned {
		t.Errorf("%s unschedulable=%t, want %t", name, n.Spec.Unschedulable, wantCordoned)
	}
}

// liftUnproven checks that release left name on ghcrsync's unproven hold (cordoned, marked: its
// Talos config was written and never proved), then lifts it as `release --node NAME
// --uncordon-unproven` does, so the shared sandbox is clean for the next test.
func liftUnproven(t *testing.T, sb *sandbox.Sandbox, cfg, name string) {
	t.Helper()

	if n := node(t, sb, name); !n.Spec.Unschedulable || n.Annotations[object.UnprovenAnnotation] == "" {
		t.Fatalf("%s is not on an unproven hold after release: unschedulable=%t %v", name, n.Spec.Unschedulable, n.Annotations)
	}

	res, err := recoverWith(context.Background(), cfg, fence.RecoveryOptions{Node: name, InventoryOptions: fence.InventoryOptions{UncordonUnproven: true}})
	if err != nil || res.Held() != 0 {
		t.Fatalf("release --uncordon-unproven of %s: %v %+v", name, err, res)
	}

	if n := node(t, sb, name); n.Spec.Unschedulable || n.Annotations[object.UnprovenAnnotation] != "" {
		t.Fatalf("%s is still held after --uncordon-unproven: unschedulable=%t %v", name, n.Spec.Unschedulable, n.Annotations)
	}
}

var _ = sandboxtest.Get

// planned is what `ghcrsync plan` computes.
type planned struct {
	Plan *plan.Plan
	Key  []byte // seals the saved plan
}

// planCfg plans with the configuration, as `ghcrsync plan` does.
func planCfg(ctx context.Context, cfg string) (*planned, error) {
	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg})
	if err != nil {
		return nil, err
	}
	defer ws.Close()

	p, err := ws.Planner().Plan(ctx, planning.Options{})
	if err != nil {
		return nil, err
	}

	cred, err := ws.Credential()
	if err != nil {
		return nil, err
	}

	key, err := cred.PlanKey()
	if err != nil {
		return nil, err
	}

	return &planned{Plan: p, Key: key}, nil
}

// applyOptions are an apply's inputs, as `ghcrsync apply` gathers them.
type applyOptions struct {
	ConfigPath, PlanPath string
	Logger               hclog.Logger
	Progress             io.Writer
	Hooks                apply.Hooks
	SecretHooks          secretwrite.Hooks
	Clock                clock.Clock
	StoreClient          kubernetes.Interface
	Faults               *workspace.Faults
}

// applyCfg applies a saved plan, as `ghcrsync apply PLANFILE` does.
func applyCfg(ctx context.Context, o applyOptions) (*apply.Result, error) {
	ws, err := workspace.Open(workspace.Options{ConfigPath: o.ConfigPath, Lock: true, Clock: o.Clock, Faults: o.Faults})
	if err != nil {
		return nil, err
	}
	defer ws.Close()

	if o.StoreClient != nil {
		ws.Store = &kubestate.Store{Client: o.StoreClient, Namespace: ws.Config.State.Namespace, Name: ws.Config.State.Secret}
		if ws.State, err = ws.Store.Read(); err != nil {
			return nil, err
		}
	}

	p, err := plan.Load(o.PlanPath)
	if err != nil {
		return nil, err
	}

	in, err := ws.Apply()
	if err != nil {
		return nil, err
	}

	return apply.Run(ctx, in, p, apply.Options{PlanPath: o.PlanPath, Logger: o.Logger, Progress: view.Progress(o.Progress), Hooks: o.Hooks, SecretHooks: o.SecretHooks})
}

// fencesCfg is `ghcrsync fences [--holder]`.
func fencesCfg(ctx context.Context, cfg, holder string) (fence.Report, error) {
	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg})
	if err != nil {
		return fence.Report{}, err
	}
	defer ws.Close()

	return fence.Inventory(ctx, ws.Fences(), fence.InventoryOptions{Holder: holder})
}

// recoverCfg is `ghcrsync release`.
func recoverCfg(ctx context.Context, cfg string) (*fence.RecoveryResult, error) {
	return recoverWith(ctx, cfg, fence.RecoveryOptions{})
}

func recoverWith(ctx context.Context, cfg string, o fence.RecoveryOptions) (*fence.RecoveryResult, error) {
	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg, Lock: !o.DryRun})
	if err != nil {
		return nil, err
	}
	defer ws.Close()

	return fence.Recover(ctx, ws.Fences(), o)
}

// releaseHolder is `ghcrsync release --holder HOLDER`.
func releaseHolder(t *testing.T, cfg, holder string) *fence.RecoveryResult {
	t.Helper()

	res, err := recoverWith(context.Background(), cfg, fence.RecoveryOptions{InventoryOptions: fence.InventoryOptions{Holder: holder}})
	if err != nil {
		t.Fatal(err)
	}

	return res
}

// writeJSON writes v to path as JSON and returns path.
func writeJSON(t *testing.T, path string, v any) string {
	t.Helper()

	if err := os.WriteFile(path, mustJSON(t, v), 0o600); err != nil {
		t.Fatal(err)
	}

	return path
}

// loadConfig loads a Talos machine config.
func loadConfig(t *testing.T, text string) (talosconfigprovider.Provider, error) {
	t.Helper()

	return configloader.NewFromBytes([]byte(text))
}

// pullState is `ghcrsync state pull`.
func pullState(cfg string) (*state.State, error) {
	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg})
	if err != nil {
		return nil, err
	}
	defer ws.Close()

	return ws.State, nil
}

// pushState is `ghcrsync state push FILE`.
func pushState(cfg, file string) (*state.State, error) {
	src, err := state.ReadLocal(file)
	if err != nil {
		return nil, err
	}

	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg, Lock: true})
	if err != nil {
		return nil, err
	}
	defer ws.Close()

	return src, state.Push(ws.Store, ws.State, src, false)
}

// removeState is `ghcrsync state rm NODE`.
func removeState(cfg, node string) error {
	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg, Lock: true})
	if err != nil {
		return err
	}
	defer ws.Close()

	return state.Remove(ws.Store, ws.State, node)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()

	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}

	return b
}

func applyHooks() apply.Hooks { return apply.Hooks{} }
