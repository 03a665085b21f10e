package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/operation"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

func newFences() *cobra.Command {
	var (
		o      operation.FencesOptions
		asJSON bool
	)

	cmd := &cobra.Command{
		Use:   "fences",
		Short: "List the fences ghcrsync holds, with liveness evidence and how to release them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := operation.Fences(cmd.Context(), o)
			if err != nil {
				return err
			}

			if asJSON {
				return view.FencesJSONTo(cmd.OutOrStdout(), rep)
			}

			view.FencesHuman(cmd.OutOrStdout(), rep)

			return nil
		},
	}

	cmd.Flags().StringVar(&o.ConfigPath, "config", defaultConfig(), "configuration file")
	cmd.Flags().StringVar(&o.Holder, "holder", "", "judge as if releasing this holder id")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the fences as JSON")

	return cmd
}

func newRelease() *cobra.Command {
	var o operation.ReleaseOptions

	cmd := &cobra.Command{
		Use:   "release",
		Short: "Undo the fences of a run that is over (node fences, then the Lease)",
		Long: `release undoes the fences a run left behind: it removes ghcrsync's annotations and its
scale-down guard, uncordons a node only if it was not cordoned before the claim, and releases the
Lease last — each write a compare-and-swap on what it read. It refuses while the owning run is
provably alive (live Lease, or a run status that is not completed); without a liveness source,
name the holder with --holder. --force releases a holder that may be alive.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()

			if o.Force {
				fmt.Fprintf(cmd.ErrOrStderr(), "Warning: --force releases fences of %s even if its run is alive; that run may still cordon, drain, "+
					"reconfigure or reboot nodes, and nothing will stop it.\n", o.Holder)
			}

			res, err := operation.Release(cmd.Context(), o)
			if err != nil {
				return err
			}

			view.ReleaseHuman(cmd.OutOrStdout(), res.Report, res.Outcomes, o.DryRun)

			if res.Failed() > 0 {
				return exitError{code: 1}
			}

			return nil
		},
	}

	f := cmd.Flags()
	f.StringVar(&o.ConfigPath, "config", defaultConfig(), "configuration file")
	f.StringVar(&o.Node, "node", "", "release only this node's fence")
	f.StringVar(&o.Holder, "holder", "", "the holder id whose fences to release (see `ghcrsync fences`)")
	f.BoolVar(&o.Force, "force", false, "release even if the holder's run may be alive (needs --holder)")
	f.BoolVar(&o.DryRun, "dry-run", false, "print what would be undone, and change nothing")

	return cmd
}

func newState() *cobra.Command {
	var o operation.FencesOptions

	cmd := &cobra.Command{Use: "state", Short: "Inspect and manage ghcrsync's state"}
	cmd.PersistentFlags().StringVar(&o.ConfigPath, "config", defaultConfig(), "configuration file")

	list := &cobra.Command{
		Use: "list", Short: "List the state's records", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, st, err := operation.StatePull(o)
			if err != nil {
				return err
			}

			backend, _ := operation.StoreDescription(o)
			view.StateList(cmd.OutOrStdout(), st, backend)

			return nil
		},
	}

	show := &cobra.Command{
		Use: "show NODE", Short: "Show one node's record", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, st, err := operation.StatePull(o)
			if err != nil {
				return err
			}

			r := st.Record(args[0])
			if r == nil {
				return fmt.Errorf("the state has no record of %s (see `ghcrsync state list`)", args[0])
			}

			b, _ := json.MarshalIndent(r, "", "  ")
			fmt.Fprintln(cmd.OutOrStdout(), string(b))

			return nil
		},
	}

	rm := &cobra.Command{
		Use: "rm NODE", Short: "Forget a node's record without touching the cluster", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := operation.StateRemove(o, args[0]); err != nil {
				return err
			}

			fmt.Fprintf(cmd.OutOrStdout(), "Removed the record of %s from the state. The cluster was not touched: "+
				"if the node still carries a ghcrsync fence, `ghcrsync fences` still shows it.\n", args[0])

			return nil
		},
	}

	pull := &cobra.Command{
		Use: "pull", Short: "Print the state as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, _, err := operation.StatePull(o)
			if err != nil {
				return err
			}

			_, err = cmd.OutOrStdout().Write(b)

			return err
		},
	}

	var force bool

	push := &cobra.Command{
		Use: "push FILE", Short: "Write a state file into the configured backend (e.g. local → kubernetes)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(args[0]); err != nil {
				return errors.New("push needs an existing state file: " + err.Error())
			}

			st, err := operation.StatePush(o, args[0], force)
			if err != nil {
				return err
			}

			backend, _ := operation.StoreDescription(o)
			fmt.Fprintf(cmd.OutOrStdout(), "Pushed state lineage %s (now serial %d) to %s.\n", st.Lineage, st.Serial, backend)

			return nil
		},
	}
	push.Flags().BoolVar(&force, "force", false, "replace a backend state of another lineage")

	cmd.AddCommand(list, show, rm, pull, push)

	return cmd
}
