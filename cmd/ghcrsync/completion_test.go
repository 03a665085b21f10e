package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The shell completion ghcrsync generates works: bash, with the script `ghcrsync completion
// bash` prints, completes `plan --ou` to its flags and nothing else — the completion protocol's
// directive line (":4", no file completion) reaches the shell unrewritten by the output guard.
// (With the guard's rewrite, "\x3a4", bash lost the directive and offered the files of the
// working directory too: the file "--oulala" here is the negative control.)
func TestBashCompletesFlags(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}

	bin := sandboxtest.Binary(t)

	script := ghcrsync(t, "completion", "bash")
	if script.code != 0 {
		t.Fatalf("completion bash: %d %s", script.code, script.stderr)
	}

	file := filepath.Join(t.TempDir(), "ghcrsync.bash")
	if err := os.WriteFile(file, []byte(script.stdout), 0o600); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "--oulala"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ line, want, not string }{
		{"plan --ou", "--out", "--oulala"},
		{"apply --auto", "--auto-approve", ""},
		{"rel", "release", "plan"},
	} {
		t.Run(strings.ReplaceAll(tc.line, " ", "_"), func(t *testing.T) {
			words := append([]string{bin}, strings.Fields(tc.line)...)
			// The bash-completion package's word splitter, where it is installed; else its
			// behaviour for these simple lines (the script and the binary are the real ones).
			prog := `if [ -r /usr/share/bash-completion/bash_completion ]; then source /usr/share/bash-completion/bash_completion; else ` +
				`_get_comp_words_by_ref() { cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}"; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }; fi; ` +
				`source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; ` +
				`__start_ghcrsync; printf '%s\n' "${COMPREPLY[@]}"`

			cmd := exec.Command(bash, append([]string{"--norc", "--noprofile", "-c", prog, "bash", file}, words...)...)
			cmd.Dir = dir

			var stderr strings.Builder
			cmd.Stderr = &stderr

			out, err := cmd.Output()

			// compopt (the directive's "no file completion") only works inside a completion
			// bash itself started: called directly here, it says so, and nothing else may.
			var complaints []string

			for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if line != "" && !strings.Contains(line, "compopt: not currently executing completion function") {
					complaints = append(complaints, line)
				}
			}

			if err != nil || len(complaints) > 0 {
				t.Fatalf("bash: %v\n%s", err, strings.Join(complaints, "\n"))
			}

			got := strings.Fields(string(out))
			if !slices.Contains(got, tc.want) || tc.not != "" && slices.Contains(got, tc.not) {
				t.Fatalf("%q completes to %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}
