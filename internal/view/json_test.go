package view

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// JSON whose strings hold what a hostile cluster may write — a legacy workflow command, ESC,
// DEL, C1 controls, direction overrides, a line starting with "::", invalid UTF-8 — passes
// through the output guard unchanged, parses, and gives back the strings as they were (invalid
// UTF-8 as encoding/json always gives it: U+FFFD). The negative control: the same values encoded
// by encoding/json alone are changed by the guard into text that no longer parses.
func TestJSONIsValidWhateverTheStringsHold(t *testing.T) {
	hostile := map[string]string{
		"legacy_command": "##[add-mask]secret ###[error]x",
		"esc":            "red \x1b[31mtext\x1b[0m",
		"del":            "a\x7fb",
		"c1":             "next line\u0085 csi\u009b",
		"bidi":           "abc\u202eedcba\u2066",
		"separators":     "a\u2028b\u2029c",
		"workflow":       "\n::error::injected\n::add-mask::x",
		"invalid_utf8":   "a\xffb",
		"plain":          "prod-worker-1",
	}

	for _, indent := range []bool{true, false} {
		b, err := marshalJSON(hostile, indent)
		if err != nil {
			t.Fatal(err)
		}

		var guarded bytes.Buffer
		if _, err := Guard(&guarded).Write(b); err != nil {
			t.Fatal(err)
		}

		if !bytes.Equal(guarded.Bytes(), b) {
			t.Fatalf("the guard changed the JSON (indent %v):\n%s\n%s", indent, b, guarded.Bytes())
		}

		var back map[string]string
		if err := json.Unmarshal(guarded.Bytes(), &back); err != nil {
			t.Fatalf("the printed JSON does not parse (indent %v): %v\n%s", indent, err, guarded.Bytes())
		}

		for k, v := range hostile {
			want := strings.ToValidUTF8(v, "\uFFFD")
			if back[k] != want {
				t.Errorf("%s: got %q, want %q", k, back[k], want)
			}
		}

		for _, bad := range []string{"##[", "\x1b", "\x7f", "\u0085", "\u202e"} {
			if bytes.Contains(guarded.Bytes(), []byte(bad)) {
				t.Errorf("the printed JSON holds %q", bad)
			}
		}

		if !utf8.Valid(guarded.Bytes()) {
			t.Error("the printed JSON is not UTF-8")
		}
	}

	// The negative control: encoding/json alone leaves DEL, C1 and "##[" raw, and the guard turns
	// them into \x escapes JSON does not have.
	raw, _ := json.Marshal(hostile)

	var guarded bytes.Buffer
	_, _ = Guard(&guarded).Write(raw)

	if json.Valid(guarded.Bytes()) {
		t.Fatalf("control: the guarded output of plain encoding/json is still valid JSON:\n%s", guarded.Bytes())
	}
}
