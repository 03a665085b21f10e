// Command ghcrsync rotates a GHCR pull credential across a Talos Linux Kubernetes cluster
// without leaving the cluster or the delivery pipeline wedged (see README.md).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/config"
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
		fmt.Fprintf(stderr, "Error: %v\n", err)

		var cfgErr *config.Error
		if errors.As(err, &cfgErr) {
			fmt.Fprintln(stderr, "\nFix the configuration and run the command again; nothing was contacted.")
		}

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
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "ghcrsync", version)
		},
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
