// Package window is a maintenance window: the days and hours, in a time zone, in which a run
// may disrupt nodes (drain and reboot them), as kured's --reboot-days/--start-time/--end-time
// and the system-upgrade-controller's Plan windows give operators.
//
// Its text is DAYS HH:MM-HH:MM ZONE: DAYS is "*", one day ("Sat"), a range ("Mon-Fri") or a
// list of those ("Mon-Thu,Sat"); the hours may cross midnight ("22:00-06:00": it opens on each
// of DAYS at 22:00 and closes at 06:00 the next morning); "00:00-24:00" is the whole day; ZONE
// is an IANA time zone ("Europe/Berlin", "UTC").
package window

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Window is a parsed maintenance window.
type Window struct {
	text       string
	days       [7]bool // by time.Weekday: the days it opens on
	start, end int     // minutes of the day; end ≤ start: it closes the next day
	loc        *time.Location
}

var dayNames = map[string]time.Weekday{
	"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday,
}

// Parse reads a window's text; its error says what is wrong and what a window looks like.
func Parse(s string) (*Window, error) {
	fields := strings.Fields(s)
	if len(fields) != 3 {
		return nil, fmt.Errorf("%q is not DAYS HH:MM-HH:MM ZONE (e.g. \"Mon-Fri 22:00-06:00 Europe/Berlin\")", s)
	}

	w := &Window{text: strings.Join(fields, " ")}

	if err := w.parseDays(fields[0]); err != nil {
		return nil, err
	}

	from, to, ok := strings.Cut(fields[1], "-")
	if !ok {
		return nil, fmt.Errorf("hours %q are not HH:MM-HH:MM", fields[1])
	}

	var err error
	if w.start, err = clock(from, false); err != nil {
		return nil, err
	}

	if w.end, err = clock(to, true); err != nil {
		return nil, err
	}

	if w.start == w.end {
		return nil, fmt.Errorf("hours %q open and close at the same time: write 00:00-24:00 for a whole day", fields[1])
	}

	if w.loc, err = time.LoadLocation(fields[2]); err != nil || fields[2] == "Local" {
		return nil, fmt.Errorf("time zone %q is not an IANA time zone (e.g. UTC, Europe/Berlin)", fields[2])
	}

	return w, nil
}

func (w *Window) parseDays(s string) error {
	if s == "*" {
		for i := range w.days {
			w.days[i] = true
		}

		return nil
	}

	for _, part := range strings.Split(s, ",") {
		from, to, isRange := strings.Cut(strings.ToLower(part), "-")

		a, ok := dayNames[from]
		b, ok2 := dayNames[to]

		switch {
		case !ok, isRange && !ok2:
			return fmt.Errorf("days %q: %q is not a day (Mon, Tue, …), a range (Mon-Fri) or *", s, part)
		case !isRange:
			b = a
		}

		for d := a; ; d = (d + 1) % 7 {
			w.days[d] = true
			if d == b {
				break
			}
		}
	}

	return nil
}

// clock reads HH:MM as minutes of the day; 24:00 only as an end.
func clock(s string, isEnd bool) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)

	switch {
	case !ok || len(h) != 2 || len(m) != 2 || err1 != nil || err2 != nil || mm < 0 || mm > 59 || hh < 0:
		return 0, fmt.Errorf("%q is not HH:MM", s)
	case hh == 24 && mm == 0 && isEnd:
		return 24 * 60, nil
	case hh > 23:
		return 0, fmt.Errorf("%q is not HH:MM (00:00 to 23:59, or 24:00 as an end)", s)
	}

	return hh*60 + mm, nil
}

// String is the window's text.
func (w *Window) String() string { return w.text }

// opening is the opening on t's day in the window's zone (whether or not it opens that day).
func (w *Window) opening(t time.Time, days int) time.Time {
	l := t.In(w.loc)

	return time.Date(l.Year(), l.Month(), l.Day()+days, w.start/60, w.start%60, 0, 0, w.loc)
}

// closing is when the window that opened at o closes.
func (w *Window) closing(o time.Time) time.Time {
	minutes := w.end - w.start
	if minutes <= 0 {
		minutes += 24 * 60
	}

	l := o.In(w.loc)

	return time.Date(l.Year(), l.Month(), l.Day(), w.start/60, w.start%60+minutes, 0, 0, w.loc)
}

// Span is the window that holds t: when it opened and closes; ok is false when t is outside
// every window.
func (w *Window) Span(t time.Time) (opened, closes time.Time, ok bool) {
	for _, d := range []int{0, -1} { // today's, or yesterday's that crosses midnight
		o := w.opening(t, d)
		if w.days[o.Weekday()] && !t.Before(o) && t.Before(w.closing(o)) {
			return o, w.closing(o), true
		}
	}

	return time.Time{}, time.Time{}, false
}

// Open reports whether t is inside the window.
func (w *Window) Open(t time.Time) bool {
	_, _, ok := w.Span(t)

	return ok
}

// Fits reports whether something that starts at t and takes d ends before the window closes.
func (w *Window) Fits(t time.Time, d time.Duration) bool {
	_, closes, ok := w.Span(t)

	return ok && !t.Add(d).After(closes)
}

// Next is the window's next opening after t (t itself when t is inside it).
func (w *Window) Next(t time.Time) time.Time {
	if w.Open(t) {
		return t
	}

	for d := 0; d <= 7; d++ {
		if o := w.opening(t, d); w.days[o.Weekday()] && o.After(t) {
			return o
		}
	}

	return time.Time{} // no day at all: Parse refuses that
}
