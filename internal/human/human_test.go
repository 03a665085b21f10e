package human

import (
	"testing"
	"time"
)

func TestShort(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", ""},
		{"short", "abc", "abc"},
		{"exactly_twelve", "0123456789ab", "0123456789ab"},
		{"digest", "0123456789abcdef", "0123456789ab…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Short(tc.in); got != tc.want {
				t.Fatalf("Short(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}

	if ShortOrNone("") != "none" {
		t.Fatal("ShortOrNone of empty")
	}
}

func TestRenewed(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := now.Add(-4400 * time.Millisecond)

	if got := Renewed(&at, now); got != "renewed 4s ago" {
		t.Fatal(got)
	}

	if got := Renewed(nil, now); got != "never renewed" {
		t.Fatal(got)
	}

	if got := Clock(at.In(time.FixedZone("x", 3600))); got != "2026-11-30 11:59:55Z" {
		t.Fatal(got)
	}
}
