package object

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/state"
)

// ErrConflictLimit is returned when a compare-and-swap kept losing to other writers.
var ErrConflictLimit = errors.New("the node kept changing between read and write")

// ClaimPatch is the claim: owner, phase, recovery record, the autoscaler's scale-down guard
// (with provenance, only if ghcrsync sets it) and the cordon, in one patch.
func ClaimPatch(owner string, rec state.Fence) map[string]any {
	recJSON, _ := json.Marshal(rec)
	ann := map[string]any{
		OwnerAnnotation:  owner,
		PhaseAnnotation:  string(state.PhaseClaimed),
		RecordAnnotation: string(recJSON),
	}

	if rec.HeldUnproven { // the fence owns the cordon now (its record says so): its undo restores the hold
		ann[UnprovenAnnotation] = nil
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

// ReleasePatch removes holder's fence from n: owner, phase, record, the scale-down guard when
// ghcrsync set it (the record says so, or the guard's provenance names holder), the cordon
// unless the node was cordoned before the claim, and holder's steering taint (the node is
// rotated, or given back: pods may land on it again). With hold, the node's Talos config holds a
// credential its runtime was never proved to pull with: the cordon stays, marked as ghcrsync's
// unproven hold (UnprovenAnnotation), so the node is not returned to service unproven (a cordon
// from before the claim stays as it is, and stays its owner's).
func ReleasePatch(n *corev1.Node, holder string, rec state.Fence, hold bool) map[string]any {
	ann := map[string]any{OwnerAnnotation: nil, PhaseAnnotation: nil, RecordAnnotation: nil}
	if rec.ScaleDownGuardOurs || n.Annotations[ScaleDownGuardByAnnotation] == holder {
		ann[ScaleDownDisabledAnnotation] = nil
		ann[ScaleDownGuardByAnnotation] = nil
	}

	p := map[string]any{"metadata": map[string]any{"annotations": ann}}

	switch {
	case rec.WasCordoned: // the cordon is someone else's: it stays, and is not ghcrsync's hold
	case hold && !Proved(n, rec.DesiredRevision):
		ann[UnprovenAnnotation] = rec.DesiredRevision
	default:
		p["spec"] = map[string]any{"unschedulable": false}
	}

	return WithoutSteering(n, holder, p)
}

// Proved reports whether n's runtime was proved to pull with revision on its current boot (the
// verified marker ghcrsync writes after a proof).
func Proved(n *corev1.Node, revision string) bool {
	boot := n.Annotations[VerifiedBootAnnotation]

	return revision != "" && n.Annotations[VerifiedRevisionAnnotation] == revision && boot != "" && boot == n.Status.NodeInfo.BootID
}

// HeldUnproven reports whether n carries ghcrsync's unproven hold.
func HeldUnproven(n *corev1.Node) bool { return n.Annotations[UnprovenAnnotation] != "" }

// LiftHoldPatch lifts an unproven hold: the cordon and the annotation go (`release
// --uncordon-unproven`, a person's decision to return the node to service without a proof).
func LiftHoldPatch() map[string]any {
	return map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{UnprovenAnnotation: nil}},
		"spec":     map[string]any{"unschedulable": false},
	}
}

// Patcher is a compare-and-swap patch of a Node (Connection.CASPatch).
type Patcher interface {
	CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
		build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error)
}

// ErrNoFence is what a release check returns for a node that carries nothing of the fence (it
// was deleted, or replaced by a new Node of the same name).
var ErrNoFence = errors.New("the node carries nothing of the fence")

// ReleaseFence takes holder's fence off the node: a compare-and-swap that check must allow on
// every read; hold keeps the cordon as an unproven hold unless the node is proved
// (ReleasePatch). gone is true when the node no longer carries anything of it (deleted,
// replaced). The one undo of a fence: the executor and `ghcrsync release` both call it.
func ReleaseFence(ctx context.Context, p Patcher, name, holder string, rec state.Fence, hold bool, check func(*corev1.Node) error) (gone bool, err error) {
	_, err = p.CASPatch(ctx, name, 10, check, func(n *corev1.Node) map[string]any { return ReleasePatch(n, holder, rec, hold) }, nil)
	if apierrors.IsNotFound(err) || errors.Is(err, ErrNoFence) {
		return true, nil
	}

	return false, err
}

// PhasePatch mirrors a phase on the node.
func PhasePatch(phase state.Phase) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": map[string]any{PhaseAnnotation: string(phase)}}}
}

// MarkPatch records that the node's runtime was proved to use revision on boot; the proof
// lifts an unproven hold n carries (a node updated live holds no fence whose release would).
func MarkPatch(n *corev1.Node, revision, bootID string) map[string]any {
	ann := map[string]any{VerifiedRevisionAnnotation: revision, VerifiedBootAnnotation: bootID}
	p := map[string]any{"metadata": map[string]any{"annotations": ann}}

	if HeldUnproven(n) {
		ann[UnprovenAnnotation] = nil
		p["spec"] = map[string]any{"unschedulable": false}
	}

	return p
}

// WithKeyring adds to a node patch p the credential the node's kubelet keyring now holds
// ("": none, the annotation removed).
func WithKeyring(p map[string]any, digest string) map[string]any {
	md, _ := p["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		p["metadata"] = md
	}

	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		md["annotations"] = ann
	}

	if digest == "" {
		ann[KeyringAnnotation] = nil
	} else {
		ann[KeyringAnnotation] = digest
	}

	return p
}

// maxRecord bounds a recovery record annotation: a genuine one is a few hundred bytes.
const maxRecord = 16 << 10

// ParseRecord reads a recovery record annotation's value (anyone who can patch the Node can
// write it, so it is checked, not trusted): JSON of a state.Fence naming the node's uid.
func ParseRecord(raw string) (state.Fence, error) {
	var r state.Fence

	if len(raw) > maxRecord {
		return r, fmt.Errorf("recovery record is %d bytes, over %d", len(raw), maxRecord)
	}

	// The full schema: every field ghcrsync writes, and nothing else. A field left out would
	// read as its zero value — a missing was_cordoned as "was not cordoned", so release would
	// uncordon a node an operator had cordoned.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil || fields == nil {
		return state.Fence{}, errors.New("recovery record is not the JSON object ghcrsync writes")
	}

	for _, k := range recordFields {
		if _, ok := fields[k]; !ok {
			return state.Fence{}, fmt.Errorf("recovery record lacks %q", k)
		}
	}

	optional := 0

	for _, k := range optionalRecordFields {
		if _, ok := fields[k]; ok {
			optional++
		}
	}

	if len(fields) != len(recordFields)+optional {
		return state.Fence{}, fmt.Errorf("recovery record has fields ghcrsync does not write (it writes %s)", strings.Join(append(slices.Clone(recordFields), optionalRecordFields...), ", "))
	}

	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return state.Fence{}, errors.New("recovery record has a field of the wrong type")
	}

	if r.UID == "" {
		return state.Fence{}, errors.New("recovery record names no node uid")
	}

	return r, nil
}

// optionalRecordFields may be absent from a recovery record: absent, they read as false, which is
// what a record written before they existed meant (held_unproven: not on an unproven hold).
var optionalRecordFields = []string{"held_unproven"}

// recordFields are the fields every recovery record has: state.Fence's JSON names, as it encodes
// its zero value (the optional ones are left out).
var recordFields = func() []string {
	b, _ := json.Marshal(state.Fence{})

	var fields map[string]json.RawMessage
	_ = json.Unmarshal(b, &fields)

	return slices.Sorted(maps.Keys(fields))
}()
