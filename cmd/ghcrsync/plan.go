package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
)

type planArgs struct {
	config       string
	out          string
	json         bool
	detailedExit bool
	skipProof    bool
	expiresIn    time.Duration
}

func newPlan() *cobra.Command {
	var a planArgs

	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show which nodes a rotation would fence or update, and why the others are left alone",
		Long: `plan reads the configuration, decrypts and proves the credential, observes the cluster and
its nodes' Talos API, and prints one action per node. It never writes to the cluster, Talos or
the registry. --out saves the plan (no secrets, checksummed) for ghcrsync apply.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := openAs(cmd.Context(), workspace.CommandPlan, a.config, false)
			if err != nil {
				return err
			}
			defer ws.Close()

			p, err := ws.Plan(cmd.Context(), workspace.PlanOptions{SkipProof: a.skipProof, TTL: a.expiresIn, PreviousPlan: a.out})
			if err != nil {
				return err
			}

			if err := view.Plan(cmd.OutOrStdout(), view.FormatFor(a.json), p); err != nil {
				return err
			}

			if a.out != "" {
				cred, err := ws.Credential()
				if err != nil {
					return err
				}

				if err := plan.Save(a.out, p, cred.PlanKey()); err != nil {
					return fmt.Errorf("save plan to %s: %w", a.out, err)
				}

				if !a.json {
					view.PlanSaved(cmd.OutOrStdout(), a.out)
				}
			}

			if a.detailedExit && p.Changes() {
				return exitError{code: exitChanges}
			}

			return nil
		},
	}

	f := cmd.Flags()
	f.StringVar(&a.config, "config", defaultConfig(), "configuration file")
	f.StringVar(&a.out, "out", "", "save the plan to this file for ghcrsync apply")
	f.BoolVar(&a.json, "json", false, "print the plan as JSON")
	f.BoolVar(&a.detailedExit, "detailed-exitcode", false, "exit 0 when there are no changes, 2 when there are, 1 on error")
	f.BoolVar(&a.skipProof, "skip-proof", false, "do not prove the credential against the registry (offline use; shown in the plan)")
	f.DurationVar(&a.expiresIn, "expires-in", time.Hour, "how long the saved plan stays valid")

	return cmd
}

func newShow() *cobra.Command {
	var asJSON bool

	cmd := &cobra.Command{
		Use:   "show PLANFILE",
		Short: "Render a saved plan",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := plan.Load(args[0])
			if err != nil {
				return err
			}

			return view.Plan(cmd.OutOrStdout(), view.FormatFor(asJSON), p)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")

	return cmd
}
