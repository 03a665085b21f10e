// Command ghcrsync rotates a GHCR pull credential across a Talos Linux Kubernetes cluster
// without leaving the cluster or the delivery pipeline wedged (see README.md).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ghcrsync",
		Short:         "Rotate a GHCR pull credential across a Talos Linux Kubernetes cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}

	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "ghcrsync", version)
		},
	})

	return root
}
