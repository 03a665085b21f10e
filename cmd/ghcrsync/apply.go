package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/operation"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
)

// testHooks lets this package's tests act at exact points of a run; nil in production.
var testHooks apply.Hooks

func newApply() *cobra.Command {
	var (
		cfgPath     string
		autoApprove bool
		runRef      string
		logLevel    string
	)

	cmd := &cobra.Command{
		Use:   "apply [PLANFILE]",
		Short: "Execute a saved plan (or plan and apply with --auto-approve)",
		Long: `apply executes a plan saved by ghcrsync plan --out. It refuses a plan that expired, or that was
made from another configuration, credential revision or state, before it writes anything. It
runs under the configured Lease and writes the state before every mutation.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var planPath string

			switch {
			case len(args) == 1:
				planPath = args[0]
			case !autoApprove:
				return errors.New("apply needs a saved plan (ghcrsync plan --out FILE), or --auto-approve to plan and apply in one go")
			}

			log := hclog.New(&hclog.LoggerOptions{
				Name: "ghcrsync", Level: hclog.LevelFromString(logLevel), Output: cmd.ErrOrStderr(), TimeFormat: "15:04:05",
			})

			res, err := operation.Apply(cmd.Context(), operation.ApplyOptions{
				ConfigPath: cfgPath, PlanPath: planPath, RunRef: runRef, Logger: log, Progress: cmd.ErrOrStderr(),
				Hooks: testHooks,
				OnPlan: func(p *plan.Plan) {
					if autoApprove && planPath == "" {
						view.PlanHuman(cmd.OutOrStdout(), p)
					}
				},
			})
			if err != nil {
				return err
			}

			if !res.Plan.Changes() {
				fmt.Fprintln(cmd.OutOrStdout(), "No changes. Nothing to apply.")

				return nil
			}

			view.ApplyHuman(cmd.OutOrStdout(), res.Results, res.Secrets, res.Holder, res.ReleaseErr)

			if res.Failed() > 0 || res.ReleaseErr != nil {
				return exitError{code: 1}
			}

			return nil
		},
	}

	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", defaultConfig(), "configuration file")
	f.BoolVar(&autoApprove, "auto-approve", false, "plan, print the plan, and apply it in one go")
	f.StringVar(&runRef, "run-ref", "", "run reference in the Lease holder id (default: gh<GITHUB_RUN_ID>.<GITHUB_RUN_ATTEMPT>, else local)")
	f.StringVar(&logLevel, "log-level", "info", "progress log level (debug, info, warn, error)")

	return cmd
}

var _ = os.Stderr
