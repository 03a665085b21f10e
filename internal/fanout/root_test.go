package fanout

import (
	"strings"
	"testing"
)

// judgeRoot: the root source is judged only once source-controller handled the reconcile asked
// (its lastHandledReconcileAt is the request's token), and then only on a Ready condition of the
// object's generation.
func TestJudgeRoot(t *testing.T) {
	const token = "2026-12-07T19:00:00.123Z"

	src := func(handled string, gen, observed int64, status, reason, message string) map[string]any {
		return map[string]any{
			"metadata": map[string]any{"generation": gen},
			"status": map[string]any{
				"lastHandledReconcileAt": handled,
				"artifact":               map[string]any{"digest": "sha256:abc"},
				"conditions": []any{
					map[string]any{"type": "Reconciling", "status": "False"},
					map[string]any{"type": "Ready", "status": status, "reason": reason, "message": message, "observedGeneration": observed},
				},
			},
		}
	}

	for _, tc := range []struct {
		name           string
		obj            map[string]any
		handled, ready bool
		why            string // a part of what it says
	}{
		{"not handled yet: an older request's answer", src("2026-12-07T18:00:00Z", 1, 1, "True", "Succeeded", ""), false, false, "not handled"},
		{"never reconciled", map[string]any{"metadata": map[string]any{"generation": int64(1)}}, false, false, "not handled"},
		{"handled and Ready: pulled", src(token, 2, 2, "True", "Succeeded", "stored artifact"), true, true, "sha256:abc"},
		{"handled and refused", src(token, 2, 2, "False", "OCIArtifactPullFailed", "failed to pull artifact: UNAUTHORIZED: authentication required"), true, false, "OCIArtifactPullFailed: failed to pull artifact: UNAUTHORIZED"},
		{"a Ready of an older generation proves nothing", src(token, 3, 2, "True", "Succeeded", ""), true, false, "generation 2, not 3"},
		{"no Ready condition", map[string]any{"metadata": map[string]any{"generation": int64(1)}, "status": map[string]any{"lastHandledReconcileAt": token}}, true, false, "no Ready condition"},
		{"a credential in the message is not repeated", src(token, 1, 1, "False", "AuthenticationFailed", `{"password":"hunter2"}`), true, false, "[redacted]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := judgeRoot(tc.obj, token)
			if got.handled != tc.handled || got.ready != tc.ready || !strings.Contains(got.why, tc.why) || strings.Contains(got.why, "hunter2") {
				t.Errorf("judged %+v, want handled %v ready %v saying %q", got, tc.handled, tc.ready, tc.why)
			}
		})
	}
}
