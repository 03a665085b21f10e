package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/plan"
)

// Annotations of a fence besides plan's owner/phase/record.
const (
	// ScaleDownGuardByAnnotation records that ghcrsync set the scale-down guard (and so must
	// remove it); it is absent when the guard was already there.
	ScaleDownGuardByAnnotation = "ghcrsync.dev/scale-down-disabled-by"
)

// FenceRecord is the recovery record kept on the node (ghcrsync.dev/record): enough to undo
// the fence without the state file.
type FenceRecord struct {
	UID                string   `json:"uid"`
	WasCordoned        bool     `json:"was_cordoned"`
	InitialTaints      []string `json:"initial_taints"`
	DesiredRevision    string   `json:"desired_revision"`
	ScaleDownGuardOurs bool     `json:"scale_down_guard_ours"`
}

// ErrConflictLimit is returned when a compare-and-swap kept losing to other writers.
var ErrConflictLimit = errors.New("the node kept changing between read and write")

// Get reads a Node.
func (c *Connection) Get(ctx context.Context, name string) (*corev1.Node, error) {
	return c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// ControlPlaneLabel marks control-plane Nodes.
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// ControlPlanes lists every control-plane Node.
func (c *Connection) ControlPlanes(ctx context.Context) ([]corev1.Node, error) {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: ControlPlaneLabel})
	if err != nil {
		return nil, err
	}

	return list.Items, nil
}

// CASPatch is a compare-and-swap on a Node: it reads the node, lets check refuse it, builds a
// merge patch carrying the read resourceVersion, and on a 409 Conflict (any concurrent write,
// a kubelet heartbeat included) reads, checks and tries again, up to attempts times. Only a
// genuine change — check's error — fails it. The node as patched is returned.
func (c *Connection) CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
	build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error) {
	for attempt := 0; attempt < attempts; attempt++ {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}

		if err := check(n); err != nil {
			return n, err
		}

		patch := build(n)
		meta, _ := patch["metadata"].(map[string]any)

		if meta == nil {
			meta = map[string]any{}
			patch["metadata"] = meta
		}

		meta["resourceVersion"] = n.ResourceVersion

		body, err := json.Marshal(patch)
		if err != nil {
			return nil, err
		}

		if between != nil {
			between(attempt)
		}

		out, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		if apierrors.IsConflict(err) {
			continue
		}

		return out, err
	}

	return nil, fmt.Errorf("%s: %w after %d attempts", name, ErrConflictLimit, attempts)
}

// ClaimPatch is the claim: owner, phase, recovery record, the autoscaler's scale-down guard
// (with provenance, only if ghcrsync sets it) and the cordon, in one patch.
func ClaimPatch(n *corev1.Node, owner string, rec FenceRecord) map[string]any {
	recJSON, _ := json.Marshal(rec)
	ann := map[string]any{
		plan.OwnerAnnotation:  owner,
		plan.PhaseAnnotation:  "claimed",
		plan.RecordAnnotation: string(recJSON),
	}

	if rec.ScaleDownGuardOurs {
		ann[ScaleDownDisabledAnnotation] = "true"
		ann[ScaleDownGuardByAnnotation] = owner
	}

	return map[string]any{
		"metadata": map[string]any{"annotations": ann},
		"spec":     map[string]any{"unschedulable": true},
	}
}

// ReleasePatch removes the fence: owner, phase, record, ghcrsync's scale-down guard, and the
// cordon unless the node was cordoned before the claim.
func ReleasePatch(rec FenceRecord) map[string]any {
	ann := map[string]any{plan.OwnerAnnotation: nil, plan.PhaseAnnotation: nil, plan.RecordAnnotation: nil}
	if rec.ScaleDownGuardOurs {
		ann[ScaleDownDisabledAnnotation] = nil
		ann[ScaleDownGuardByAnnotation] = nil
	}

	p := map[string]any{"metadata": map[string]any{"annotations": ann}}
	if !rec.WasCordoned {
		p["spec"] = map[string]any{"unschedulable": false}
	}

	return p
}

// PhasePatch mirrors a phase on the node.
func PhasePatch(phase string) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": map[string]any{plan.PhaseAnnotation: phase}}}
}

// MarkPatch records that the node's runtime was proved to use revision on boot.
func MarkPatch(revision, bootID string) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		plan.VerifiedRevisionAnnotation: revision, plan.VerifiedBootAnnotation: bootID,
	}}}
}

// RecordOf reads the recovery record from a node's annotation.
func RecordOf(n *corev1.Node) (FenceRecord, bool) {
	var r FenceRecord

	raw, ok := n.Annotations[plan.RecordAnnotation]
	if !ok || json.Unmarshal([]byte(raw), &r) != nil {
		return r, false
	}

	return r, true
}

// WaitFor polls cond every interval until it is true, ctx ends, or timeout passes; errors from
// cond (an unreachable API, say) are retried and the last one is reported.
func WaitFor(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)

	var last error

	for {
		ok, err := cond()
		if ok {
			return nil
		}

		if err != nil {
			last = err
		}

		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, last)
			}

			return fmt.Errorf("timed out after %s", timeout)
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
