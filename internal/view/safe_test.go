package view

import (
	"bytes"
	"strings"
	"testing"
)

func TestClean(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "prod-worker-1 owner abc-local-host-1-ff", "prod-worker-1 owner abc-local-host-1-ff"},
		{"unicode_kept", "nœud ✓ 节点", "nœud ✓ 节点"},
		{"newline_cannot_start_a_line", "x\n::error title=pwned::y", `x\n::error title=pwned::y`},
		{"escape_sequence", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"carriage_return", "ok\rFAIL", `ok\rFAIL`},
		{"bell_and_backspace", "a\x07b\x08", `a\x07b\x08`},
		{"c1_control", "a\u009bb", `a\x9bb`},
		{"bidi_override", "evil\u202egnp.exe", `evil\u202egnp.exe`},
		{"line_separator", "a\u2028b", `a\u2028b`},
		{"invalid_utf8", "a\xffb", `a\xffb`},
		{"tab", "a\tb", `a\tb`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Clean(tc.in); got != tc.want {
				t.Fatalf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestGuard(t *testing.T) {
	for _, tc := range []struct {
		name       string
		writes     []string
		want       string
		completion bool // GuardCompletion
	}{
		{"ordinary_lines_unchanged", []string{"  ✓ prod-worker-1 (fence): rotated\n", "Plan: 1 to fence.\n"}, "  ✓ prod-worker-1 (fence): rotated\nPlan: 1 to fence.\n", false},
		{"workflow_command_at_line_start", []string{"::error title=x::pwned\n"}, `\x3a:error title=x::pwned` + "\n", false},
		{"workflow_command_after_indentation", []string{"ok\n   \t::add-mask::x\n"}, "ok\n   \t" + `\x3a:add-mask::x` + "\n", false},
		{"colon_split_across_writes", []string{"line\n", ":", ":warning::x\n"}, "line\n" + `\x3a:warning::x` + "\n", false},
		{"colons_inside_a_line_kept", []string{"holder: a::b\n"}, "holder: a::b\n", false},
		{"escape_sequences", []string{"\x1b]0;title\x07\x1b[2J\n"}, `\x1b]0;title\x07\x1b[2J` + "\n", false},
		{"utf8_split_across_writes", []string{"\xe2\x9c", "\x93 done\n"}, "✓ done\n", false},
		{"bidi_override", []string{"\u202e\n"}, `\u202e` + "\n", false},
		{"legacy_command_mid_line", []string{"owner: x ##[add-mask]secret\n"}, "owner: x " + `##\x5badd-mask]secret` + "\n", false},
		{"legacy_command_at_line_start", []string{"##[error]fake\n"}, `##\x5berror]fake` + "\n", false},
		{"legacy_command_split_across_writes", []string{"a #", "#", "[stop-commands]t\n"}, "a " + `##\x5bstop-commands]t` + "\n", false},
		{"more_hashes", []string{"###[group]x\n"}, `###\x5bgroup]x` + "\n", false},
		{"hashes_and_brackets_apart_kept", []string{"# [x] #1 [y]\n", "#\n[z]\n"}, "# [x] #1 [y]\n#\n[z]\n", false},
		{"completion_directive_is_escaped_elsewhere", []string{"--out\n:4\n"}, "--out\n" + `\x3a4` + "\n", false},
		{"completion_directive_passes", []string{"--out\tsave the plan\n:4\n"}, "--out\tsave the plan\n:4\n", true},
		{"completion_candidate_command_escaped", []string{"::error::x\n:4\n"}, `\x3a:error::x` + "\n:4\n", true},
		{"completion_directive_with_more_escaped", []string{":4 x\n"}, `\x3a4 x` + "\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer

			g := Guard(&b)
			if tc.completion {
				g = GuardCompletion(&b)
			}
			for _, w := range tc.writes {
				if n, err := g.Write([]byte(w)); err != nil || n != len(w) {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}

			if b.String() != tc.want {
				t.Fatalf("got %q, want %q", b.String(), tc.want)
			}

			for _, line := range strings.Split(b.String(), "\n") {
				if strings.HasPrefix(strings.TrimLeft(line, " \t"), "::") || strings.ContainsRune(line, 0x1b) || strings.Contains(line, "##[") {
					t.Fatalf("unsafe line %q", line)
				}
			}
		})
	}
}
