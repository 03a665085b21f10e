// Package admission is ghcrsync's opt-in validating webhook for the node templates (`ghcrsync
// admission`): an update of a node template Secret by ghcrsync's template identity is admitted
// only when it changes nothing but the registry credential in the configured key
// (nodetemplate.CredentialOnly) — what the admission policies cannot see, since CEL cannot
// parse the machine config inside the key. Which requests reach it is the webhook
// configuration's (docs/deploy/admission.yaml: UPDATE of Secrets, by the template identity).
package admission

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/hashicorp/go-hclog"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// maxReview bounds a review's body: a Secret is at most 1 MiB, a review carries two.
const maxReview = 3 << 20

// Handler reviews the node template updates of a configuration.
type Handler struct {
	Templates []config.NodeTemplate
	// Registry is the credential's registry: the one part of a template that may change.
	Registry string
	// Log records each decision (the object and why; never a value).
	Log hclog.Logger
}

// ServeHTTP answers an AdmissionReview (admission.k8s.io/v1) with the decision.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)

		return
	}

	body, err := readlimit.Reader(r.Body, maxReview, "the AdmissionReview")
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)

		return
	}

	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview with a request", http.StatusBadRequest)

		return
	}

	review.Response = h.Review(review.Request)
	review.Request = nil

	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(review)
}

// Review decides one request: a node template's update is admitted when it changes the
// registry credential only; a create or delete of one is refused (ghcrsync makes neither);
// every other object is admitted (it is not this webhook's to judge).
func (h Handler) Review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t, ok := h.template(req)
	if !ok {
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	}

	where := fmt.Sprintf("node template %s/%s", req.Namespace, req.Name)

	if err := h.check(t, req); err != nil {
		h.log().Warn("refused", "object", where, "operation", req.Operation, "user", req.UserInfo.Username, "reason", err.Error())

		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: "ghcrsync admission: " + where + ": " + err.Error() + "; ghcrsync's identities change a node template's registry credential only (docs/rbac.md)",
		}}
	}

	h.log().Info("admitted", "object", where, "operation", req.Operation, "user", req.UserInfo.Username)

	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
}

// template is the node template req is about, if any.
func (h Handler) template(req *admissionv1.AdmissionRequest) (config.NodeTemplate, bool) {
	if req.Kind.Group != "" || req.Kind.Kind != "Secret" {
		return config.NodeTemplate{}, false
	}

	i := slices.IndexFunc(h.Templates, func(t config.NodeTemplate) bool { return t.Namespace == req.Namespace && t.Secret == req.Name })
	if i < 0 {
		return config.NodeTemplate{}, false
	}

	return h.Templates[i], true
}

// check is nil when req changes nothing of t but the registry credential in its key.
func (h Handler) check(t config.NodeTemplate, req *admissionv1.AdmissionRequest) error {
	if req.Operation != admissionv1.Update {
		return fmt.Errorf("a %s is refused: ghcrsync only updates a node template", req.Operation)
	}

	var prev, next corev1.Secret
	if err := json.Unmarshal(req.OldObject.Raw, &prev); err != nil {
		return fmt.Errorf("its current object does not decode: %w", err)
	}

	if err := json.Unmarshal(req.Object.Raw, &next); err != nil {
		return fmt.Errorf("the new object does not decode: %w", err)
	}

	if prev.Type != next.Type {
		return fmt.Errorf("its type changes (%s to %s)", prev.Type, next.Type)
	}

	if !slices.Equal(slices.Sorted(maps.Keys(prev.Data)), slices.Sorted(maps.Keys(next.Data))) {
		return fmt.Errorf("its keys change: only %s may change", t.Key)
	}

	for k, v := range prev.Data {
		if k != t.Key && string(v) != string(next.Data[k]) {
			return fmt.Errorf("key %s changes: only %s may change", k, t.Key)
		}
	}

	if err := nodetemplate.CredentialOnly(t.Format, prev.Data[t.Key], next.Data[t.Key], t.Pools, h.Registry); err != nil {
		return fmt.Errorf("key %s: %w", t.Key, err)
	}

	return nil
}

func (h Handler) log() hclog.Logger {
	if h.Log == nil {
		return hclog.NewNullLogger()
	}

	return h.Log
}
