package apply_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
)

// The node template the sandbox autoscaler boots machines from is rotated with the fleet. An
// operator changes an unrelated part of it between ghcrsync's read and its write: the
// compare-and-swap retry keeps their change and ours. A machine the autoscaler then creates
// joins with the new credential, its kubelet pulls a private image with it, and the next plan
// has nothing to do for the machine or the template. The autoscaler's deployment
// (restart_deployment) is rolled after the template changed.
func TestNodeTemplateRotatesWithTheFleet(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	starts := sb.AutoscalerStarts()
	r := newRotation(t, sb, nil, "prod-worker-1")
	path := r.plan()

	if tp := r.planned.Templates; len(tp) != 1 || tp[0].Action != plan.TemplateUpdate || tp[0].Pool != sandbox.TemplatePool {
		t.Fatalf("the plan's templates: %+v", tp)
	}

	res, err := applyCfg(ctx, applyOptions{
		ConfigPath: r.cfg, PlanPath: path,
		SecretHooks: secretwrite.Hooks{BetweenTemplateReadAndWrite: func(_ config.NodeTemplate, attempt int) {
			if attempt == 0 {
				editTemplate(t, kube, func(cc map[string]any) { cc["imagesForArch"].(map[string]any)["arm64"] = "operator-added" })
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}

	tr := templateResult(t, res.Secrets)
	if tr.Outcome != secretwrite.Written || !strings.Contains(tr.Message, "after 1 concurrent write") {
		t.Fatalf("template: %+v", tr)
	}

	if root := res.Secrets[len(res.Secrets)-1]; root.Role != plan.RoleRoot || root.Outcome != secretwrite.Written {
		t.Fatalf("the root Flux secret after the template: %+v", root)
	}

	if d, err := kube.AppsV1().Deployments("kube-system").Get(ctx, "cluster-autoscaler", metav1.GetOptions{}); err != nil ||
		d.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] == "" || !strings.Contains(tr.Message, "restarted") {
		t.Fatalf("the autoscaler was not restarted after the template changed (%v): %s", err, tr.Message)
	}

	if got := templateJSON(t, kube)["imagesForArch"].(map[string]any)["arm64"]; got != "operator-added" {
		t.Fatalf("the operator's concurrent change was lost: arm64 = %v", got)
	}

	// The autoscaler (which reads the template once, at its start) was restarted by the rollout.
	sandboxtest.Eventually(t, 30*time.Second, "the autoscaler restarted by the rollout", func() error {
		if sb.AutoscalerStarts() == starts {
			return fmt.Errorf("still started %d time(s)", starts)
		}

		return nil
	})

	out, err := sb.Do(ctx, "scale-up", sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}

	name := out.(map[string]string)["added"]
	t.Cleanup(func() { _, _ = sb.Do(context.Background(), "delete-node", sandbox.Request{Node: name}) })

	m, _ := sb.Fleet().Machine(name)
	if eff := m.Effective(); eff.Username != r.cred.Username || eff.Password != r.cred.Password {
		t.Fatalf("the machine scaled up after apply joined with %q, not the new credential %q", eff.Username, r.cred.Username)
	}

	pullsPrivateImage(t, sb, name)

	sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": r.group}}})

	again, err := planCfg(ctx, r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if np, ok := again.Plan.Node(name); !ok || np.Action != plan.ActionNoOp {
		t.Fatalf("the next plan for the new machine: %+v", np)
	}

	if tp := again.Plan.Templates; len(tp) != 1 || tp[0].Action != plan.TemplateNoOp {
		t.Fatalf("the next plan's templates: %+v", tp)
	}
}

// Negative control: a concurrent writer that breaks the template between ghcrsync's read and its
// write is not overwritten — the retry re-reads, refuses, writes nothing, and holds the root Flux
// secret back.
func TestNodeTemplateConcurrentBreakageIsNotOverwritten(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	before, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		s, _ := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(context.Background(), sandbox.TemplateSecret, metav1.GetOptions{})
		s.Data = before.Data
		_, _ = kube.CoreV1().Secrets(sandbox.TemplateNamespace).Update(context.Background(), s, metav1.UpdateOptions{})
	})

	r := newRotation(t, sb, nil, "prod-worker-1")
	path := r.plan()

	res, err := applyCfg(ctx, applyOptions{
		ConfigPath: r.cfg, PlanPath: path,
		SecretHooks: secretwrite.Hooks{BetweenTemplateReadAndWrite: func(_ config.NodeTemplate, attempt int) {
			if attempt != 0 {
				return
			}

			s, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
			if err != nil {
				t.Error(err)

				return
			}

			s.Data[sandbox.TemplateKey] = []byte("!! not base64 !!")
			if _, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}

	if tr := templateResult(t, res.Secrets); tr.Outcome != secretwrite.Failed || !strings.Contains(tr.Message, "not base64") || !strings.Contains(tr.Message, "not written") {
		t.Fatalf("template: %+v", tr)
	}

	if root := res.Secrets[len(res.Secrets)-1]; root.Outcome != secretwrite.HeldBack {
		t.Fatalf("the root Flux secret after a failed template: %+v", root)
	}

	s, _ := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if string(s.Data[sandbox.TemplateKey]) != "!! not base64 !!" {
		t.Fatal("ghcrsync wrote over the concurrent writer's template")
	}

	recorded := false

	for _, rec := range r.readState().Secrets {
		if rec.Role == plan.RoleTemplate && rec.Name == sandbox.TemplateSecret+"["+sandbox.TemplateKey+"]" && rec.Outcome == string(secretwrite.Failed) {
			recorded = true
		}
	}

	if !recorded {
		t.Fatalf("the state does not record the failed template write: %+v", r.readState().Secrets)
	}

	// Someone repairs the template, with the new credential in it: the next run finds it in sync
	// — but written after its reader (the autoscaler) last started, so it restarts the reader
	// without writing — and settles the failed record (the state no longer says it failed).
	fixed, err := nodetemplate.Rewrite(nodetemplate.FormatHcloud, before.Data[sandbox.TemplateKey], nil, registry.RegistryHost, r.cred.Username, r.cred.Password)
	if err != nil {
		t.Fatal(err)
	}

	s.Data[sandbox.TemplateKey] = fixed
	if _, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	again, err := planCfg(ctx, r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if tp := again.Plan.Templates; len(tp) != 1 || tp[0].Action != plan.TemplateRestart || !strings.Contains(tp[0].Reason, "before it was written") {
		t.Fatalf("the repaired template's plan: %+v", tp)
	}

	starts := sb.AutoscalerStarts()

	path = filepath.Join(r.dir, "again.plan")
	if err := plan.Save(path, again.Plan, again.Key); err != nil {
		t.Fatal(err)
	}

	res, err = r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if tr := templateResult(t, res.Secrets); tr.Outcome != secretwrite.Unchanged || !strings.Contains(tr.Message, "restarted to read it") {
		t.Fatalf("the repaired template: %+v", tr)
	}

	sandboxtest.Eventually(t, 30*time.Second, "the autoscaler restarted", func() error {
		if sb.AutoscalerStarts() == starts {
			return fmt.Errorf("still started %d time(s)", starts)
		}

		return nil
	})

	for _, rec := range r.readState().Secrets {
		if rec.Role == plan.RoleTemplate && rec.Outcome != string(secretwrite.Unchanged) {
			t.Fatalf("the repaired template's record: %+v", rec)
		}
	}

	if again, err := planCfg(ctx, r.cfg); err != nil || again.Plan.Templates[0].Action != plan.TemplateNoOp {
		t.Fatalf("after the reader's restart (%v): %+v", err, again.Plan.Templates)
	}
}

func templateResult(t *testing.T, results []secretwrite.Result) secretwrite.Result {
	t.Helper()

	for _, s := range results {
		if s.Role == plan.RoleTemplate {
			return s
		}
	}

	t.Fatalf("no node template among the results: %+v", results)

	return secretwrite.Result{}
}

// templateJSON decodes the sandbox's HCLOUD_CLUSTER_CONFIG.
func templateJSON(t *testing.T, kube kubernetes.Interface) map[string]any {
	t.Helper()

	s, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(context.Background(), sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(s.Data[sandbox.TemplateKey])))
	if err != nil {
		t.Fatal(err)
	}

	var cc map[string]any
	if err := json.Unmarshal(raw, &cc); err != nil {
		t.Fatal(err)
	}

	return cc
}

// editTemplate changes the template as another writer would (a plain update).
func editTemplate(t *testing.T, kube kubernetes.Interface, edit func(map[string]any)) {
	t.Helper()

	cc := templateJSON(t, kube)
	edit(cc)

	js, _ := json.Marshal(cc)
	ctx := context.Background()

	s, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Error(err)

		return
	}

	s.Data[sandbox.TemplateKey] = []byte(base64.StdEncoding.EncodeToString(js))
	if _, err := kube.CoreV1().Secrets(sandbox.TemplateNamespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Error(err)
	}
}

// pullsPrivateImage runs a pod with a private image and no pull secret on the node: it starts
// only if the node's own (Talos) credential pulls it.
func pullsPrivateImage(t *testing.T, sb *sandbox.Sandbox, node string) {
	t.Helper()

	ctx := context.Background()
	kube := sb.Kube()
	name := "pull-" + node[len(node)-8:]

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: node, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{Name: "c", Image: registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1"}},
		},
	}
	if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}) })

	sandboxtest.Eventually(t, 30*time.Second, "the private image is pulled", func() error {
		p, err := kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("pod %s: %v (%v)", name, p.Status.ContainerStatuses, err)
		}

		if src := sb.Fleet().PullSource("default", name); src != "node" {
			return fmt.Errorf("pulled with %q, not the node's credential", src)
		}

		return nil
	})
}

// The root waits for a node template's reader that is still rolling out when the cluster is read
// again before it: the last drain evicts the autoscaler's pod, or (here) a restart lands just
// before the root, so for a moment its pods may be ones that read the template before. The run
// waits for the rollout (it says so in its log: the race happened) and then writes the root.
// The negative control: a template put back to the old credential at the same moment is a
// genuine use of the old credential — no wait, the root is held back and the verdict names it.
func TestRootWaitsForItsTemplateReadersRollout(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const waits = "the root waits for node template readers to roll out"

	for _, tc := range []struct {
		name   string
		before func(t *testing.T, old map[string]any)
	}{
		{name: "a restart under way", before: func(t *testing.T, _ map[string]any) {
			// minReadySeconds keeps the rollout under way for 5 s whatever the kubelet's speed (the
			// real controller-manager counts a pod available only after it): the run's read lands in it.
			deployments := kube.AppsV1().Deployments("kube-system")
			patch := fmt.Sprintf(`{"spec":{"minReadySeconds":5,"template":{"metadata":{"annotations":{"ghcrsync.dev/test-restart":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
			if _, err := deployments.Patch(ctx, "cluster-autoscaler", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Error(err)
			}

			t.Cleanup(func() {
				_, _ = deployments.Patch(context.Background(), "cluster-autoscaler", types.StrategicMergePatchType, []byte(`{"spec":{"minReadySeconds":0}}`), metav1.PatchOptions{})
			})
		}},
		{name: "negative control: the template put back", before: func(t *testing.T, old map[string]any) {
			editTemplate(t, kube, func(cc map[string]any) {
				for k := range cc {
					delete(cc, k)
				}

				maps.Copy(cc, old)
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := templateJSON(t, kube)
			r := newRotation(t, sb, nil, "prod-worker-1")

			res, err := r.apply(r.plan(), apply.Hooks{BeforeRoot: func() { tc.before(t, old) }})
			if err != nil {
				t.Fatal(err)
			}

			root, waited := rootOutcome(res), strings.Contains(r.log.String(), waits)

			if tc.name == "a restart under way" {
				if !waited || root.Outcome != secretwrite.Written || !res.SafeToRevoke() {
					t.Fatalf("the root after a reader's restart (waited: %t): %+v, verdict %s", waited, root, res.Verdict.Sentence())
				}

				return
			}

			where := plan.TemplateRef(sandbox.TemplateNamespace, sandbox.TemplateSecret, sandbox.TemplateKey)
			if waited || root.Outcome != secretwrite.HeldBack || res.SafeToRevoke() || !strings.Contains(res.Verdict.Sentence(), where) {
				t.Fatalf("a template put back to the old credential (waited: %t): root %+v, verdict %s", waited, root, res.Verdict.Sentence())
			}
		})
	}
}
