package apply_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Exit 0 promises that revoking the old credential breaks nothing. These tests produce, on the
// sandbox, each way a run used to end green with the old credential still in use, and check the
// verdict — read from the cluster at the end — says so and keeps the root Flux secret back.

// rootOutcome is what became of the root Flux secret in a run.
func rootOutcome(res *apply.Result) secretwrite.Result {
	for _, s := range res.Secrets {
		if s.Role == plan.RoleRoot {
			return s
		}
	}

	return secretwrite.Result{}
}

// restartAutoscaler rolls the autoscaler's Deployment and waits until it read the template again.
func restartAutoscaler(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := sb.RestartAutoscaler(ctx); err != nil {
		t.Fatal(err)
	}
}

// joinOnTheOldCredential adds an autoscaled machine booted from a node template that holds the
// old credential (a GitOps revert of the template between ghcrsync's write and the scale-up),
// puts it in the rotation's group, and restores the template ghcrsync wrote.
func joinOnTheOldCredential(t *testing.T, sb *sandbox.Sandbox, r *rotation, old []byte) string {
	t.Helper()

	ctx := context.Background()
	secrets := sb.Kube().CoreV1().Secrets(sandbox.TemplateNamespace)

	tpl, err := secrets.Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	ours := tpl.Data[sandbox.TemplateKey]
	setTemplate(t, sb, old)
	restartAutoscaler(t, sb) // it reads the template when it starts

	up, err := sb.Do(ctx, "scale-up", sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}

	setTemplate(t, sb, ours)
	restartAutoscaler(t, sb)

	late := up.(map[string]string)["added"]
	sandboxtest.PatchNode(t, sb.Kube(), late, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": r.group}}})
	t.Cleanup(func() { _, _ = sb.Do(context.Background(), "delete-node", sandbox.Request{Node: late}) })

	return late
}

func templateData(t *testing.T, sb *sandbox.Sandbox) []byte {
	t.Helper()

	tpl, err := sb.Kube().CoreV1().Secrets(sandbox.TemplateNamespace).Get(context.Background(), sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return tpl.Data[sandbox.TemplateKey]
}

func setTemplate(t *testing.T, sb *sandbox.Sandbox, data []byte) {
	t.Helper()

	secrets := sb.Kube().CoreV1().Secrets(sandbox.TemplateNamespace)

	tpl, err := secrets.Get(context.Background(), sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	tpl.Data[sandbox.TemplateKey] = data
	if _, err := secrets.Update(context.Background(), tpl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A machine that joins while a node reboots, with the old credential, is found by the re-listing
// and rotated in the same run: the verdict is clean and the root written. The negative control:
// a late machine the run cannot rotate (its Talos API hangs) leaves the verdict unclean and the
// root on the old credential.
func TestLateNodeIsRotatedInTheSameRun(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()

	for _, tc := range []struct {
		name      string
		rotatable bool
	}{{"rotated", true}, {"cannot_be_rotated", false}} {
		t.Run(tc.name, func(t *testing.T) {
			old := templateData(t, sb) // the credential of the run before this one
			// A short Talos timeout: the hung machine is read again by every listing.
			r := newRotation(t, sb, func(s string) string { return strings.Replace(s, "talos {", "talos {\n  timeout = \"3s\"", 1) }, "prod-worker-1")
			path := r.plan()

			var (
				once sync.Once
				late string
			)

			res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
				if node == "prod-worker-1" && phase == state.PhaseRebooting {
					once.Do(func() {
						late = joinOnTheOldCredential(t, sb, r, old)

						if !tc.rotatable {
							if _, err := sb.Do(ctx, "hang-talos", sandbox.Request{Node: late}); err != nil {
								t.Error(err)
							}

							t.Cleanup(func() { _, _ = sb.Do(context.Background(), "unhang-talos", sandbox.Request{Node: late}) })
						}
					})
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			if late == "" {
				t.Fatal("the hook never added the late machine")
			}

			if !tc.rotatable {
				if res.SafeToRevoke() || !strings.Contains(res.Verdict.Sentence(), late) || rootOutcome(res).Outcome != secretwrite.HeldBack {
					t.Fatalf("a late node left on the old credential: root %+v, verdict %+v", rootOutcome(res), res.Verdict)
				}

				return
			}

			x := r.result(res, late)
			if x.Outcome != state.OutcomeDone || !x.Late {
				t.Fatalf("the late node: %+v", x)
			}

			if !res.SafeToRevoke() || rootOutcome(res).Outcome != secretwrite.Written {
				t.Fatalf("after rotating the late node: root %+v, verdict %+v", rootOutcome(res), res.Verdict)
			}
		})
	}
}

// A scale-down candidate left alone (autoscaler_candidates = "deselect") stays on the old
// credential: the verdict names it and the root is held back. The negative control: with the
// default ("include") it is rotated, guarded by the scale-down-disabled annotation.
func TestDeselectedCandidateIsReported(t *testing.T) {
	sb := sandboxtest.Get(t)
	const candidate = "prod-worker-2"

	taint := corev1.Taint{Key: sandbox.DeletionCandidateTaint, Value: fmt.Sprint(time.Now().Unix()), Effect: corev1.TaintEffectPreferNoSchedule}
	updateNode(t, sb, candidate, func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taint) })
	t.Cleanup(func() {
		updateNode(t, sb, candidate, func(n *corev1.Node) {
			out := n.Spec.Taints[:0]
			for _, x := range n.Spec.Taints {
				if x.Key != taint.Key {
					out = append(out, x)
				}
			}

			n.Spec.Taints = out
		})
	})

	for _, policy := range []string{"deselect", "include"} {
		t.Run(policy, func(t *testing.T) {
			r := newRotation(t, sb, func(s string) string {
				return strings.Replace(s, `autoscaler_candidates = "include"`, `autoscaler_candidates = "`+policy+`"`, 1)
			}, "prod-worker-1", candidate)
			r.mayDeselect = map[string]bool{candidate: policy == "deselect"}

			res, err := r.apply(r.plan(), apply.Hooks{})
			if err != nil {
				t.Fatal(err)
			}

			if policy == "include" {
				if x := r.result(res, candidate); x.Outcome != state.OutcomeDone || !res.SafeToRevoke() {
					t.Fatalf("the candidate under include: %+v; verdict %+v", x, res.Verdict)
				}

				return
			}

			if res.SafeToRevoke() || !strings.Contains(res.Verdict.Sentence(), candidate) || rootOutcome(res).Outcome != secretwrite.HeldBack ||
				!strings.Contains(rootOutcome(res).Message, candidate) {
				t.Fatalf("a deselected candidate on the old credential: root %+v, verdict %+v", rootOutcome(res), res.Verdict)
			}
		})
	}
}

// injectPullSecret installs a MutatingAdmissionPolicy (the API server's own plugin) that gives
// every runtime probe pod the pull secret name — as the ServiceAccount plugin does from a
// namespace's default account, or a policy engine may — and waits until it is in force. It
// returns its removal (which waits until it is gone). Safe to call from a hook: it reports
// instead of failing the test.
func injectPullSecret(kube kubernetes.Interface, name string) (func() error, error) {
	ctx := context.Background()
	policy := &admissionregistrationv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "inject-pull-secret"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "probe-pods",
				Expression: `has(object.metadata.labels) && "ghcrsync.dev/probe-node" in object.metadata.labels`}},
			Mutations: []admissionregistrationv1.Mutation{{
				PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{
					Expression: `[JSONPatch{op: "add", path: "/spec/imagePullSecrets", value: [{"name": "` + name + `"}]}]`,
				},
			}},
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}

	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: policy.Name},
	}

	api := kube.AdmissionregistrationV1()
	if _, err := api.MutatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		return nil, err
	}

	if _, err := api.MutatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, err
	}

	remove := func() error {
		_ = api.MutatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = api.MutatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})

		return untilMutated(kube, false) // gone from the API server's admission chain too
	}

	return remove, untilMutated(kube, true)
}

// untilMutated waits (30 s at most) until a probe-like pod's dry run is, or is not, given a pull
// secret by admission.
func untilMutated(kube kubernetes.Interface, want bool) error {
	var last error

	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		pod, err := kube.CoreV1().Pods(sandbox.ProbeNamespace).Create(context.Background(), probeLike(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err

			continue
		}

		if (len(pod.Spec.ImagePullSecrets) > 0) == want {
			return nil
		}

		last = fmt.Errorf("the pod's pull secrets are %v", pod.Spec.ImagePullSecrets)
	}

	return fmt.Errorf("the mutating policy's effect (%t) did not show within 30s: %w", want, last)
}

// probeLike is the probe pod's shape (the probe namespace enforces PodSecurity "restricted").
func probeLike() *corev1.Pod {
	pod := probe.Pod("x", plan.Probe{Image: "pause", Namespace: sandbox.ProbeNamespace, ServiceAccount: sandbox.ProbeServiceAccount}, "x")
	pod.GenerateName = "probe-like-"

	return pod
}

// A probe pod that admission gives a pull secret is no proof of the node's own credential: with
// the node's own new credential revoked while it reboots, the pull would succeed through the
// injected secret — the run refuses the proof instead, and the fence stays. Before any node is
// touched, plan refuses the same mutation (its server-side dry run sees it). The negative
// control: the same run without the mutation, in a probe namespace enforcing PodSecurity
// "restricted", proves the node.
func TestProofThroughAnInjectedPullSecretIsRefused(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	const name = "prod-worker-3"

	// The pull secret the mutation names, holding a credential that pulls.
	c := sb.NewCredential()
	_, err := kube.CoreV1().Secrets(sandbox.ProbeNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "injected"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: sandbox.DockerConfigJSON(c)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = kube.CoreV1().Secrets(sandbox.ProbeNamespace).Delete(ctx, "injected", metav1.DeleteOptions{})
	})

	// Installed after the plan and apply's own dry run: only the pod's read-back can see it.
	r := newRotation(t, sb, nil, name)
	path := r.plan()
	t.Cleanup(func() { sb.Registry().AddCredential(r.cred.Username, r.cred.Password) }) // the node keeps it: later tests rotate from it

	var remove func() error

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node == name && phase == state.PhaseRebooting {
			sb.Registry().RevokeCredential(r.cred.Username) // the node's own new credential no longer pulls

			var err error
			if remove, err = injectPullSecret(kube, "injected"); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	sb.Registry().AddCredential(r.cred.Username, r.cred.Password)

	if remove == nil {
		t.Fatal("the mutation was never installed")
	}

	if err := remove(); err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeFailed || !x.Fenced || !strings.Contains(x.Message, "imagePullSecrets injected") {
		t.Fatalf("a proof through an injected pull secret: %+v", x)
	}

	if rootOutcome(res).Outcome != secretwrite.HeldBack {
		t.Fatalf("the root after a refused proof: %+v", rootOutcome(res))
	}

	if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
		t.Fatalf("release: %+v", rel.Outcomes)
	}

	// Plan sees the mutation before anything is touched.
	if remove, err = injectPullSecret(kube, "injected"); err != nil {
		t.Fatal(err)
	}

	r2 := newRotation(t, sb, nil, name)

	_, err = planCfg(ctx, r2.cfg)
	if rerr := remove(); rerr != nil {
		t.Fatal(rerr)
	}

	if err == nil || !strings.Contains(err.Error(), "admission changed the runtime probe pod") || !strings.Contains(err.Error(), "Nothing was changed") {
		t.Fatalf("plan with the mutation in force: %v", err)
	}

	// The control: no mutation, PodSecurity "restricted" enforced: the probe complies and proves.
	setNamespaceLabel(t, kube, sandbox.ProbeNamespace, "pod-security.kubernetes.io/enforce", "restricted")
	t.Cleanup(func() { setNamespaceLabel(t, kube, sandbox.ProbeNamespace, "pod-security.kubernetes.io/enforce", "") })

	res2, err := r2.apply(r2.plan(), apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := r2.result(res2, name); x.Outcome != state.OutcomeDone || !res2.SafeToRevoke() {
		t.Fatalf("the control run: %+v, verdict %+v", x, res2.Verdict)
	}

	waitReady(t, sb, name)
}

// setNamespaceLabel sets (value "" removes) a label of a namespace.
func setNamespaceLabel(t *testing.T, kube kubernetes.Interface, ns, key, value string) {
	t.Helper()

	n, err := kube.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if n.Labels == nil {
		n.Labels = map[string]string{}
	}

	if value == "" {
		delete(n.Labels, key)
	} else {
		n.Labels[key] = value
	}

	if _, err := kube.CoreV1().Namespaces().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A consumer reverted between its write and the root's (a GitOps controller, a reflector) is
// read again before the root is decided: the root stays on the old credential and the verdict
// names the consumer, and the writer that put it back (its field manager). The negative control: the same run without the revert writes the root.
func TestConsumerRevertedBeforeTheRootIsCaught(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	target := sandbox.ConsumerNamespaces[0]

	for _, revert := range []bool{true, false} {
		t.Run(fmt.Sprintf("revert=%t", revert), func(t *testing.T) {
			before, err := kube.CoreV1().Secrets(target).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			r := newRotation(t, sb, nil, "prod-worker-1")

			res, err := r.apply(r.plan(), apply.Hooks{BeforeRoot: func() {
				if !revert {
					return
				}

				s, err := kube.CoreV1().Secrets(target).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
				if err != nil {
					t.Error(err)

					return
				}

				s.Data = before.Data // as a platform tool re-applying its own copy does (ksail's cluster update)
				if _, err := kube.CoreV1().Secrets(target).Update(ctx, s, metav1.UpdateOptions{FieldManager: "ksail"}); err != nil {
					t.Error(err)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			where := target + "/" + sandbox.ConsumerSecret

			if !revert {
				if !res.SafeToRevoke() || rootOutcome(res).Outcome != secretwrite.Written {
					t.Fatalf("without the revert: root %+v, verdict %+v", rootOutcome(res), res.Verdict)
				}

				return
			}

			if res.SafeToRevoke() || rootOutcome(res).Outcome != secretwrite.HeldBack || !strings.Contains(rootOutcome(res).Message, where) ||
				!strings.Contains(res.Verdict.Sentence(), where) {
				t.Fatalf("a consumer reverted before the root: root %+v, verdict %+v", rootOutcome(res), res.Verdict)
			}

			// The verdict names the writer that put the old credential back, and what to do.
			named := false
			for _, u := range res.Verdict.Uses {
				named = named || (u.Name == where && strings.Contains(u.Why, "ksail wrote it at") && strings.Contains(u.Why, "after this rotation began") &&
					strings.Contains(u.Next, "stop ksail writing "+where))
			}

			if !named {
				t.Fatalf("the verdict does not name ksail, which put the old credential back: %+v", res.Verdict.Uses)
			}
		})
	}
}

// A fleet the run leaves entirely alone — every node excluded, or a selector matching no Node —
// never switches the root: zero rotated nodes is not "every node succeeded".
func TestNoRotatedNodeNeverSwitchesTheRoot(t *testing.T) {
	sb := sandboxtest.Get(t)

	for _, tc := range []struct {
		name string
		edit func(string) string
		want string
	}{
		{"every_node_excluded", func(s string) string {
			return strings.Replace(s, "nodes {", "nodes {\n  exclude = [\"prod-worker-1\", \"prod-worker-2\"]", 1)
		}, "2 nodes (prod-worker-1, prod-worker-2)"},
		{"no_node_selected", func(s string) string {
			return strings.Replace(s, `selector = "ghcrsync.dev/test-group=`, `selector = "ghcrsync.dev/no-such-group=`, 1)
		}, "an empty fleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRotation(t, sb, tc.edit, "prod-worker-1", "prod-worker-2")
			r.mayDeselect = map[string]bool{"prod-worker-1": true, "prod-worker-2": true}

			res, err := r.apply(r.plan(), apply.Hooks{})
			if err != nil {
				t.Fatal(err)
			}

			if res.SafeToRevoke() || rootOutcome(res).Outcome != secretwrite.HeldBack || !strings.Contains(res.Verdict.Sentence(), tc.want) {
				t.Fatalf("root %+v, verdict %s", rootOutcome(res), res.Verdict.Sentence())
			}
		})
	}
}

// A consumer whose write reads back as something else — the API server's own
// MutatingAdmissionPolicy rewrites it on the way in, as a policy engine may — fails, and the root
// stays on the old credential. The negative control: the other consumer, which the policy does
// not touch, is written and read back.
func TestConsumerThatReadsBackWrongHoldsTheRoot(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	target, control := sandbox.ConsumerNamespaces[0], sandbox.ConsumerNamespaces[1]

	policy := &admissionregistrationv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "rewrite-pull-secret"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "the-consumer",
				Expression: `object.metadata.namespace == "` + target + `" && object.metadata.name == "` + sandbox.ConsumerSecret + `"`}},
			Mutations: []admissionregistrationv1.Mutation{{
				PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{
					Expression: `[JSONPatch{op: "replace", path: "/data/.dockerconfigjson", value: b"{\"auths\":{}}"}]`,
				},
			}},
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: policy.Name},
	}

	api := kube.AdmissionregistrationV1()
	if _, err := api.MutatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := api.MutatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// In force (or gone) once a dry-run write of the consumer comes back rewritten (or not).
	rewritten := func(want bool) error {
		s, err := kube.CoreV1().Secrets(target).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}

		s.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{"ghcr.io":{"auth":"eDp5"}}}`)

		out, err := kube.CoreV1().Secrets(target).Update(ctx, s, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}

		if got := string(out.Data[corev1.DockerConfigJsonKey]) == `{"auths":{}}`; got != want {
			return fmt.Errorf("rewritten %t, want %t", got, want)
		}

		return nil
	}

	t.Cleanup(func() {
		_ = api.MutatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = api.MutatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})
		sandboxtest.Eventually(t, 30*time.Second, "the policy is unloaded", func() error { return rewritten(false) })
	})

	sandboxtest.Eventually(t, 30*time.Second, "the policy rewrites the consumer", func() error { return rewritten(true) })

	r := newRotation(t, sb, nil, "prod-worker-1")

	res, err := r.apply(r.plan(), apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	for _, s := range res.Secrets {
		switch s.Namespace + "/" + s.Secret {
		case target + "/" + sandbox.ConsumerSecret:
			if s.Outcome != secretwrite.Failed || !strings.Contains(s.Message, "does not match what was written") {
				t.Errorf("the rewritten consumer: %+v", s)
			}
		case control + "/" + sandbox.ConsumerSecret:
			if s.Outcome != secretwrite.Written {
				t.Errorf("the control consumer: %+v", s)
			}
		}
	}

	if rootOutcome(res).Outcome != secretwrite.HeldBack || res.SafeToRevoke() {
		t.Fatalf("root %+v, verdict %+v", rootOutcome(res), res.Verdict)
	}
}

// denySecretUpdates installs a ValidatingAdmissionPolicy (the API server's own admission) that
// denies updates of the Secret namespace/name, and waits until it is in effect.
func denySecretUpdates(t *testing.T, kube kubernetes.Interface, namespace, name string) {
	t.Helper()

	denyByPolicy(t, kube, "secrets", admissionregistrationv1.Update, namespace, name, "the root Flux secret is frozen for a change window",
		func() error { return dryRunUpdate(kube, namespace, name) })
}

// denyByPolicy installs a ValidatingAdmissionPolicy denying op on the object namespace/name of
// resource (core group) with message, and waits until write — a dry run of such a write — is
// refused; on cleanup, until it is admitted again.
func denyByPolicy(t *testing.T, kube kubernetes.Interface, resource string, op admissionregistrationv1.OperationType, namespace, name, message string, write func() error) {
	t.Helper()

	ctx := context.Background()
	api := kube.AdmissionregistrationV1()
	group := ""
	if resource == "leases" {
		group = "coordination.k8s.io"
	}

	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-" + resource + "-" + namespace + "-" + name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				ResourceNames: []string{name},
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{op},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: `object.metadata.namespace != "` + namespace + `"`, Message: message}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}

	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = api.ValidatingAdmissionPolicyBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = api.ValidatingAdmissionPolicies().Delete(context.Background(), policy.Name, metav1.DeleteOptions{})

		sandboxtest.Eventually(t, 30*time.Second, "the policy is gone", write)
	})

	sandboxtest.Eventually(t, 30*time.Second, "the policy denies "+string(op)+" of "+resource+" "+namespace+"/"+name, func() error {
		if err := write(); err == nil {
			return fmt.Errorf("a dry-run %s of %s %s/%s was admitted", op, resource, namespace, name)
		}

		return nil
	})
}

// dryRunUpdate updates the Secret with a server-side dry run (admission runs, nothing is stored).
func dryRunUpdate(kube kubernetes.Interface, namespace, name string) error {
	ctx := context.Background()

	s, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}

	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}

	s.Annotations["ghcrsync.dev/test-dry-run"] = time.Now().String()
	_, err = kube.CoreV1().Secrets(namespace).Update(ctx, s, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})

	return err
}

// A root Flux secret the API server refuses to update is a failure the run names — the root's
// line, the API's own reason, the exit — never hidden behind the nodes' success: the verdict
// says the root still holds the old credential. The negative control: the same refusal for
// another Secret's name leaves the root written.
func TestClusterPatchFailureIsNotHidden(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	for _, tc := range []struct {
		name, deny string
	}{
		{"the root refused", sandbox.RootSecret},
		{"another secret refused", "not-the-root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.deny != sandbox.RootSecret { // the Secret the policy denies, so its effect can be seen
				secrets := kube.CoreV1().Secrets(sandbox.RootNamespace)
				if _, err := secrets.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tc.deny}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}

				t.Cleanup(func() { _ = secrets.Delete(context.Background(), tc.deny, metav1.DeleteOptions{}) })
			}

			r := newRotation(t, sb, nil, "prod-worker-1")
			path := r.plan()

			denySecretUpdates(t, kube, sandbox.RootNamespace, tc.deny)

			res, err := r.apply(path, apply.Hooks{})
			if err != nil {
				t.Fatal(err)
			}

			var out strings.Builder
			if err := view.NewApply(view.Streams{Out: &out}).Result(res, nil); err != nil {
				t.Fatal(err)
			}

			root := rootOutcome(res)

			if tc.deny != sandbox.RootSecret {
				if root.Outcome != secretwrite.Written || !res.SafeToRevoke() {
					t.Fatalf("the control: %+v\n%s", root, out.String())
				}

				return
			}

			where := sandbox.RootNamespace + "/" + sandbox.RootSecret
			// The result carries the answer's class; its own text, the policy's message, goes to the
			// debug log only (an admission answer may quote what it refused).
			if root.Outcome != secretwrite.Failed || !strings.Contains(root.Message, "422 Invalid") || res.SafeToRevoke() ||
				!strings.Contains(r.log.String(), "frozen for a change window") {
				t.Fatalf("a refused root: %+v", root)
			}

			for _, want := range []string{"✗ " + where + " (root)", "1 failed", "Do not revoke the old credential yet", "the root Flux secret " + where} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("the run's output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
