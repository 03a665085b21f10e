package answer

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Refused is a refusal of the write itself (admission, validation), never of the identity
// making it (RBAC) nor a write whose answer is unknown.
func TestRefused(t *testing.T) {
	secrets := schema.GroupResource{Resource: "secrets"}

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"none", nil, false},
		{"an admission policy", apierrors.NewForbidden(secrets, "ghcr-pull", errors.New("ValidatingAdmissionPolicy 'freeze' with binding 'freeze' denied request: frozen")), true},
		{"a webhook", apierrors.NewForbidden(secrets, "ghcr-pull", errors.New(`admission webhook "kyverno" denied the request`)), true},
		{"RBAC", apierrors.NewForbidden(secrets, "ghcr-pull", errors.New(`User "x" cannot update resource "secrets" in API group "" in the namespace "team-a"`)), false},
		{"validation", apierrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, "ghcr-pull", field.ErrorList{field.Invalid(field.NewPath("data"), "x", "too big")}), true},
		{"wrapped", fmt.Errorf("write team-a/ghcr-pull: %w", apierrors.NewBadRequest("no")), true},
		{"a conflict", apierrors.NewConflict(secrets, "ghcr-pull", errors.New("changed")), false},
		{"a timeout", apierrors.NewTimeoutError("slow", 1), false},
		{"no answer", errors.New("connection reset"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, got := Refused(tc.err)
			if got != tc.want || got && msg == "" {
				t.Fatalf("Refused(%v) = %q, %v; want %v", tc.err, msg, got, tc.want)
			}
		})
	}
}
