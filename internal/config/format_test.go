package config_test

import (
	"errors"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/config"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
		formatted       bool
		invalid         bool
	}{
		{name: "aligned", src: "nodes {\n  a   = 1\n  bcd = 2\n}\n", want: "nodes {\n  a   = 1\n  bcd = 2\n}\n", formatted: true},
		{name: "unaligned", src: "nodes {\na = 1\n    bcd= 2   \n}\n", want: "nodes {\n  a   = 1\n  bcd = 2\n}\n"},
		{name: "comments_kept", src: "# why\nnodes {\n  a = 1 # one\n}\n", want: "# why\nnodes {\n  a = 1 # one\n}\n", formatted: true},
		{name: "syntax_error", src: "nodes {\n  a = \n", invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := config.Format([]byte(tc.src), "x.hcl")

			var ce *config.Error
			if tc.invalid {
				if !errors.As(err, &ce) || len(ce.Findings("x.hcl")) == 0 || ce.Findings("x.hcl")[0].Range == nil {
					t.Fatalf("want a config error with a place, got %v", err)
				}

				return
			}

			if err != nil || string(got) != tc.want {
				t.Fatalf("Format: %v\n%q\nwant\n%q", err, got, tc.want)
			}

			if formatted := string(got) == tc.src; formatted != tc.formatted {
				t.Fatalf("formatted already = %v, want %v", formatted, tc.formatted)
			}
		})
	}
}
