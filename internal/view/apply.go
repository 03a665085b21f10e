package view

import (
	"fmt"
	"io"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/fanout"
	"github.com/ghcrsync/ghcrsync/state"
)

// ApplyHuman renders a run's outcome: one line per node and per pull secret, then a summary.
func ApplyHuman(w io.Writer, results []apply.Result, secrets []fanout.Result, holder string, releaseErr error) {
	var done, deselected, gone, failed int

	fmt.Fprintln(w)

	for _, r := range results {
		mark := "✓"

		switch r.Outcome {
		case state.OutcomeDone:
			done++
		case state.OutcomeDeselected:
			mark = "-"
			deselected++
		case state.OutcomeGoneAfterMutation:
			mark = "?"
			gone++
		case state.OutcomeFailed:
			mark = "✗"
			failed++
		}

		fmt.Fprintf(w, "  %s %s (%s): %s\n", mark, r.Node, r.Action, r.Message)
	}

	fmt.Fprintf(w, "\nApply complete: %d rotated, %d deselected, %d gone after mutation, %d failed.\n", done, deselected, gone, failed)

	if len(secrets) > 0 {
		fmt.Fprintln(w)

		counts := map[string]int{}

		for _, s := range secrets {
			counts[s.Outcome]++
			mark := map[string]string{fanout.Written: "✓", fanout.Unchanged: "=", fanout.Skipped: "-", fanout.Failed: "✗", fanout.HeldBack: "✗"}[s.Outcome]
			fmt.Fprintf(w, "  %s %s/%s (%s): %s\n", mark, s.Namespace, s.Secret, s.Role, s.Message)
		}

		fmt.Fprintf(w, "\nPull secrets: %d written, %d unchanged, %d left alone, %d failed, %d held back.\n",
			counts[fanout.Written], counts[fanout.Unchanged], counts[fanout.Skipped], counts[fanout.Failed], counts[fanout.HeldBack])

		if counts[fanout.HeldBack] > 0 {
			fmt.Fprintln(w, "The root Flux secret still holds the old credential; fix the failures and run plan and apply again.")
		}

		failed += counts[fanout.Failed]
	}

	if releaseErr != nil {
		fmt.Fprintf(w, "The run's work is done, but its Lease was not released: %v\n", releaseErr)
	} else if holder != "" {
		fmt.Fprintf(w, "Lease released (holder %s).\n", holder)
	}

	if failed > 0 {
		fmt.Fprintln(w, "Failed nodes keep their fence where it is needed: inspect with `ghcrsync fences`, undo with `ghcrsync release`.")
	}
}
