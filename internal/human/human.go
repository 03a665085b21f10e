// Package human renders values for people, the same way everywhere: digests and revisions
// abbreviated, instants on one clock format, ages of renewals.
package human

import (
	"fmt"
	"time"
)

// Short abbreviates a digest, revision or boot ID: its first 12 characters and "…".
func Short(s string) string {
	if len(s) > 12 {
		return s[:12] + "…"
	}

	return s
}

// ShortOrNone is Short, or "none" for an empty value.
func ShortOrNone(s string) string {
	if s == "" {
		return "none"
	}

	return Short(s)
}

// Clock is an instant in UTC, to the second.
func Clock(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

// Renewed says how long ago something was renewed: "renewed 4s ago", or "never renewed".
func Renewed(at *time.Time, now time.Time) string {
	if at == nil {
		return "never renewed"
	}

	return "renewed " + now.Sub(*at).Round(time.Second).String() + " ago"
}

// Plural is one when n is 1, else many ("fence", "fences").
func Plural(n int, one, many string) string {
	if n == 1 {
		return one
	}

	return many
}

// Days is a duration in whole days, or hours under two days ("12 days", "30 hours").
func Days(d time.Duration) string {
	if h := int(d.Hours()); h < 48 {
		return fmt.Sprintf("%d %s", h, Plural(h, "hour", "hours"))
	}

	n := int(d.Hours() / 24)

	return fmt.Sprintf("%d %s", n, Plural(n, "day", "days"))
}
