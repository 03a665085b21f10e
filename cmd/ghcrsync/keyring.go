package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// terminationLog is where a container's message to its kubelet goes (the pod's
// terminationMessagePath, the Kubernetes default).
const terminationLog = "/dev/termination-log"

// newNodeKeyring is the command ghcrsync's keyring writer pod runs on a node (internal/keyring):
// not for people, so hidden. It reads the credential from its environment (the writer's Secret),
// never from its arguments, and reports digests only — on stdout and as its termination message.
func newNodeKeyring() *cobra.Command {
	var (
		root, registry, nodePath string
		within                   time.Duration
	)

	cmd := &cobra.Command{
		Use:    "node-keyring write|read|remove|await --root DIR --registry HOST",
		Short:  "Write, read or remove the registry's entry of the kubelet's node keyring (run by ghcrsync's writer pod)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode := keyring.Mode(args[0])
			if mode != keyring.ModeWrite && mode != keyring.ModeRead && mode != keyring.ModeRemove && mode != keyring.ModeAwait {
				return fmt.Errorf("node-keyring %s: want write, read, remove or await", args[0])
			}

			if root == "" || registry == "" {
				return errors.New("node-keyring: --root and --registry are required")
			}

			if nodePath == "" {
				nodePath = root + "/" + keyring.File
			}

			var (
				r   keyring.Report
				err error
			)

			if mode == keyring.ModeAwait {
				r, err = keyring.Await(root, registry, nodePath, within, 250*time.Millisecond)
			} else {
				r, err = keyring.Do(root, mode, registry, []byte(os.Getenv(keyring.EntryEnv)), nodePath)
			}

			if err != nil {
				_ = os.WriteFile(terminationLog, []byte(err.Error()), 0o600)

				return err
			}

			_ = os.WriteFile(terminationLog, []byte(r.String()), 0o600)
			view.NewKeyring(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Report(r)

			return nil
		},
	}

	cmd.Flags().StringVar(&root, "root", "", "the kubelet's root directory, as mounted")
	cmd.Flags().StringVar(&registry, "registry", "", "the registry whose entry is written")
	cmd.Flags().StringVar(&nodePath, "node-path", "", "the keyring's path on the node, for the report")
	cmd.Flags().DurationVar(&within, "within", 5*time.Minute+30*time.Second, "await: how long to wait for the kubelet to read the keyring")

	return cmd
}
