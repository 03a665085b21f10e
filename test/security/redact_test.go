package security

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// An answer of the API server quoting the credential — here the apiserver's own
// ValidatingAdmissionPolicy plugin, denying the consumer pull secret's write with a message that
// quotes the Secret's data, as a validation error or a webhook may — reaches neither the Events,
// the state nor the output, which name the answer's class instead; the debug log has the answer
// with the credential's values scrubbed. The negative
// control: the same write, made directly, is denied with the credential in the answer's text.
func TestAnswersQuotingTheCredentialAreRedacted(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	since := time.Now().Add(-time.Second)
	target := sandbox.ConsumerNamespaces[0]

	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "quote-the-pull-secret"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "the-test-identity-writing-the-consumer",
				Expression: `request.userInfo.username == "` + testUser + `" && object.metadata.name == "` + sandbox.ConsumerSecret + `"`}},
			Validations: []admissionregistrationv1.Validation{{
				Expression:        "false",
				MessageExpression: `"this pull secret is refused: " + string(object.data[".dockerconfigjson"])`,
			}},
		},
	}

	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": target}}},
		},
	}

	vap := kube.AdmissionregistrationV1()
	if _, err := vap.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := vap.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	needles := secretFile(t, sb, "redact-answers")
	// Its own Lease: TestHostileClusterStrings creates the default one.
	cfg := config(t, sb, func(s string) string { return strings.Replace(s, `"`+sandbox.LeaseName+`"`, `"redact-answers"`, 1) })

	// The control: the policy is in force, and its answer quotes the credential.
	asTest := sandboxtest.KubeFrom(t, filepath.Join(filepath.Dir(cfg), "kubeconfig"))

	t.Cleanup(func() {
		_ = vap.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = vap.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})

		// The API server unloads a policy a moment after its deletion: later tests start clean.
		sandboxtest.Eventually(t, 30*time.Second, "the policy is unloaded", func() error {
			s, err := asTest.CoreV1().Secrets(target).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
			if err != nil {
				return err
			}

			_, err = asTest.CoreV1().Secrets(target).Update(ctx, s, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})

			return err
		})
	})
	sandboxtest.Eventually(t, 20*time.Second, "the policy denies the write, quoting the credential", func() error {
		s, err := asTest.CoreV1().Secrets(target).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}

		s.Data[".dockerconfigjson"] = []byte(`{"auths":{"ghcr.io":{"username":"u","password":"` + needles[0] + `"}}}`)

		_, err = asTest.CoreV1().Secrets(target).Update(ctx, s, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), base64.StdEncoding.EncodeToString(s.Data[".dockerconfigjson"])) {
			return fmt.Errorf("the write answered %v", err)
		}

		return nil
	})

	r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", cfg, "--log-level", "debug")
	if r.code != 5 || !strings.Contains(r.stdout, "the Kubernetes API answered 422 Invalid") {
		t.Fatalf("apply with the consumer write denied: exit %d, want 5 naming the answer's class\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// The debug log is the one place the answer's text goes, scrubbed of the credential.
	if !strings.Contains(r.stderr, "this pull secret is refused") {
		t.Errorf("the debug log lacks the full answer:\n%s", r.stderr)
	}

	// What the denied write carried, in the form the answer quotes it.
	written := []string{r.stdout}

	other, err := kube.CoreV1().Secrets(sandbox.ConsumerNamespaces[1]).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	quoted := base64.StdEncoding.EncodeToString(other.Data[".dockerconfigjson"])
	if !strings.Contains(string(other.Data[".dockerconfigjson"]), needles[0]) {
		t.Fatalf("%s/%s was not written with the new credential", sandbox.ConsumerNamespaces[1], sandbox.ConsumerSecret)
	}

	needles = append(needles, quoted)

	state, err := os.ReadFile(filepath.Join(filepath.Dir(cfg), "ghcrsync.state.json"))
	if err != nil {
		t.Fatal(err)
	}

	written = append(written, string(state))

	failed := 0

	for _, ev := range ourEvents(t, kube, since) {
		if ev.Reason == "GhcrsyncPullSecretFailed" {
			failed++
		}

		b, _ := json.Marshal(ev)
		written = append(written, string(b))
	}

	if failed == 0 {
		t.Fatal("no GhcrsyncPullSecretFailed Event")
	}

	for _, n := range needles {
		if strings.Contains(r.stderr, n) {
			t.Errorf("the debug log holds a secret form (%d bytes)", len(n))
		}
	}

	for i, w := range written {
		for _, n := range needles {
			if strings.Contains(w, n) {
				t.Errorf("written item #%d holds a secret form (%d bytes)", i, len(n))
			}
		}

		if strings.Contains(w, "this pull secret is refused") {
			t.Errorf("written item #%d holds the answer's own text", i)
		}
	}
}
