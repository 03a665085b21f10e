package apply

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"

	"github.com/ghcrsync/ghcrsync/state"
)

// The Events a node's transaction writes on its Node: what ghcrsync is about to do at each
// phase, and how the transaction ended. Messages carry digests and the holder id, no secret. A
// node rotated live has none of its own unless it did not end done (a live update disrupts
// nothing): the Lease's release Event counts them (run.rotatedLive).
var (
	phaseEvents = map[state.Phase]string{
		state.PhaseClaimed:    "GhcrsyncClaim",
		state.PhaseDrained:    "GhcrsyncDrain",
		state.PhaseConfigured: "GhcrsyncConfigure",
		state.PhaseRebooting:  "GhcrsyncReboot",
		state.PhaseProved:     "GhcrsyncProve",
		state.PhaseReleased:   "GhcrsyncRelease",
	}
	outcomeEvents = map[state.Outcome]string{
		state.OutcomeDone:       "GhcrsyncRotated",
		state.OutcomeDeselected: "GhcrsyncDeselect",
		state.OutcomeFailed:     "GhcrsyncFailed",
		state.OutcomeCancelled:  "GhcrsyncCancelled",
	}
)

func (t *txn) phaseEvent(phase state.Phase) {
	reason, ok := phaseEvents[phase]
	if !ok || t.live() {
		return
	}

	rev := human.Short(t.rec.DesiredRevision)

	msg := map[state.Phase]string{
		state.PhaseClaimed:    "claiming the node (cordon and owner annotation) to rotate the registry credential to revision " + rev,
		state.PhaseDrained:    "draining the node",
		state.PhaseConfigured: "writing credential revision " + rev + " into the Talos machine config",
		state.PhaseRebooting:  "rebooting the node from boot " + human.Short(t.rec.BootBefore) + " so Talos loads it",
		state.PhaseProved:     "proving the node's container runtime pulls the private image with its own credential",
		state.PhaseReleased:   "releasing the node's fence",
	}[phase]

	t.event(reason, msg, false)
}

// live reports whether the transaction rotates the node in place: a live update or a keyring
// write (no claim, no cordon).
func (t *txn) live() bool { return t.np.Action.InPlace() }

// answer is err's text for the result, the state and the Events, with the Kubernetes API's and
// Talos's own text replaced by its class (redact.Error); the full text goes to the debug log.
func (t *txn) answer(err error) string { return redact.Logged(t.log, err) }

// event records an Event on the transaction's Node, even while the run winds down.
func (t *txn) event(reason, msg string, warning bool) {
	if t.e.o.Events == nil {
		return
	}

	ctx := context.WithoutCancel(t.e.sig)
	ref := object.NodeRef(t.np.Name, types.UID(t.np.UID))

	if err := t.e.o.Events.Record(ctx, ref, reason, fmt.Sprintf("run %s: %s", t.e.o.Holder, msg), warning); err != nil {
		t.log.Debug("event not written", "error", err)
	}
}
