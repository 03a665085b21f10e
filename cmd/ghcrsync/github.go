package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/view"
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

// streams are the command's view streams: stdout and stderr, whether stdout carries JSON
// (--json), GitHub output (--output) and --verbose.
func streams(cmd *cobra.Command) (view.Streams, error) {
	gh, err := githubOutput(cmd)
	asJSON, _ := cmd.Flags().GetBool("json")
	verbose, _ := cmd.Flags().GetBool("verbose")

	return view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr(), JSON: asJSON, GitHub: gh, Verbose: verbose}, err
}
