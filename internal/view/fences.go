package view

import (
	"fmt"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"io"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/fence"
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

// fencesJSONTo writes the JSON view.
func fencesJSONTo(w io.Writer, r fence.Report) error {
	return writeJSON(w, FencesJSON{FormatVersion: FencesJSONFormatVersion, Fences: r.Fences, Notes: r.Notes, Summary: r.Summary})
}

// fencesTo renders the inventory in the format.
func fencesTo(w io.Writer, f Format, r fence.Report) error {
	if f == JSON {
		return fencesJSONTo(w, r)
	}

	fencesHuman(w, r)

	return nil
}

// fencesHuman renders the inventory in release order.
func fencesHuman(w io.Writer, r fence.Report) {
	for _, f := range r.Fences {
		var attrs []string
		if f.Phase != "" {
			attrs = append(attrs, "phase "+string(f.Phase))
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

// ReleaseJSONFormatVersion is the version of ReleaseJSON.
const ReleaseJSONFormatVersion = "1.0"

// ReleaseJSON is `ghcrsync release --json`.
type ReleaseJSON struct {
	FormatVersion string        `json:"format_version"`
	DryRun        bool          `json:"dry_run"`
	Fences        []fence.Fence `json:"fences"`
	Outcomes      []OutcomeJSON `json:"outcomes"`
	Notes         []string      `json:"notes,omitempty"`
	Held          int           `json:"held"`
	Summary       string        `json:"summary"`
}

// OutcomeJSON is what release did with one fence.
type OutcomeJSON struct {
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Holder   string `json:"holder"`
	Released bool   `json:"released"`
	Message  string `json:"message"`
}

func outcomesJSON(outcomes []fence.Outcome) []OutcomeJSON {
	out := []OutcomeJSON{}
	for _, o := range outcomes {
		out = append(out, OutcomeJSON{Kind: o.Fence.Kind, Name: o.Fence.Name, Holder: o.Fence.Holder, Released: o.Released, Message: o.Message})
	}

	return out
}

// releaseTo renders what release will undo (dry run) or did.
func releaseTo(w io.Writer, f Format, res *fence.RecoveryResult) error {
	if f == JSON {
		return writeJSON(w, ReleaseJSON{FormatVersion: ReleaseJSONFormatVersion, DryRun: res.DryRun, Fences: res.Report.Fences,
			Outcomes: outcomesJSON(res.Outcomes), Notes: res.Report.Notes, Held: res.Held(), Summary: res.Report.Summary})
	}

	notes(w, res.Report)

	switch {
	case len(res.Report.Fences) == 0:
		fmt.Fprintln(w, "No fence is held: nothing to release.")
	case res.DryRun:
		releasePreview(w, res.Report)
	default:
		for _, o := range res.Outcomes {
			fmt.Fprintf(w, "  %s %s %s: %s\n", mark(o.Released), o.Fence.Kind, fence.Display(o.Fence.Name), oneLine(o.Message))
		}

		held := res.Unproven()
		fmt.Fprintf(w, "\nRelease complete: %d released, %d still held.\n", len(res.Outcomes)-res.Held()-held, res.Held())

		if held > 0 {
			fmt.Fprintf(w, "%d %s on an unproven hold (cordoned: Talos config written, runtime never proved): run apply to prove %s, or release --uncordon-unproven.\n",
				held, human.Plural(held, "node stays", "nodes stay"), human.Plural(held, "it", "them"))
		}
	}

	return nil
}

func releasePreview(w io.Writer, r fence.Report) {
	fmt.Fprintln(w, "ghcrsync release would undo, in this order:")
	fmt.Fprintln(w)

	for _, f := range r.Fences {
		what := "remove owner, phase and record annotations and ghcrsync's scale-down guard; uncordon unless it was cordoned before the claim"

		switch f.Kind {
		case fence.KindLease:
			what = "clear the holder (compare-and-swap on the holder)"
		case fence.KindSteering:
			what = "take the run's steering taint off (any other taint stays)"
		case fence.KindFlux:
			what = "resume the Flux Kustomization (spec.suspend=false) where it carries this run's suspension; a person's suspension stays"
		}

		fmt.Fprintf(w, "  %s %s %s: %s\n      # (%s)\n", mark(f.Releasable), f.Kind, fence.Display(f.Name), what, oneLine(f.Reason))
	}

	fmt.Fprintf(w, "\n%s\n", r.Summary)
}

// forceWarning is printed before a forced release.
func forceWarning(w io.Writer, holder string) {
	fmt.Fprintf(w, "Warning: --force releases fences of %s even if its run is alive; that run may still cordon, drain, "+
		"reconfigure or reboot nodes, and nothing will stop it.\n", fence.Display(holder))
}
