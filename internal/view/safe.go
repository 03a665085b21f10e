package view

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

// Strings ghcrsync prints come from places anyone may write to: a node annotation (a node's own
// kubelet can patch it), a Lease holder, an API error, a registry's answer. Printed raw into a
// CI log, such a string could end a line and start a GitHub Actions workflow command
// ("::error …", "::add-mask::…"), or move the cursor and rewrite what a person reads. The two
// rules below are the only ones: Clean for a value inside a line, Guard for every stream.

// Clean renders a value from outside ghcrsync inside a line: every control character
// (newline and tab included), invisible direction override and invalid UTF-8 is shown escaped
// (\n, \x1b, \u202e), so a value can neither start a line nor reach the terminal as a control.
func Clean(s string) string {
	if !needsCleaning(s) {
		return s
	}

	var b strings.Builder

	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])

		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case unsafeRune(r):
			b.WriteString(escapeRune(r))
		default:
			b.WriteString(s[i : i+size])
		}

		i += size
	}

	return b.String()
}

func needsCleaning(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}

	for _, r := range s {
		if r == '\n' || r == '\t' || unsafeRune(r) {
			return true
		}
	}

	return false
}

// unsafeRune: a control character other than newline and tab (C0, DEL, C1), or an invisible
// character that changes how a line reads (bidirectional overrides and isolates, line and
// paragraph separators).
func unsafeRune(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c,
		r == 0x2028, r == 0x2029:
		return true
	}

	return false
}

func escapeRune(r rune) string {
	if r <= 0xff {
		return fmt.Sprintf(`\x%02x`, r)
	}

	return fmt.Sprintf(`\u%04x`, r)
}

// Guard wraps one of ghcrsync's output streams (stdout, stderr, the log). Whatever a value
// holds, nothing it lets through is a control character other than newline and tab (the rest
// are shown escaped, as Clean does), no line begins — after its indentation — with a colon
// (shown as \x3a), and no "##[" appears anywhere in a line (its bracket shown as \x5b):
// GitHub Actions reads a line starting with "::" as a workflow command, and "##[" anywhere in
// a line as one in the legacy form (##[add-mask], ##[error], ##[stop-commands]…); ghcrsync
// writes neither through a guarded stream.
func Guard(w io.Writer) io.Writer {
	if g, ok := w.(*guard); ok {
		return g
	}

	return &guard{w: w, lineStart: true}
}

// GuardCompletion is Guard for a shell-completion request's stdout: the same rules, except that
// the completion protocol's own last line — a colon and the directive's number (":4") — is let
// through; a candidate that is anything else beginning with a colon is still escaped.
func GuardCompletion(w io.Writer) io.Writer { return &guard{w: w, lineStart: true, directives: true} }

type guard struct {
	w          io.Writer
	directives bool // a line ":<digits>" passes (GuardCompletion)
	mu         sync.Mutex
	lineStart  bool   // only spaces and tabs since the last newline
	hashes     int    // how many "#" were just written, in a row
	carry      []byte // an incomplete UTF-8 sequence the previous Write ended with
}

// directive reports whether rest, what follows a line's colon, is a completion directive: one
// or more digits, then the end of the line.
func directive(rest []byte) bool {
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}

	return n > 0 && (n == len(rest) || rest[n] == '\n')
}

// legacyCommand is the GitHub Actions runner's legacy workflow-command marker, honoured
// anywhere in a line; legacyEscape is how it is shown instead.
const (
	legacyCommand = "##["
	legacyEscape  = `##\x5b`
)

// withoutLegacyCommands shows every "##[" in s as legacyEscape: the same rule as Guard's, for a
// line written past it (an annotation).
func withoutLegacyCommands(s string) string {
	return strings.ReplaceAll(s, legacyCommand, legacyEscape)
}

// put appends one rune (raw, its bytes; rest, what follows it) as the guard shows it, and keeps
// the guard's place: at a line's start, after how many '#'.
func (g *guard) put(out []byte, r rune, raw, rest []byte) []byte {
	hashes := g.hashes
	g.hashes = 0
	lineStart := g.lineStart
	g.lineStart = false

	switch {
	case r == '\n':
		g.lineStart = true

		return append(out, '\n')
	case r == '#':
		g.hashes = hashes + 1

		return append(out, '#')
	case r == '[' && hashes >= 2:
		return append(out, legacyEscape[2:]...)
	case r == ' ' || r == '\t':
		g.lineStart = lineStart // blanks keep a line's start

		return append(out, byte(r))
	case unsafeRune(r):
		return append(out, escapeRune(r)...)
	case r == ':' && lineStart && g.directives && directive(rest):
		return append(out, ':')
	case r == ':' && lineStart:
		return append(out, `\x3a`...)
	}

	return append(out, raw...)
}

func (g *guard) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()

	buf := append(g.carry, p...)
	g.carry = nil
	out := make([]byte, 0, len(buf)+16)

	for i := 0; i < len(buf); {
		r, size := utf8.DecodeRune(buf[i:])

		if r == utf8.RuneError && size <= 1 {
			if !utf8.FullRune(buf[i:]) {
				g.carry = append([]byte(nil), buf[i:]...)

				break
			}

			out = fmt.Appendf(out, `\x%02x`, buf[i])
			g.lineStart = false
			i++

			continue
		}

		out = g.put(out, r, buf[i:i+size], buf[i+size:])
		i += size
	}

	if _, err := g.w.Write(out); err != nil {
		return 0, err
	}

	return len(p), nil
}
