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

// stateList renders the state's records.
func stateList(w io.Writer, f Format, st *state.State, backend string) error {
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

// stateRecord renders one node's record (JSON, as stored).
func stateRecord(w io.Writer, r *state.Record) error { return writeJSON(w, r) }

// statePull renders the whole state (JSON, as stored).
func statePull(w io.Writer, st *state.State) error { return writeJSON(w, st) }

// stateRemoved confirms `state rm`.
func stateRemoved(w io.Writer, node string) {
	fmt.Fprintf(w, "Removed the record of %s from the state. The cluster was not touched: "+
		"if the node still carries a ghcrsync fence, `ghcrsync fences` still shows it.\n", node)
}

// statePushed confirms `state push`.
func statePushed(w io.Writer, st *state.State, backend string) {
	fmt.Fprintf(w, "Pushed state lineage %s (now serial %d) to %s.\n", st.Lineage, st.Serial, backend)
}
