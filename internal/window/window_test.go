package window

import (
	"strings"
	"testing"
	"time"
)

func at(t *testing.T, s string) time.Time {
	t.Helper()

	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}

	return v
}

// 2026-12-07 is a Monday.
func TestOpenAndNext(t *testing.T) {
	for _, tc := range []struct {
		name, window, now string
		open              bool
		next              string
	}{
		{"weekday nights, Monday night", "Mon-Fri 22:00-06:00 UTC", "2026-12-07T23:00:00Z", true, "2026-12-07T23:00:00Z"},
		{"weekday nights, Tuesday early morning (Monday's window)", "Mon-Fri 22:00-06:00 UTC", "2026-12-08T05:59:00Z", true, "2026-12-08T05:59:00Z"},
		{"weekday nights, Monday early morning (Sunday's is not one)", "Mon-Fri 22:00-06:00 UTC", "2026-12-07T05:00:00Z", false, "2026-12-07T22:00:00Z"},
		{"weekday nights, Saturday early morning (Friday's window)", "Mon-Fri 22:00-06:00 UTC", "2026-12-12T03:00:00Z", true, "2026-12-12T03:00:00Z"},
		{"weekday nights, Saturday night", "Mon-Fri 22:00-06:00 UTC", "2026-12-12T23:00:00Z", false, "2026-12-14T22:00:00Z"},
		{"the closing minute is outside", "Mon-Fri 22:00-06:00 UTC", "2026-12-08T06:00:00Z", false, "2026-12-08T22:00:00Z"},
		{"office hours in Berlin (UTC+1 in December)", "Mon-Fri 09:00-17:00 Europe/Berlin", "2026-12-07T08:30:00Z", true, "2026-12-07T08:30:00Z"},
		{"before office hours in Berlin", "Mon-Fri 09:00-17:00 Europe/Berlin", "2026-12-07T07:30:00Z", false, "2026-12-07T08:00:00Z"},
		{"whole weekend days", "Sat,Sun 00:00-24:00 UTC", "2026-12-13T23:59:00Z", true, "2026-12-13T23:59:00Z"},
		{"whole weekend days, Monday", "Sat,Sun 00:00-24:00 UTC", "2026-12-14T00:00:00Z", false, "2026-12-19T00:00:00Z"},
		{"every day, a range across the week's end", "Fri-Mon 02:00-04:00 UTC", "2026-12-09T03:00:00Z", false, "2026-12-11T02:00:00Z"},
		{"every day", "* 02:00-04:00 UTC", "2026-12-09T04:30:00Z", false, "2026-12-10T02:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Parse(tc.window)
			if err != nil {
				t.Fatal(err)
			}

			now := at(t, tc.now)
			if got := w.Open(now); got != tc.open {
				t.Fatalf("Open(%s) = %v, want %v", tc.now, got, tc.open)
			}

			if got := w.Next(now); !got.Equal(at(t, tc.next)) {
				t.Fatalf("Next(%s) = %s, want %s", tc.now, got.UTC(), tc.next)
			}
		})
	}
}

// A node fits when its estimate ends before the window closes; across midnight too.
func TestFits(t *testing.T) {
	w, err := Parse("Mon-Fri 22:00-06:00 UTC")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		now  string
		d    time.Duration
		fits bool
	}{
		{"2026-12-08T05:50:00Z", 10 * time.Minute, true},
		{"2026-12-08T05:50:00Z", 11 * time.Minute, false},
		{"2026-12-07T22:00:00Z", 8 * time.Hour, true},
		{"2026-12-07T21:59:00Z", time.Minute, false}, // not open yet
	} {
		if got := w.Fits(at(t, tc.now), tc.d); got != tc.fits {
			t.Errorf("Fits(%s, %s) = %v, want %v", tc.now, tc.d, got, tc.fits)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ window, says string }{
		{"Mon-Fri 22:00-06:00", "is not DAYS HH:MM-HH:MM ZONE"},
		{"Someday 22:00-06:00 UTC", `"Someday" is not a day`},
		{"Mon-Fri 22:00 UTC", "are not HH:MM-HH:MM"},
		{"Mon-Fri 25:00-06:00 UTC", `"25:00" is not HH:MM`},
		{"Mon-Fri 24:00-06:00 UTC", `"24:00" is not HH:MM`},
		{"Mon-Fri 9:00-17:00 UTC", `"9:00" is not HH:MM`},
		{"Mon-Fri 10:00-10:00 UTC", "the same time"},
		{"Mon-Fri 22:00-06:00 Mars/Olympus", "not an IANA time zone"},
		{"Mon-Fri 22:00-06:00 Local", "not an IANA time zone"},
	} {
		if _, err := Parse(tc.window); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Parse(%q): %v, want %q", tc.window, err, tc.says)
		}
	}
}
