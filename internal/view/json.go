package view

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"unicode/utf8"
)

// JSON ghcrsync prints carries strings from the cluster as they are, so a reader gets them
// exactly; Guard's escaping (\x85, \x5b) would make it invalid JSON. So the escaping is done
// inside the encoding, as JSON escapes: every character Guard would escape — the control
// characters encoding/json leaves raw (DEL, C1), the direction overrides — is written as a
// \uXXXX escape, and every "##[" as "##\u005b". The text then has nothing left for Guard to
// change (a JSON line never begins with a colon), and every JSON parser reads the same strings.

// marshalJSON is v as JSON (indented when indent), safe to print through Guard unchanged.
func marshalJSON(v any, indent bool) ([]byte, error) {
	var b bytes.Buffer

	enc := json.NewEncoder(&b)
	if indent {
		enc.SetIndent("", "  ")
	}

	if err := enc.Encode(v); err != nil {
		return nil, err
	}

	return escapeJSON(b.Bytes()), nil
}

// escapeJSON escapes, in valid JSON text, what Guard would otherwise change. Such characters
// occur only inside strings (JSON's structure is ASCII), where a \u escape means the same.
func escapeJSON(in []byte) []byte {
	if !bytes.Contains(in, []byte(legacyCommand)) && !hasUnsafeRune(in) {
		return in
	}

	out := make([]byte, 0, len(in)+16)

	for i := 0; i < len(in); {
		r, size := utf8.DecodeRune(in[i:])

		switch {
		case r == '[' && i >= 2 && in[i-1] == '#' && in[i-2] == '#':
			out = append(out, `\u005b`...)
		case r != utf8.RuneError && r != '\n' && r != '\t' && unsafeRune(r):
			out = appendUnicodeEscape(out, r)
		default:
			out = append(out, in[i:i+size]...)
		}

		i += size
	}

	return out
}

func hasUnsafeRune(b []byte) bool {
	for _, r := range string(b) {
		if r != '\n' && r != '\t' && unsafeRune(r) {
			return true
		}
	}

	return false
}

func appendUnicodeEscape(out []byte, r rune) []byte {
	const hex = "0123456789abcdef"

	return append(out, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}

// writeJSON writes v as indented JSON (marshalJSON).
func writeJSON(w io.Writer, v any) error {
	b, err := marshalJSON(v, true)
	if err != nil {
		return err
	}

	_, err = w.Write(b)

	return err
}

// writeJSONLine writes v as one line of JSON, in one Write (marshalJSON).
func writeJSONLine(w io.Writer, v any) error {
	b, err := marshalJSON(v, false)
	if err != nil {
		return err
	}

	_, err = w.Write(b)

	return err
}

// JSONLog wraps the stream a JSON log (hclog's JSONFormat, one object a line) is written to:
// each line is escaped as marshalJSON escapes (escapeJSON), so a hostile string in a log field
// stays valid JSON through Guard. A line is written once complete.
func JSONLog(w io.Writer) io.Writer { return &jsonLog{w: w} }

type jsonLog struct {
	mu      sync.Mutex
	w       io.Writer
	pending []byte // the line written so far, without its newline
}

func (j *jsonLog) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()

	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			j.pending = append(j.pending, rest...)

			break
		}

		line := append(j.pending, rest[:i+1]...)
		j.pending = nil
		rest = rest[i+1:]

		if _, err := j.w.Write(escapeJSON(line)); err != nil {
			return 0, err
		}
	}

	return len(p), nil
}
