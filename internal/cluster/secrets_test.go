package cluster

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
)

// A pull secret another ghcrsync configuration marked is that configuration's; one this
// configuration marked, or one with no mark (written before the marks, or by hand), is not.
func TestOtherConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        string
	}{
		{"no_mark", nil, ""},
		{"our_mark", map[string]string{object.ConfigurationAnnotation: "flux-system/ghcr-auth-refresh"}, ""},
		{"another_configuration", map[string]string{object.ConfigurationAnnotation: "tenants/rotate", object.CredentialAnnotation: "tenant-a"},
			`ghcrsync configuration "tenants/rotate" (credential "tenant-a")`},
		{"another_without_credential", map[string]string{object.ConfigurationAnnotation: "tenants/rotate"}, `ghcrsync configuration "tenants/rotate"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}}
			if got := OtherConfiguration(s, "flux-system/ghcr-auth-refresh"); got != tc.want {
				t.Fatalf("%q, want %q", got, tc.want)
			}
		})
	}
}
