package view

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/human"
	leasepkg "github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// ApplyJSONFormatVersion is the version of ApplyJSON; additive changes keep the major version
// (1.1: each node's timings; 1.2: the verdict, late nodes; 1.3: the flux block's Kustomizations;
// 1.4: the run's outcome; 1.5: each Kustomization's reclaimed and lost).
const ApplyJSONFormatVersion = "1.5"

// ApplyJSON is `ghcrsync apply --json`.
type ApplyJSON struct {
	// Type is "summary" in the JSON Lines stream of `apply --json` (the last line).
	Type               string            `json:"type,omitempty"`
	FormatVersion      string            `json:"format_version"`
	CredentialRevision string            `json:"credential_revision"`
	Changes            bool              `json:"changes"`
	Holder             string            `json:"holder,omitempty"`
	Nodes              []ApplyNodeJSON   `json:"nodes"`
	Secrets            []ApplySecretJSON `json:"secrets"`
	Reclaimed          []OutcomeJSON     `json:"reclaimed"`
	LeaseReleased      bool              `json:"lease_released"`
	LeaseError         string            `json:"lease_error,omitempty"`
	Failed             int               `json:"failed"`
	Cancelled          bool              `json:"cancelled"`
	Held               []string          `json:"held"`
	MaxFailures        int               `json:"max_failures"`
	// Verdict: is the old credential still used anywhere, as the cluster is at the end.
	Verdict *VerdictJSON `json:"verdict"`
	// Flux is what the run did with each Kustomization of the flux block.
	Flux []ApplyFluxJSON `json:"flux"`
	// Outcome is the run's in one word: "done" (safe to revoke), "progressed" (stopped on its
	// time budget with nothing failed: Remaining nodes are left to the next run, Next says how),
	// "partial" (something failed or still uses the old credential), "cancelled" (1.4).
	Outcome       string   `json:"outcome"`
	Remaining     int      `json:"remaining"`
	Deferred      []string `json:"deferred"`
	Next          string   `json:"next,omitempty"`
	BudgetSeconds float64  `json:"budget_seconds,omitempty"`
}

// Run outcomes (ApplyJSON.Outcome).
const (
	OutcomeDone       = "done"
	OutcomeProgressed = "progressed"
	OutcomePartial    = "partial"
	OutcomeCancelled  = "cancelled"
)

// RunOutcome is the run's outcome in one word, as the exit code says it (ApplyJSON.Outcome, the metrics).
func RunOutcome(res *apply.Result) string {
	switch {
	case res.Cancelled:
		return OutcomeCancelled
	case res.ReleaseErr == nil && res.Progressed():
		return OutcomeProgressed
	case res.Failed() > 0 || res.ReleaseErr != nil || !res.SafeToRevoke():
		return OutcomePartial
	}

	return OutcomeDone
}

// nextStep is what continues a progressed run.
func nextStep(res *apply.Result) string {
	when := "again (the continuation lane, docs/ci.md)"
	if !res.WindowOpens.IsZero() {
		when = fmt.Sprintf("again in the maintenance window (it opens %s; the continuation lane, docs/ci.md)", res.WindowOpens.UTC().Format(time.RFC3339))
	}

	return fmt.Sprintf("run `ghcrsync plan` and `ghcrsync apply` %s: %d %s to rotate; do not revoke the old credential before a run ends safe",
		when, len(res.Deferred()), human.Plural(len(res.Deferred()), "node is left", "nodes are left"))
}

// ApplyFluxJSON is one Kustomization of the flux block: suspended by the run, and resumed (held
// is true when the run left its suspension on: `ghcrsync release` lifts it).
type ApplyFluxJSON struct {
	Kustomization string `json:"kustomization"`
	Suspended     bool   `json:"suspended"`
	Resumed       bool   `json:"resumed"`
	Held          bool   `json:"held"`
	// Reclaimed: someone lifted the run's suspension mid-run this many times, and the run
	// suspended it again; Lost: it could not be kept, and the writes of what Git holds stopped.
	Reclaimed int    `json:"reclaimed,omitempty"`
	Lost      bool   `json:"lost,omitempty"`
	Message   string `json:"message"`
}

// ApplyEventJSON is one line of the `apply --json` stream: a step of the run, as recorded in
// the Kubernetes Event on its object. The stream ends with the summary (ApplyJSON, type
// "summary").
type ApplyEventJSON struct {
	Type          string    `json:"type"` // "event"
	FormatVersion string    `json:"format_version"`
	Time          time.Time `json:"time"`
	Kind          string    `json:"kind"` // Node, Secret, Lease
	Namespace     string    `json:"namespace,omitempty"`
	Name          string    `json:"name"`
	Reason        string    `json:"reason"`
	Message       string    `json:"message"`
	Warning       bool      `json:"warning,omitempty"`
}

// applyEventLine writes one event line of the `apply --json` stream, in one Write.
func applyEventLine(w io.Writer, ev apply.Event) error {
	return writeJSONLine(w, ApplyEventJSON{
		Type: "event", FormatVersion: ApplyJSONFormatVersion, Time: ev.Time.UTC(), Kind: ev.Object.Kind,
		Namespace: ev.Object.Namespace, Name: ev.Object.Name, Reason: ev.Reason, Message: ev.Message, Warning: ev.Warning,
	})
}

// applySummaryLine writes the last line of the `apply --json` stream.
func applySummaryLine(w io.Writer, res *apply.Result) error {
	s := newApplyJSON(res)
	s.Type = "summary"

	return writeJSONLine(w, s)
}

// ApplyNodeJSON is one node's outcome.
type ApplyNodeJSON struct {
	Name       string `json:"name"`
	Action     string `json:"action"`
	Outcome    string `json:"outcome"`
	ReasonCode string `json:"reason_code,omitempty"`
	Message    string `json:"message"`
	// Late: a node the plan did not act on, found when the fleet was listed again.
	Late bool `json:"late,omitempty"`
	// Timings: where the node's seconds went, one per step it ran, in order.
	Timings []TimingJSON `json:"timings"`
}

// TimingJSON is one step of a node's transaction and how long it took.
type TimingJSON struct {
	Step    string  `json:"step"`
	Seconds float64 `json:"seconds"`
}

// ApplySecretJSON is one pull secret's outcome.
type ApplySecretJSON struct {
	Namespace string `json:"namespace"`
	Secret    string `json:"secret"`
	Key       string `json:"key,omitempty"` // a node template's key
	Role      string `json:"role"`
	Outcome   string `json:"outcome"`
	Message   string `json:"message"`
}

// NewApplyJSON converts a run's result to its JSON view.
func newApplyJSON(res *apply.Result) ApplyJSON {
	out := ApplyJSON{
		FormatVersion: ApplyJSONFormatVersion, CredentialRevision: res.Plan.CredentialRevision, Changes: res.Plan.Changes(),
		Holder: res.Holder, Nodes: []ApplyNodeJSON{}, Secrets: []ApplySecretJSON{}, Reclaimed: outcomesJSON(res.Reclaimed),
		LeaseReleased: res.Holder != "" && res.ReleaseErr == nil, Failed: res.Failed(),
		Cancelled: res.Cancelled, Held: append([]string{}, res.Held()...), MaxFailures: res.MaxFailures,
		Verdict: newVerdictJSON(res.Verdict, res.VerdictErr), Flux: []ApplyFluxJSON{},
		Outcome: RunOutcome(res), Deferred: append([]string{}, res.Deferred()...), BudgetSeconds: res.Budget.Seconds(),
	}

	if out.Remaining = len(out.Deferred); out.Outcome == OutcomeProgressed {
		out.Next = nextStep(res)
	}

	for _, f := range res.Flux {
		out.Flux = append(out.Flux, ApplyFluxJSON{Kustomization: f.Kustomization, Suspended: f.Suspended, Resumed: f.Resumed, Held: f.Held(), Reclaimed: f.Reclaimed, Lost: f.Lost, Message: f.Message})
	}

	if res.ReleaseErr != nil {
		out.LeaseError = res.ReleaseErr.Error()
	}

	for _, n := range res.Nodes {
		timings := []TimingJSON{}
		for _, t := range n.Timings {
			timings = append(timings, TimingJSON{Step: t.Step, Seconds: math.Round(t.Duration.Seconds()*1000) / 1000})
		}

		out.Nodes = append(out.Nodes, ApplyNodeJSON{
			Name: n.Node, Action: string(n.Action), Outcome: string(n.Outcome), ReasonCode: string(n.Reason), Message: n.Message, Late: n.Late, Timings: timings,
		})
	}

	for _, s := range res.Secrets {
		out.Secrets = append(out.Secrets, ApplySecretJSON{Namespace: s.Namespace, Secret: s.Secret, Key: s.Key, Role: s.Role, Outcome: string(s.Outcome), Message: s.Message})
	}

	return out
}

// applyTo renders a run's outcome.
func applyTo(w io.Writer, f Format, res *apply.Result) error {
	if f == JSON {
		return writeJSON(w, newApplyJSON(res))
	}

	if !res.Plan.Changes() {
		fmt.Fprintln(w, "No changes. Nothing to apply.")
		fmt.Fprintln(w)
		verdictHuman(w, res.Verdict, res.VerdictErr)

		return nil
	}

	c := res.Counts()

	applyNodes(w, res, c)
	applySecrets(w, res, c)
	applyFlux(w, res, c)

	if le := new(leasepkg.Error); errors.As(res.ReleaseErr, &le) && le.Class == leasepkg.Deleted {
		fmt.Fprintf(w, "The run's Lease was gone before its release: %s\n", oneLine(le.Err.Error()))
	} else if res.ReleaseErr != nil {
		fmt.Fprintf(w, "The run's work is done, but its Lease was not released: %s\n", oneLine(res.ReleaseErr.Error()))
	} else if res.Holder != "" {
		fmt.Fprintf(w, "Lease released (holder %s).\n", Clean(res.Holder))
	}

	if c.Nodes[state.OutcomeFailed] > 0 && !res.Cancelled {
		fmt.Fprintln(w, "Failed nodes keep their fence where it is needed: inspect with `ghcrsync fences`, undo with `ghcrsync release`.")
	}

	if res.Cancelled {
		fmt.Fprintln(w, cancelledLine(res))
	}

	fmt.Fprintln(w)
	verdictHuman(w, res.Verdict, res.VerdictErr)

	return nil
}

// CancelledLine is the one line a cancelled run ends with: what it left held, and the exact
// command that releases it.
func cancelledLine(res *apply.Result) string {
	held := res.Held()
	lease := "its Lease was released"

	switch {
	case leasepkg.IsDeleted(res.ReleaseErr):
		lease = "its Lease was deleted outside ghcrsync before its release"
	case res.ReleaseErr != nil:
		lease = "its Lease is still held"
	}

	if len(held) == 0 && res.ReleaseErr == nil {
		return "Apply cancelled: no node is left fenced, and " + lease + "."
	}

	return fmt.Sprintf("Apply cancelled: %d node(s) left fenced (%s), %s. Release with: ghcrsync release --config %s",
		len(held), strings.Join(held, ", "), lease, fence.Quote(res.ConfigPath))
}

// ApplyTimings renders one line per node that ran: its wall time and where it went
// (`apply --verbose`).
func applyTimings(w io.Writer, res *apply.Result) {
	for _, r := range res.Nodes {
		if len(r.Timings) == 0 {
			continue
		}

		var total time.Duration

		steps := make([]string, 0, len(r.Timings))
		for _, t := range r.Timings {
			total += t.Duration
			steps = append(steps, fmt.Sprintf("%s %s", t.Step, seconds(t.Duration)))
		}

		fmt.Fprintf(w, "  %s: %s: %s\n", Clean(r.Node), seconds(total), strings.Join(steps, ", "))
	}
}

// seconds renders a duration as seconds with two decimals ("0.04 s", "26.10 s").
func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

var outcomeMarks = map[state.Outcome]string{
	state.OutcomeDone: "✓", state.OutcomeDeselected: "-", state.OutcomeGoneAfterMutation: "?", state.OutcomeFailed: "✗",
	state.OutcomeCancelled: "!", state.OutcomeSkipped: " ", state.OutcomeDeferred: "»",
}

// applyNodes renders one line per node and the summary.
func applyNodes(w io.Writer, res *apply.Result, c apply.Counts) {
	counts := c.Nodes

	fmt.Fprintln(w)

	for _, r := range res.Nodes {
		late := ""
		if r.Late {
			late = ", joined or changed during the run"
		}

		fmt.Fprintf(w, "  %s %s (%s%s): %s\n", outcomeMarks[r.Outcome], Clean(r.Node), r.Action, late, oneLine(r.Message))
	}

	fmt.Fprintf(w, "\nApply complete: %d rotated, %d deselected, %d gone after mutation, %d failed.\n",
		counts[state.OutcomeDone], counts[state.OutcomeDeselected], counts[state.OutcomeGoneAfterMutation], counts[state.OutcomeFailed])

	if n := counts[state.OutcomeSkipped]; n > 0 && !res.Cancelled {
		fmt.Fprintf(w, "The failure budget stopped the run: after %d failed node(s) (nodes.max_failures = %d), %d node(s) were not started.\n",
			counts[state.OutcomeFailed], res.MaxFailures, n)
	}

	if n := counts[state.OutcomeCancelled] + counts[state.OutcomeSkipped]; n > 0 && res.Cancelled {
		fmt.Fprintf(w, "The run was cancelled: %d node(s) stopped or not started.\n", n)
	}

	if n := counts[state.OutcomeDeferred]; n > 0 {
		fmt.Fprintf(w, "The time budget (%s) stopped the run at a safe point: %d %s not started, left to the next run (every fence of this run is released).\n",
			res.Budget, n, human.Plural(n, "node was", "nodes were"))

		if res.Progressed() {
			fmt.Fprintf(w, "Progressed: %s.\n", nextStep(res))
		}
	}
}

// applyFlux renders the flux block's Kustomizations.
func applyFlux(w io.Writer, res *apply.Result, c apply.Counts) {
	if len(res.Flux) == 0 {
		return
	}

	fmt.Fprintln(w)

	for _, f := range res.Flux {
		mark := "="
		switch {
		case f.Held(), f.Lost:
			mark = "✗"
		case f.Resumed:
			mark = "✓"
		}

		fmt.Fprintf(w, "  %s Flux Kustomization %s: %s\n", mark, Clean(f.Kustomization), oneLine(f.Message))
	}

	if left := c.FluxLeft; left > 0 {
		fmt.Fprintf(w, "%d Flux %s left suspended: GitOps stays stopped until `ghcrsync release` resumes it.\n", left, human.Plural(left, "Kustomization", "Kustomizations"))
	}
}

var secretMarks = map[secretwrite.Outcome]string{secretwrite.Written: "✓", secretwrite.Unchanged: "=", secretwrite.Skipped: "-", secretwrite.Failed: "✗", secretwrite.HeldBack: "✗"}

// applySecrets renders the fan-out.
func applySecrets(w io.Writer, res *apply.Result, c apply.Counts) {
	if len(res.Secrets) == 0 {
		return
	}

	fmt.Fprintln(w)

	counts, templates := c.Secrets, c.Templates

	for _, s := range res.Secrets {
		name := s.Namespace + "/" + s.Secret

		if s.Role == plan.RoleTemplate {
			name += "[" + s.Key + "]"
		}

		fmt.Fprintf(w, "  %s %s (%s): %s\n", secretMarks[s.Outcome], Clean(name), s.Role, oneLine(s.Message))
	}

	fmt.Fprintf(w, "\nPull secrets: %d written, %d unchanged, %d left alone, %d failed, %d held back.\n",
		counts[secretwrite.Written], counts[secretwrite.Unchanged], counts[secretwrite.Skipped], counts[secretwrite.Failed], counts[secretwrite.HeldBack])

	if len(templates) > 0 {
		fmt.Fprintf(w, "Node templates: %d written, %d unchanged, %d failed.\n", templates[secretwrite.Written], templates[secretwrite.Unchanged], templates[secretwrite.Failed])
	}

	if counts[secretwrite.HeldBack] > 0 {
		fmt.Fprintln(w, "The root Flux secret still holds the old credential: see the verdict; fix what it names and run plan and apply again.")
	}
}
