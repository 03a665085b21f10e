package main

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
)

// Output modes of --output: GitHub Actions output (annotations and a step summary) is on in
// "github", and in "auto" when GITHUB_ACTIONS=true.
const (
	outputAuto   = "auto"
	outputGitHub = "github"
	outputPlain  = "plain"
)

// githubOutput reports whether the command writes GitHub Actions output.
func githubOutput(cmd *cobra.Command) (bool, error) {
	mode, err := cmd.Flags().GetString("output")
	if err != nil {
		return false, nil //nolint:nilerr // a command without the flag writes none
	}

	switch mode {
	case outputGitHub:
		return true, nil
	case outputPlain:
		return false, nil
	case outputAuto:
		return os.Getenv("GITHUB_ACTIONS") == "true", nil
	}

	return false, fmt.Errorf("unknown --output %q: use auto, github or plain", mode)
}

// annotations is where the command writes its workflow commands (annotations): stdout, or
// stderr when stdout carries JSON (--json) — the runner reads workflow commands from both
// streams, and a JSON reader of stdout (jq) must see JSON only.
func annotations(cmd *cobra.Command) io.Writer {
	if j, err := cmd.Flags().GetBool("json"); err == nil && j {
		return cmd.ErrOrStderr()
	}

	return cmd.OutOrStdout()
}

// writeMarkdown writes a Markdown rendering to path (0644, atomically: a PR-comment step may
// read it while a retry rewrites it).
func writeMarkdown(path string, render func(io.Writer)) error {
	var b bytes.Buffer

	render(&b)

	if err := atomicfile.Write(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write Markdown plan %s: %w", path, err)
	}

	return nil
}
