package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

func secretDigest(t *testing.T, sb *sandbox.Sandbox, ns, name string) string {
	t.Helper()

	s, err := sb.Kube().CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return authdigest.DockerConfig(s.Data[corev1.DockerConfigJsonKey])
}

func wantDigest(cred sandbox.Credential) string {
	return authdigest.DockerConfig(sandbox.DockerConfigJSON(cred))
}

// checkFanOut asserts every consumer secret and the root hold cred, the root was written last,
// and Flux was asked to reconcile.
func checkFanOut(t *testing.T, sb *sandbox.Sandbox, res *apply.Result, cred sandbox.Credential) {
	t.Helper()

	if len(res.Secrets) == 0 || res.Secrets[len(res.Secrets)-1].Role != plan.RoleRoot || res.Secrets[len(res.Secrets)-1].Outcome != secretwrite.Written {
		t.Fatalf("the root was not written last: %+v", res.Secrets)
	}

	for _, ns := range sandbox.ConsumerNamespaces {
		if secretDigest(t, sb, ns, sandbox.ConsumerSecret) != wantDigest(cred) {
			t.Errorf("%s/%s does not hold the new credential", ns, sandbox.ConsumerSecret)
		}

		sa, err := sb.Kube().CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{})
		if err != nil || len(sa.ImagePullSecrets) != 1 || sa.ImagePullSecrets[0].Name != sandbox.ConsumerSecret {
			t.Errorf("%s default service account: %v %+v", ns, err, sa.ImagePullSecrets)
		}
	}

	if secretDigest(t, sb, sandbox.RootNamespace, sandbox.RootSecret) != wantDigest(cred) {
		t.Error("the root Flux secret does not hold the new credential")
	}

	dyn, err := dynamic.NewForConfig(sb.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	repo, err := dyn.Resource(sandbox.OCIRepositoryGVR).Namespace(sandbox.RootNamespace).Get(context.Background(), sandbox.OCIRepository, metav1.GetOptions{})
	if err != nil || repo.GetAnnotations()["reconcile.fluxcd.io/requestedAt"] == "" {
		t.Errorf("no reconcile requested on the OCIRepository: %v %v", err, repo)
	}
}

// restartAllPods deletes every pod and waits until the cluster's pods are Running again.
func restartAllPods(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	ctx := context.Background()
	kube := sb.Kube()

	pods, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Every pod something recreates (a controller's, or a mirror pod) must come back as a new
	// pod: until all have, a replacement may not exist yet and a check would see too few.
	old, recreated := map[types.UID]bool{}, 0

	for _, p := range pods.Items {
		old[p.UID] = true

		if p.Status.Phase != corev1.PodSucceeded && (len(p.OwnerReferences) > 0 || p.Annotations[corev1.MirrorPodAnnotationKey] != "") {
			recreated++
		}

		_ = kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
	}

	sandboxtest.Eventually(t, 90*time.Second, "every workload pulls again", func() error {
		pods, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		running := 0

		for _, p := range pods.Items {
			if old[p.UID] {
				return fmt.Errorf("%s/%s is not replaced yet", p.Namespace, p.Name)
			}

			if p.Status.Phase == corev1.PodSucceeded {
				continue
			}

			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				return fmt.Errorf("%s/%s is %s", p.Namespace, p.Name, p.Status.Phase)
			}

			running++
		}

		if running < recreated {
			return fmt.Errorf("%d of %d pods running again", running, recreated)
		}

		return nil
	})
}

// A namespace labelled after a rotation gets its pull secret on the next one; a concurrent
// writer between read and write loses to the CAS retry; a secret another controller owns is
// left alone and reported; and a plan afterwards shows every secret unchanged.
func TestFanOutNewNamespaceConcurrentWriterForeignSecret(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	for ns, foreign := range map[string]bool{"team-c": false, "team-ext": true} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{sandbox.ConsumerLabel: "ghcr"},
		}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}

		t.Cleanup(func() { dropConsumerNamespace(t, kube, ns) })

		if foreign {
			owner, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "external-secret"}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}

			_, err = kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: sandbox.ConsumerSecret, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
				}}},
				Type: corev1.SecretTypeDockerConfigJson,
				Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	foreignBefore := secretDigest(t, sb, "team-ext", sandbox.ConsumerSecret)

	r := newRotation(t, sb, nil, "prod-worker-1")
	path := r.plan()

	byNS := map[string]plan.SecretPlan{}
	for _, sp := range r.planned.Secrets {
		byNS[sp.Namespace] = sp
	}

	if byNS["team-c"].Action != plan.SecretCreate || byNS["team-ext"].Action != plan.SecretSkip || byNS["team-a"].Action != plan.SecretUpdate {
		t.Fatalf("secret plan: %+v", r.planned.Secrets)
	}

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	_ = res

	// (The concurrent writer runs on a second rotation below, with the hook installed.)
	r2 := newRotation(t, sb, nil, "prod-worker-1")
	path2 := r2.plan()

	res2, err := applyCfg(ctx, applyOptions{
		ConfigPath: r2.cfg, PlanPath: path2,
		SecretHooks: secretwrite.Hooks{BetweenReadAndWrite: func(ns, name string, attempt int) {
			if ns != "team-a" || attempt != 0 {
				return
			}

			s, err := kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Error(err)

				return
			}

			s.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{"ghcr.io":{"username":"someone-else","password":"x"}}}`)
			if _, err := kube.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}

	for _, s := range res2.Secrets {
		switch s.Namespace {
		case "team-a":
			if s.Outcome != secretwrite.Written || !strings.Contains(s.Message, "concurrent write") {
				t.Errorf("concurrent writer: %+v", s)
			}
		case "team-ext":
			if s.Outcome != secretwrite.Skipped || !strings.Contains(s.Message, "ConfigMap team-ext/external-secret") {
				t.Errorf("foreign secret: %+v", s)
			}
		case sandbox.RootNamespace:
			// The consumer another controller owns still holds the old credential: the root
			// stays, and the verdict names it and what to do.
			if s.Outcome != secretwrite.HeldBack || !strings.Contains(s.Message, "team-ext/ghcr-pull") {
				t.Errorf("the root with a managed consumer on the old credential: %+v", s)
			}
		}
	}

	if res2.SafeToRevoke() || !strings.Contains(res2.Verdict.Sentence(), "team-ext/ghcr-pull") ||
		!strings.Contains(fmt.Sprint(res2.Verdict.Still()), "update the source ConfigMap team-ext/external-secret reads it from") {
		t.Errorf("verdict with a managed consumer on the old credential: %+v", res2.Verdict)
	}

	if secretDigest(t, sb, "team-a", sandbox.ConsumerSecret) != wantDigest(r2.cred) {
		t.Fatal("the concurrent writer's value survived")
	}

	if secretDigest(t, sb, "team-ext", sandbox.ConsumerSecret) != foreignBefore {
		t.Fatal("a secret owned by another controller was written")
	}

	if secretDigest(t, sb, "team-c", sandbox.ConsumerSecret) != wantDigest(r2.cred) {
		t.Fatal("team-c has no pull secret")
	}

	again, err := planCfg(ctx, r2.cfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, sp := range again.Plan.Secrets {
		if sp.Action != plan.SecretNoOp && sp.Action != plan.SecretSkip && sp.Role != plan.RoleRoot {
			t.Errorf("after the run %s/%s plans %s", sp.Namespace, sp.Secret, sp.Action)
		}
	}

	// The control: once the controller that owns team-ext holds the new credential too (its
	// source was updated), nothing is left on the old one and the root is written.
	ext, err := kube.CoreV1().Secrets("team-ext").Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	ext.Data[corev1.DockerConfigJsonKey] = sandbox.DockerConfigJSON(r2.cred)
	if _, err := kube.CoreV1().Secrets("team-ext").Update(ctx, ext, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	r2.mayDeselect = map[string]bool{"prod-worker-1": true} // already rotated: a no-op now
	res3, err := r2.apply(r2.plan(), apply.Hooks{})
	if err != nil || !res3.SafeToRevoke() || res3.Failed() != 0 {
		t.Fatalf("with the managed consumer on the new credential: %v, %+v, %+v", err, res3.Secrets, res3.Verdict)
	}

	// A pod in the new namespace pulls a private image through its pull secret.
	pod, err := kube.CoreV1().Pods("team-c").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "puller"},
		Spec: corev1.PodSpec{
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: sandbox.ConsumerSecret}},
			Containers:       []corev1.Container{{Name: "c", Image: sandbox.RegistryHost + "/ghcrsync/app:v1", ImagePullPolicy: corev1.PullAlways}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A bare pod has no controller: left behind, it would (rightly) block later drains.
	t.Cleanup(func() {
		_ = kube.CoreV1().Pods("team-c").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})

	sandboxtest.Eventually(t, 60*time.Second, "team-c pulls through its secret", func() error {
		if src := sb.Fleet().PullSource("team-c", pod.Name); src != "secret team-c/"+sandbox.ConsumerSecret {
			return fmt.Errorf("pull source %q", src)
		}

		return nil
	})
}

// A node failure in the run leaves the root Flux secret on its old credential (by digest), and
// the run says so.
func TestRootHeldBackWhenANodeFails(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-3"

	rootBefore := secretDigest(t, sb, sandbox.RootNamespace, sandbox.RootSecret)

	r := newRotation(t, sb, nil, name)
	path := r.plan()

	// Read-modify-writes that retry the kubelet's heartbeats, as kubectl does.
	taint := func(add bool) error {
		return sandboxtest.EditNode(ctx, kube, name, func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == "example.com/maintenance" })
			if add {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule})
			}
		})
	}
	t.Cleanup(func() { _ = taint(false) })

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if phase == state.PhaseDrained {
			if err := taint(true); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	last := res.Secrets[len(res.Secrets)-1]
	if last.Role != plan.RoleRoot || last.Outcome != secretwrite.HeldBack || !strings.Contains(last.Message, "keeps its old credential") {
		t.Fatalf("root: %+v", last)
	}

	if got := secretDigest(t, sb, sandbox.RootNamespace, sandbox.RootSecret); got != rootBefore {
		t.Fatal("the root Flux secret changed although a node failed")
	}

	// Clean up through release: the run is over and named explicitly.
	if err := taint(false); err != nil {
		t.Fatal(err)
	}

	rel, err := recoverWith(ctx, r.cfg, fence.RecoveryOptions{InventoryOptions: fence.InventoryOptions{Holder: res.Holder}})
	if err != nil || rel.Held() != 0 {
		t.Fatalf("release of the failed run's fence: %v %+v", err, rel)
	}

	assertReleased(t, sb, name, false)

	_ = errors.New
}

// A consumer namespace deleted between plan and apply is reported, not failed: one gone (the
// API server's namespace controller finished it) and one still going (a finalizer holds it
// Terminating, where the API server refuses new content) each get a skipped outcome naming the
// deletion, no pull secret fails, and the verdict holds nothing against them. The control: a
// namespace still there in the same run gets its secret.
func TestAConsumerNamespaceDeletedSinceThePlanIsReported(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	hold := "ghcrsync.dev/test-hold"

	for _, ns := range []string{"team-gone", "team-going", "team-staying"} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{sandbox.ConsumerLabel: "ghcr"}}}
		if ns == "team-going" {
			obj.Finalizers = []string{hold}
		}

		if _, err := kube.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		t.Cleanup(func() {
			sandboxtest.Eventually(t, 30*time.Second, "namespace "+ns+" released", func() error {
				n, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
				if apierrors.IsNotFound(err) || (err == nil && len(n.Finalizers) == 0) {
					return nil
				} else if err != nil {
					return err
				}

				n.Finalizers = nil
				_, err = kube.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{})

				return err
			})
			dropConsumerNamespace(t, kube, ns)
		})
	}

	r := newRotation(t, sb, nil)
	path := r.plan()

	for _, ns := range []string{"team-gone", "team-going", "team-staying"} {
		if !slices.ContainsFunc(r.planned.Secrets, func(sp plan.SecretPlan) bool { return sp.Namespace == ns && sp.Action == plan.SecretCreate }) {
			t.Fatalf("the plan does not create %s's pull secret: %+v", ns, r.planned.Secrets)
		}
	}

	for _, ns := range []string{"team-gone", "team-going"} {
		if err := kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	sandboxtest.Eventually(t, 60*time.Second, "team-gone deleted", func() error {
		if _, err := kube.CoreV1().Namespaces().Get(ctx, "team-gone", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}

		return nil
	})

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	got := map[string]secretwrite.Result{}
	for _, s := range res.Secrets {
		got[s.Namespace] = s
	}

	for _, ns := range []string{"team-gone", "team-going"} {
		t.Logf("%s: %s: %s", ns, got[ns].Outcome, got[ns].Message)

		if s := got[ns]; s.Outcome != secretwrite.Skipped || !strings.Contains(s.Message, "namespace was deleted since the plan") {
			t.Errorf("%s, deleted since the plan: %+v, want skipped, naming the deletion", ns, s)
		}
	}

	if s := got["team-staying"]; s.Outcome != secretwrite.Written {
		t.Errorf("team-staying, still there: %+v, want written", s)
	}

	// Nothing failed for it: the pull secrets all landed or were reported (the root is held back
	// here only because this rotation selects no node, and an empty inventory proves nothing).
	for _, s := range res.Secrets {
		if s.Outcome == secretwrite.Failed {
			t.Errorf("a pull secret failed: %+v", s)
		}
	}

	for _, u := range res.Verdict.Uses {
		if strings.HasPrefix(u.Name, "team-go") && u.State != plan.UseNew {
			t.Errorf("the verdict counts a namespace deleted since the plan: %+v", u)
		}
	}
}

// dropConsumerNamespace takes a test's consumer namespace away: its label first (a terminating
// namespace still matches the selector), then the namespace.
func dropConsumerNamespace(t *testing.T, kube kubernetes.Interface, ns string) {
	t.Helper()

	ctx := context.Background()
	if n, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		delete(n.Labels, sandbox.ConsumerLabel)
		_, _ = kube.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{})
	}

	_ = kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
}

// The run that holds the Lease retries a compare-and-swap of the root Flux secret that lost to
// a concurrent writer (another write between its read and its update): it re-reads, keeps the
// other writer's change, and writes. The negative control: a concurrent writer that makes the
// root another controller's (Flux's kustomize label) is not overwritten.
func TestCurrentLeaseHolderRetriesSecretCASConflicts(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	roots := kube.CoreV1().Secrets(sandbox.RootNamespace)

	for _, tc := range []struct {
		name, label, mark, refused string
		written                    bool
	}{
		{"a concurrent annotation", "", "", "", true},
		{"the root became Flux's", "kustomize.toolkit.fluxcd.io/name", "", "became managed by Flux", false},
		// Another ghcrsync configuration's mark is listed by plan, not fought over: written, and
		// marked with this configuration.
		{"the root marked by another configuration", "", "tenants/rotate", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				s, err := roots.Get(context.Background(), sandbox.RootSecret, metav1.GetOptions{})
				if err == nil {
					delete(s.Labels, "kustomize.toolkit.fluxcd.io/name")
					delete(s.Annotations, "example.com/concurrent")
					delete(s.Annotations, object.ConfigurationAnnotation)
					_, _ = roots.Update(context.Background(), s, metav1.UpdateOptions{})
				}
			})

			r := newRotation(t, sb, nil, "prod-worker-1")
			path := r.plan()
			before := secretDigest(t, sb, sandbox.RootNamespace, sandbox.RootSecret)

			res, err := applyCfg(ctx, applyOptions{
				ConfigPath: r.cfg, PlanPath: path,
				SecretHooks: secretwrite.Hooks{BetweenReadAndWrite: func(ns, name string, attempt int) {
					if ns != sandbox.RootNamespace || attempt != 0 {
						return
					}

					s, err := roots.Get(ctx, name, metav1.GetOptions{})
					if err == nil {
						metav1.SetMetaDataAnnotation(&s.ObjectMeta, "example.com/concurrent", "kept")
						if tc.label != "" {
							metav1.SetMetaDataLabel(&s.ObjectMeta, tc.label, "flux-system")
						}

						if tc.mark != "" {
							metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.ConfigurationAnnotation, tc.mark)
						}

						_, err = roots.Update(ctx, s, metav1.UpdateOptions{})
					}

					if err != nil {
						t.Error(err)
					}
				}},
			})
			if err != nil {
				t.Fatal(err)
			}

			root, now := rootOutcome(res), secretDigest(t, sb, sandbox.RootNamespace, sandbox.RootSecret)
			s, _ := roots.Get(ctx, sandbox.RootSecret, metav1.GetOptions{})

			if !tc.written {
				if root.Outcome != secretwrite.Failed || !strings.Contains(root.Message, tc.refused) || now != before {
					t.Fatalf("a root that became another controller's: %+v", root)
				}

				return
			}

			if root.Outcome != secretwrite.Written || !strings.Contains(root.Message, "after 1 concurrent write") || now != wantDigest(r.cred) ||
				s.Annotations["example.com/concurrent"] != "kept" || s.Annotations[object.ConfigurationAnnotation] != "flux-system/ghcr-auth-refresh" ||
				s.Annotations[object.CredentialAnnotation] == "" {
				t.Fatalf("the root after a concurrent write: %+v (annotations %v: the concurrent one kept, ghcrsync's marks added)", root, s.Annotations)
			}
		})
	}
}

// plan makes every fan-out write as a server-side dry run: a write the API server's admission
// refuses (a real ValidatingAdmissionPolicy) is predicted, by object, with the API's own reason,
// and apply then meets exactly that refusal. Negative control: the other consumer's create,
// admitted in the same dry run, is not flagged, and apply writes it. The dry runs write nothing
// (the audit log).
func TestPlanDryRunsTheFanOutWrites(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const (
		frozen = "team-a"
		name   = "prod-worker-2"
	)

	denyByPolicy(t, kube, "secrets", admissionregistrationv1.Update, frozen, sandbox.ConsumerSecret, "team-a's pull secret is frozen for an audit",
		func() error { return dryRunUpdate(kube, frozen, sandbox.ConsumerSecret) })

	// plan and apply as a user of their own, so the audit log tells plan's writes apart.
	const user = "dry-run-plan-test"

	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := sb.WriteKubeconfig(kc, user, "system:masters"); err != nil {
		t.Fatal(err)
	}

	r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"`+sb.Path("kubeconfig")+`"`, `"`+kc+`"`, 1) }, name)
	path := r.plan()

	var refused, admitted []string

	for _, sp := range r.planned.Secrets {
		if sp.WriteRefused != "" {
			refused = append(refused, sp.Namespace+"/"+sp.Secret+": "+sp.WriteRefused)
		} else if sp.Action == plan.SecretCreate || sp.Action == plan.SecretUpdate {
			admitted = append(admitted, sp.Namespace+"/"+sp.Secret)
		}
	}

	// By the answer's class: its text (the policy's message) is the API's, and a plan is read by
	// others.
	if len(refused) != 1 || !strings.HasPrefix(refused[0], frozen+"/") || !strings.Contains(refused[0], "422 Invalid") {
		t.Fatalf("the plan's predicted refusals: %v", refused)
	}

	if b, _ := json.Marshal(r.planned); strings.Contains(string(b), "frozen for an audit") {
		t.Fatal("the plan holds the API answer's own text")
	}

	if !slices.Contains(admitted, "team-b/"+sandbox.ConsumerSecret) {
		t.Fatalf("the admitted write is not planned clean: admitted %v", admitted)
	}

	if !strings.Contains(strings.Join(r.planned.Warnings, "\n"), "refused a dry run of apply's update of pull secret "+frozen) {
		t.Fatalf("no warning names the refusal: %v", r.planned.Warnings)
	}

	time.Sleep(time.Second) // the audit log's last lines

	if writes, err := sb.AuditedWrites(user); err != nil || len(writes) != 0 {
		t.Fatalf("plan wrote to the cluster: %v %+v", err, writes)
	}

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	for _, s := range res.Secrets {
		switch s.Namespace + "/" + s.Secret {
		case frozen + "/" + sandbox.ConsumerSecret:
			// The run names the API's answer by its class (its text is logged): the policy's 422.
			if s.Outcome != secretwrite.Failed || !strings.Contains(s.Message, "422 Invalid") {
				t.Fatalf("apply did not meet the predicted refusal: %+v", s)
			}
		case "team-b/" + sandbox.ConsumerSecret:
			if s.Outcome != secretwrite.Written {
				t.Fatalf("the admitted write: %+v", s)
			}
		}
	}
}
