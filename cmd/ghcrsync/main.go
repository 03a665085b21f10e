// Command ghcrsync rotates a GHCR pull credential across a Talos Linux Kubernetes cluster
// without leaving the cluster or the delivery pipeline wedged (see README.md). This package only
// parses flags, calls the packages that do the work, and renders through internal/view.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries an exit code other than 1 (e.g. 2 for --detailed-exitcode).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)

	err := root.Execute()

	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}

	if err != nil {
		view.Error(stderr, err)

		return 1
	}

	return 0
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ghcrsync",
		Short:         "Rotate a GHCR pull credential across a Talos Linux Kubernetes cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}

	root.AddCommand(newPlan(), newShow(), newApply(), newFences(), newRelease(), newState(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { view.Version(cmd.OutOrStdout(), version) },
	})

	return root
}

// defaultConfig is --config's default: $GHCRSYNC_CONFIG or ./ghcrsync.hcl.
func defaultConfig() string {
	if p := os.Getenv("GHCRSYNC_CONFIG"); p != "" {
		return p
	}

	return "ghcrsync.hcl"
}

// open opens the workspace of --config, locked when the command writes the state.
func open(cfgPath string, lock bool) (*workspace.Workspace, error) {
	return workspace.Open(workspace.Options{ConfigPath: cfgPath, Lock: lock})
}
