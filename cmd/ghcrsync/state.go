package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/state"
)

func newState() *cobra.Command {
	var cfgPath string

	cmd := &cobra.Command{Use: "state", Short: "Inspect and manage ghcrsync's state", Example: `  ghcrsync state list --json
  ghcrsync state show prod-worker-3
  ghcrsync state pull > backup.json && ghcrsync state push backup.json`}
	cmd.PersistentFlags().StringVar(&cfgPath, "config", defaultConfig(), "configuration file")
	cmd.AddCommand(newStateList(&cfgPath), newStateShow(&cfgPath), newStateRm(&cfgPath), newStatePull(&cfgPath), newStatePush(&cfgPath))

	return cmd
}

func newStateList(cfgPath *string) *cobra.Command {
	var asJSON bool

	cmd := &cobra.Command{
		Use: "list", Short: "List the state's records", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := open(cmd, *cfgPath, false)
			if err != nil {
				return err
			}
			defer ws.Close()

			s, err := streams(cmd)
			if err != nil {
				return err
			}

			return view.NewState(s).List(ws.State, ws.Store.Describe())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the state as JSON")

	return cmd
}

func newStateShow(cfgPath *string) *cobra.Command {
	return &cobra.Command{
		Use: "show NODE", Short: "Show one node's record", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := open(cmd, *cfgPath, false)
			if err != nil {
				return err
			}
			defer ws.Close()

			r := ws.State.Record(args[0])
			if r == nil {
				return fmt.Errorf("the state has no record of %s (see `ghcrsync state list`)", args[0])
			}

			return view.NewState(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Record(r)
		},
	}
}

func newStateRm(cfgPath *string) *cobra.Command {
	return &cobra.Command{
		Use: "rm NODE", Short: "Forget a node's record without touching the cluster", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := open(cmd, *cfgPath, true)
			if err != nil {
				return err
			}
			defer ws.Close()

			if err := state.Remove(ws.Store, ws.State, args[0]); err != nil {
				return err
			}

			view.NewState(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Removed(args[0])

			return nil
		},
	}
}

func newStatePull(cfgPath *string) *cobra.Command {
	return &cobra.Command{
		Use: "pull", Short: "Print the state as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := open(cmd, *cfgPath, false)
			if err != nil {
				return err
			}
			defer ws.Close()

			return view.NewState(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Pulled(ws.State)
		},
	}
}

func newStatePush(cfgPath *string) *cobra.Command {
	var force bool

	cmd := &cobra.Command{
		Use: "push FILE", Short: "Write a state file into the configured backend (e.g. local → kubernetes)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v := view.NewState(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()})

			src, err := state.ReadLocal(args[0])
			if err != nil {
				return err
			}

			if src.Lineage == "" {
				return fmt.Errorf("%s holds no state (no lineage): push needs an existing state file", args[0])
			}

			// A corrupt state is what push repairs: it is replaced, not read.
			ws, err := workspace.Open(workspace.Options{ConfigPath: *cfgPath, Lock: true, Overrides: overrides(cmd),
				UnreadableState: func(err error, _ *state.UnreadableError) error {
					v.Warning(fmt.Sprintf("the state cannot be read (%v): it is replaced", err))

					return nil
				}})
			if err != nil {
				return err
			}
			defer ws.Close()

			if err := ws.PushOver(src, force); err != nil {
				return err
			}

			v.Pushed(src, ws.Store.Describe())

			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "replace a backend state of another lineage")

	return cmd
}
