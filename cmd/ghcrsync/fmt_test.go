package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `ghcrsync fmt` as terraform fmt: --check exits 2 on an unformatted file and writes nothing,
// fmt rewrites it and names it, --check then exits 0; a file that does not parse is reported
// with its line and left untouched; the shipped examples are formatted.
func TestFmt(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ghcrsync.hcl")
	broken := filepath.Join(dir, "broken", "ghcrsync.hcl")

	const unformatted = "nodes {\ndrain_timeout= \"30m\"\n    ready_timeout = \"15m\"   \n}\n"

	_ = os.WriteFile(file, []byte(unformatted), 0o600)
	_ = os.MkdirAll(filepath.Dir(broken), 0o755)
	_ = os.WriteFile(broken, []byte("nodes {\n  drain_timeout = \n"), 0o600)

	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}

		return string(b)
	}

	for _, step := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		after  string // file's content after the step
	}{
		{name: "check_unformatted", args: []string{"fmt", "--check", file}, code: 2, stdout: file + "\n", after: unformatted},
		{name: "check_by_folder", args: []string{"fmt", "--check", dir}, code: 2, stdout: file + "\n", after: unformatted},
		{name: "fmt_rewrites", args: []string{"fmt", "--config", file}, code: 0, stdout: file + "\n",
			after: "nodes {\n  drain_timeout = \"30m\"\n  ready_timeout = \"15m\"\n}\n"},
		{name: "check_formatted", args: []string{"fmt", "--check", file}, code: 0, stdout: "",
			after: "nodes {\n  drain_timeout = \"30m\"\n  ready_timeout = \"15m\"\n}\n"},
	} {
		t.Run(step.name, func(t *testing.T) {
			r := ghcrsync(t, step.args...)
			if r.code != step.code || r.stdout != step.stdout || read(file) != step.after {
				t.Fatalf("exit %d (want %d), stdout %q (want %q), file now:\n%s\n%s", r.code, step.code, r.stdout, step.stdout, read(file), r.stderr)
			}
		})
	}

	t.Run("does_not_parse", func(t *testing.T) {
		before := read(broken)

		r := ghcrsync(t, "fmt", "--recursive", dir)
		if r.code != 1 || !strings.Contains(r.stderr, "line 2") || !strings.Contains(r.stderr, "does not parse") || read(broken) != before {
			t.Fatalf("exit %d, stderr:\n%s\nfile:\n%s", r.code, r.stderr, read(broken))
		}
	})

	t.Run("examples_are_formatted", func(t *testing.T) {
		if r := ghcrsync(t, "fmt", "--check", filepath.Join("..", "..", "config", "examples")); r.code != 0 {
			t.Fatalf("exit %d: %s%s (run ghcrsync fmt config/examples)", r.code, r.stdout, r.stderr)
		}
	})
}
