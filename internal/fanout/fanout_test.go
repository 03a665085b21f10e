package fanout

import (
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestNamespaceGone(t *testing.T) {
	terminating := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `secrets "ghcr-pull" is forbidden: unable to create new content in namespace team-b because it is being terminated`,
		Details: &metav1.StatusDetails{Name: "ghcr-pull", Kind: "secrets", Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause, Field: "team-b"}}},
	}}

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"the namespace is not found", apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "team-b"), true},
		{"the namespace is being deleted", terminating, true},
		{"wrapped", fmt.Errorf("create: %w", terminating), true},
		{"another object not found", apierrors.NewNotFound(schema.GroupResource{Resource: "serviceaccounts"}, "default"), false},
		{"forbidden for another reason", apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "ghcr-pull", errors.New("RBAC")), false},
		{"a conflict", apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, "ghcr-pull", errors.New("changed")), false},
		{"not an API error", errors.New("connection refused"), false},
		{"no error", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := namespaceGone(tc.err); got != tc.want {
				t.Fatalf("namespaceGone(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
