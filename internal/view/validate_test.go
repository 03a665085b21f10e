package view_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// A configuration with two errors validates to two diagnostics, each with its range and
// snippet, in every rendering: terraform validate's JSON, the text a person reads, and the
// annotations a pull request shows on each line.
func TestValidateTwoErrors(t *testing.T) {
	v := config.Validate("testdata/validate_two_errors.hcl")

	if v.Valid || len(v.Diagnostics) != 2 {
		t.Fatalf("want 2 diagnostics, got valid=%v %+v", v.Valid, v.Diagnostics)
	}

	for _, d := range v.Diagnostics {
		if d.Range == nil || d.Snippet == nil || d.Range.Start.Line == 0 {
			t.Fatalf("diagnostic %q has no place: %+v", d.Summary, d)
		}
	}

	golden(t, "validate_two_errors.json", func(b *bytes.Buffer) error {
		if err := view.ValidateJSONTo(b, v); err != nil {
			return err
		}

		var out bytes.Buffer
		if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
			return err
		}

		b.Reset()
		b.Write(out.Bytes())

		return nil
	})
	golden(t, "validate_two_errors.txt", func(b *bytes.Buffer) error {
		view.ValidateHuman(b, v)

		return nil
	})
	golden(t, "validate_two_errors.github", func(b *bytes.Buffer) error {
		view.ValidateAnnotations(b, v)

		return nil
	})
}
