// Package state holds ghcrsync's state: its identity (lineage, serial) and one record per
// fence, written before every mutation (by apply) so that recovery can trust it.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// FormatVersion is the state file's format.
const FormatVersion = "1"

// State is the whole state.
type State struct {
	FormatVersion string   `json:"format_version"`
	Lineage       string   `json:"lineage"`
	Serial        int64    `json:"serial"`
	Records       []Record `json:"records"`
}

// Record is what ghcrsync did, or is doing, to one node.
type Record struct {
	Node  string `json:"node"`
	UID   string `json:"uid"`
	Phase string `json:"phase"`
}

// Terminal reports whether a record's phase ends its transaction.
func (r Record) Terminal() bool {
	switch r.Phase {
	case "released", "deselected", "gone-after-mutation":
		return true
	}

	return false
}

// ReadLocal reads a local state file. A missing file is an empty state (no lineage yet).
func ReadLocal(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &State{FormatVersion: FormatVersion}, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}

	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("state file %s is corrupt (%v): restore it from a backup, or inspect the cluster with `ghcrsync fences`", path, err)
	}

	if s.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("state file %s has format_version %q; this ghcrsync reads %q", path, s.FormatVersion, FormatVersion)
	}

	return &s, nil
}
