package view

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/state"
)

// FencesJSONFormatVersion is the version of FencesJSON.
const FencesJSONFormatVersion = "1.0"

// FencesJSON is `ghcrsync fences --json`.
type FencesJSON struct {
	FormatVersion string        `json:"format_version"`
	Fences        []fence.Fence `json:"fences"`
	Notes         []string      `json:"notes,omitempty"`
	Summary       string        `json:"summary"`
}

// FencesJSONTo writes the JSON view.
func FencesJSONTo(w io.Writer, r fence.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")

	return enc.Encode(FencesJSON{FormatVersion: FencesJSONFormatVersion, Fences: r.Fences, Notes: r.Notes, Summary: r.Summary})
}

// FencesHuman renders the inventory in release order.
func FencesHuman(w io.Writer, r fence.Report) {
	for _, f := range r.Fences {
		var attrs []string
		if f.Phase != "" {
			attrs = append(attrs, "phase "+f.Phase)
		}

		if f.Kind == fence.KindNode {
			switch {
			case !f.Exists:
				attrs = append(attrs, "node gone")
			case f.Cordoned:
				attrs = append(attrs, "cordoned")
			}

			if f.ScaleDownGuard {
				attrs = append(attrs, "scale-down guard")
			}

			if f.WasCordoned != nil && *f.WasCordoned {
				attrs = append(attrs, "cordoned before the claim")
			}
		}

		head := f.Kind + " " + fence.Display(f.Name)
		if len(attrs) > 0 {
			head += " (" + strings.Join(attrs, ", ") + ")"
		}

		fmt.Fprintf(w, "  %s\n", head)
		fmt.Fprintf(w, "      holder:     %s\n", fence.Display(f.Holder))
		fmt.Fprintf(w, "      evidence:   %s\n", oneLine(f.Evidence))
		fmt.Fprintf(w, "      releasable: %s — %s\n", yesNo(f.Releasable), oneLine(f.Reason))

		switch {
		case f.Command != "":
			fmt.Fprintf(w, "      release:    %s\n", f.Command)
		case f.Releasable || (!f.Live && f.Holder != ""):
			fmt.Fprintln(w, "      release:    (a value holds control characters: take the exact holder from `ghcrsync fences --json`)")
		}

		fmt.Fprintln(w)
	}

	notes(w, r)
	fmt.Fprintln(w, r.Summary)
}

func notes(w io.Writer, r fence.Report) {
	for _, n := range r.Notes {
		fmt.Fprintf(w, "Note: %s\n\n", oneLine(n))
	}
}

// ReleaseHuman renders what release will undo (dry run) or did.
func ReleaseHuman(w io.Writer, r fence.Report, outcomes []fence.Outcome, dryRun bool) {
	notes(w, r)

	if len(r.Fences) == 0 {
		fmt.Fprintln(w, "No fence is held: nothing to release.")

		return
	}

	if dryRun {
		fmt.Fprintln(w, "ghcrsync release would undo, in this order:")
		fmt.Fprintln(w)

		for _, f := range r.Fences {
			what := "remove owner, phase and record annotations and ghcrsync's scale-down guard; uncordon unless it was cordoned before the claim"
			if f.Kind == fence.KindLease {
				what = "clear the holder (compare-and-swap on the holder)"
			}

			fmt.Fprintf(w, "  %s %s %s: %s\n      # (%s)\n", mark(f.Releasable), f.Kind, fence.Display(f.Name), what, oneLine(f.Reason))
		}

		fmt.Fprintf(w, "\n%s\n", r.Summary)

		return
	}

	released := 0

	for _, o := range outcomes {
		if o.Released {
			released++
		}

		fmt.Fprintf(w, "  %s %s %s: %s\n", mark(o.Released), o.Fence.Kind, fence.Display(o.Fence.Name), oneLine(o.Message))
	}

	fmt.Fprintf(w, "\nRelease complete: %d released, %d still held.\n", released, len(outcomes)-released)
}

// StateList renders the state's records.
func StateList(w io.Writer, st *state.State, backend string) {
	fmt.Fprintf(w, "State in %s: lineage %s, serial %d\n", backend, orNone(st.Lineage), st.Serial)

	if st.Run != nil {
		fmt.Fprintf(w, "Last run: %s, started %s, outcome %s\n", st.Run.Holder, st.Run.Started.Format("2006-01-02 15:04:05Z"), orNone(st.Run.Outcome))
	}

	for _, r := range st.Records {
		fmt.Fprintf(w, "  %-34s %-10s %-12s %-20s %s\n", r.Node, r.Action, r.Phase, orNone(r.Outcome), oneLine(r.LastError))
	}
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}

	return "✗"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}

	return "no"
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}

	return s
}

// oneLine keeps values read from the cluster on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
