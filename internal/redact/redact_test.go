package redact

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const secret = "ghp_0123456789abcdef0123456789abcdef"

func TestError(t *testing.T) {
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, "ghcr-pull",
		field.ErrorList{field.Invalid(field.NewPath("data", ".dockerconfigjson"), secret, "not valid")})
	webhook := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "ghcr-pull", errors.New(`admission webhook "x" denied: `+secret))
	diff := status.Error(codes.InvalidArgument, "this config change can't be applied in immediate mode\ndiff:\n+  password: "+secret)

	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"validation_error_quoting_a_value", fmt.Errorf("write pull secret team-a/ghcr-pull: %w", invalid),
			[]string{"write pull secret team-a/ghcr-pull: the Kubernetes API answered 422 Invalid (fields data..dockerconfigjson)", Hint}},
		{"webhook_text", fmt.Errorf("claim: %w", webhook), []string{"claim: the Kubernetes API answered 403 Forbidden", Hint}},
		{"talos_immediate_mode_diff", fmt.Errorf("configure 10.0.0.5: %w", diff), []string{"configure 10.0.0.5: Talos answered InvalidArgument", Hint}},
		{"joined_answers", errors.Join(fmt.Errorf("a: %w", invalid), fmt.Errorf("b: %w", diff)),
			[]string{"a: the Kubernetes API answered 422 Invalid", "b: Talos answered InvalidArgument"}},
		{"our_own_words_kept", errors.New("drain of w1 did not finish within 2m"), []string{"drain of w1 did not finish within 2m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Error(tc.err)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %q, want it to hold %q", got, w)
				}
			}

			if strings.Contains(got, secret) || strings.Contains(got, "diff") || strings.Contains(got, "webhook") {
				t.Errorf("the answer's text survived: %q", got)
			}
		})
	}

	if Error(nil) != "" {
		t.Error("Error(nil) is not empty")
	}

	// The negative control: the unredacted texts hold the secret.
	for _, e := range []error{invalid, webhook, diff} {
		if !strings.Contains(e.Error(), secret) {
			t.Fatalf("control: %q does not hold the secret", e.Error())
		}
	}
}

func TestScrub(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"talos_diff", "diff:\n-  password: old-secret\n+  password: " + secret + "\n   username: u", "diff:\n-  password: [redacted]\n+  password: [redacted]\n   username: u"},
		{"yaml_auth", "auth: dXNlcjpwYXNz\n", "auth: [redacted]\n"},
		{"dockerconfigjson", `denied: {"auths":{"ghcr.io":{"username":"u","password":"` + secret + `","auth":"eA=="}}}`,
			`denied: {"auths":{"ghcr.io":{"username":"u","password":"[redacted]","auth":"[redacted]"}}}`},
		{"base64_of_a_dockerconfigjson", "refused: " + base64.StdEncoding.EncodeToString([]byte(`{"auths":{"ghcr.io":{"password":"`+secret+`"}}}`)) + " (x)",
			"refused: [redacted base64] (x)"},
		{"base64_of_nothing_sensitive_kept", "uid ZGVhZGJlZWZkZWFkYmVlZg==", "uid ZGVhZGJlZWZkZWFkYmVlZg=="},
		{"escaped_quote", `"password":"a\"b"`, `"password":"[redacted]"`},
		{"nothing_sensitive", "connection refused", "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Scrub(tc.in); got != tc.want {
				t.Fatalf("Scrub(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
