package view

import (
	"fmt"
	"io"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/state"
)

// StateListJSONFormatVersion is the version of StateListJSON.
const StateListJSONFormatVersion = "1.0"

// StateListJSON is `ghcrsync state list --json`: the state as stored, with where it is stored.
type StateListJSON struct {
	FormatVersion string       `json:"format_version"`
	Backend       string       `json:"backend"`
	State         *state.State `json:"state"`
}

// StateList renders the state's records.
func StateList(w io.Writer, f Format, st *state.State, backend string) error {
	if f == JSON {
		return writeJSON(w, StateListJSON{FormatVersion: StateListJSONFormatVersion, Backend: backend, State: st})
	}

	fmt.Fprintf(w, "State in %s: lineage %s, serial %d\n", backend, orNone(st.Lineage), st.Serial)

	if st.Run != nil {
		fmt.Fprintf(w, "Last run: %s, started %s, outcome %s\n", Clean(st.Run.Holder), human.Clock(st.Run.Started), oneLine(orNone(st.Run.Outcome)))
	}

	for _, r := range st.Records {
		fmt.Fprintf(w, "  %-34s %-10s %-12s %-20s %s\n", Clean(r.Node), Clean(r.Action), Clean(string(r.Phase)), Clean(orNone(string(r.Outcome))), oneLine(r.LastError))
	}

	return nil
}

// StateRecord renders one node's record (JSON, as stored).
func StateRecord(w io.Writer, r *state.Record) error { return writeJSON(w, r) }

// StatePull renders the whole state (JSON, as stored).
func StatePull(w io.Writer, st *state.State) error { return writeJSON(w, st) }

// StateRemoved confirms `state rm`.
func StateRemoved(w io.Writer, node string) {
	fmt.Fprintf(w, "Removed the record of %s from the state. The cluster was not touched: "+
		"if the node still carries a ghcrsync fence, `ghcrsync fences` still shows it.\n", node)
}

// StatePushed confirms `state push`.
func StatePushed(w io.Writer, st *state.State, backend string) {
	fmt.Fprintf(w, "Pushed state lineage %s (now serial %d) to %s.\n", st.Lineage, st.Serial, backend)
}
