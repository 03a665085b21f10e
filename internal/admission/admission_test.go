package admission_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ghcrsync/ghcrsync/internal/admission"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
)

const key = "TALOS_CONFIG"

func secret(t *testing.T, typ corev1.SecretType, data map[string][]byte) runtime.RawExtension {
	t.Helper()

	b, err := json.Marshal(&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: "kube-system"}, Type: typ, Data: data})
	if err != nil {
		t.Fatal(err)
	}

	return runtime.RawExtension{Raw: b}
}

func TestReview(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "nodetemplate", "testdata", "document.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	rotated, err := nodetemplate.Rewrite(nodetemplate.FormatTalos, doc, nil, "ghcr.io", "fleet-new", "ghp_new")
	if err != nil {
		t.Fatal(err)
	}

	h := admission.Handler{Registry: "ghcr.io", Templates: []config.NodeTemplate{{Namespace: "kube-system", Secret: "workers", Key: key, Format: nodetemplate.FormatTalos}}}
	old := secret(t, corev1.SecretTypeOpaque, map[string][]byte{key: doc, "OTHER": []byte("x")})
	with := func(data map[string][]byte) runtime.RawExtension { return secret(t, corev1.SecretTypeOpaque, data) }
	kind := metav1.GroupVersionKind{Version: "v1", Kind: "Secret"}

	for _, c := range []struct {
		name    string
		req     admissionv1.AdmissionRequest
		allowed bool
		reason  string
	}{
		{"rotation", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old, Object: with(map[string][]byte{key: rotated, "OTHER": []byte("x")})}, true, ""},
		{"unchanged", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old, Object: old}, true, ""},
		{"install_disk", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old,
			Object: with(map[string][]byte{key: bytes.Replace(rotated, []byte("/dev/sda"), []byte("/dev/sdb"), 1), "OTHER": []byte("x")})}, false, "changes more than the credential"},
		{"another_key", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old, Object: with(map[string][]byte{key: doc, "OTHER": []byte("y")})}, false, "key OTHER changes"},
		{"a_new_key", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old,
			Object: with(map[string][]byte{key: doc, "OTHER": []byte("x"), "HCLOUD_ENDPOINT": []byte("https://attacker.example")})}, false, "its keys change"},
		{"type", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old,
			Object: secret(t, corev1.SecretTypeDockerConfigJson, map[string][]byte{key: doc, "OTHER": []byte("x")})}, false, "its type changes"},
		{"not_a_config", admissionv1.AdmissionRequest{Operation: admissionv1.Update, OldObject: old, Object: with(map[string][]byte{key: []byte("{"), "OTHER": []byte("x")})}, false, "the new value"},
		{"create", admissionv1.AdmissionRequest{Operation: admissionv1.Create, Object: old}, false, "a CREATE is refused"},
		{"delete", admissionv1.AdmissionRequest{Operation: admissionv1.Delete, OldObject: old}, false, "a DELETE is refused"},
		{"another_secret", admissionv1.AdmissionRequest{Operation: admissionv1.Update, Name: "other", OldObject: old, Object: with(map[string][]byte{"OTHER": []byte("y")})}, true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := c.req
			req.UID, req.Kind, req.Namespace = "uid-1", kind, "kube-system"

			if req.Name == "" {
				req.Name = "workers"
			}

			resp := roundTrip(t, h, &req)
			if resp.UID != req.UID || resp.Allowed != c.allowed {
				t.Fatalf("allowed %v (uid %s), want %v: %+v", resp.Allowed, resp.UID, c.allowed, resp.Result)
			}

			if !c.allowed && (resp.Result == nil || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, c.reason)) {
				t.Fatalf("refusal %+v, want 403 saying %q", resp.Result, c.reason)
			}

			if resp.Result != nil && (strings.Contains(resp.Result.Message, "ghp_") || strings.Contains(resp.Result.Message, "keep-me")) {
				t.Fatalf("the refusal holds a credential: %s", resp.Result.Message)
			}
		})
	}
}

// roundTrip posts req in an AdmissionReview to h, as the API server does, and decodes the answer.
func roundTrip(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()

	body, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	if err != nil {
		t.Fatal(err)
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", bytes.NewReader(body)))

	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("answer %d %q: %v", rec.Code, rec.Body.String(), err)
	}

	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Fatalf("answer is %s %s, want an admission.k8s.io/v1 AdmissionReview", out.APIVersion, out.Kind)
	}

	return out.Response
}

// What is not an AdmissionReview is answered with an error, never a decision.
func TestBadRequests(t *testing.T) {
	h := admission.Handler{}

	for name, r := range map[string]*http.Request{
		"get":        httptest.NewRequest(http.MethodGet, "/validate", nil),
		"not_json":   httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader("{")),
		"no_request": httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`)),
		"too_large":  httptest.NewRequest(http.MethodPost, "/validate", bytes.NewReader(make([]byte, 4<<20))),
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)

			if rec.Code < 400 {
				t.Fatalf("answered %d: %s", rec.Code, rec.Body.String())
			}
		})
	}
}
