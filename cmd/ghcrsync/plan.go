package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/planning"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
)

type planArgs struct {
	config       string
	out          string
	markdown     string
	verbose      bool
	json         bool
	detailedExit bool
	skipProof    bool
	allowPending bool
	// allowUnreachable plans when most nodes' Talos APIs could not be read.
	allowUnreachable bool
	strict           bool
	expiresIn        time.Duration
	within           time.Duration
}

func newPlan() *cobra.Command {
	var a planArgs

	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show which nodes a rotation would fence or update, and why the others are left alone",
		Long: `plan reads the configuration, decrypts and proves the credential, observes the cluster and
its nodes' Talos API, and prints one action per node. It never writes to the cluster, Talos or
the registry. --out saves the plan (no secrets, checksummed) for ghcrsync apply.`,
		Example: `  ghcrsync plan                                   # read-only: what a rotation would do
  ghcrsync plan --out plan.out --markdown plan.md # save it for apply, and for a PR comment
  ghcrsync plan --detailed-exitcode               # exit 2 when there are changes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}

	f := cmd.Flags()
	f.StringVar(&a.config, "config", defaultConfig(), "configuration file")
	f.StringVar(&a.out, "out", "", "save the plan to this file for ghcrsync apply")
	f.BoolVar(&a.json, "json", false, "print the plan as JSON")
	f.StringVar(&a.markdown, "markdown", "", "also write the plan as Markdown (a pull-request comment) to this file")
	f.BoolVar(&a.verbose, "verbose", false, "also print the requests the plan made (Kubernetes by verb, Talos by method)")
	f.BoolVar(&a.detailedExit, "detailed-exitcode", false, "exit 0 when there are no changes and nothing uses the old credential, 2 otherwise, 1 on error")
	f.BoolVar(&a.strict, "strict", false, "refuse (exit 1, no plan saved) when a fenced node's drain would be held (a PodDisruptionBudget allowing no disruption, a pod with no controller) or the API server refuses a dry run of a write")
	f.BoolVar(&a.skipProof, "skip-proof", false, "do not prove the credential against the registry (offline use; shown in the plan)")
	f.BoolVar(&a.allowPending, "allow-pending", false, "let evicted pods wait Pending for a rotated node rather than land on one that cannot pull or is drained later")
	f.BoolVar(&a.allowUnreachable, "allow-unreachable", false, "plan even when more than half of the nodes' Talos APIs cannot be read (they are left alone); by default that is an error")
	f.DurationVar(&a.expiresIn, "expires-in", time.Hour, "how long the saved plan stays valid")
	f.DurationVar(&a.within, "within", 0, "the run's time budget the estimate compares with (default: run.budget)")

	return cmd
}

func newShow() *cobra.Command {
	var asJSON, asMarkdown bool

	cmd := &cobra.Command{
		Use:   "show PLANFILE",
		Short: "Render a saved plan",
		Example: `  ghcrsync show plan.out
  ghcrsync show --markdown plan.out > comment.md`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := plan.Load(args[0])
			if err != nil {
				return err
			}

			s, err := streams(cmd)
			if err != nil {
				return err
			}

			return view.NewShow(s).Plan(p, asMarkdown)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")
	cmd.Flags().BoolVar(&asMarkdown, "markdown", false, "print the plan as Markdown (a pull-request comment)")
	cmd.MarkFlagsMutuallyExclusive("json", "markdown")

	return cmd
}

// run plans, prints the plan, saves it (--out) and publishes it (--markdown, GitHub).
func (a planArgs) run(cmd *cobra.Command) error {
	s, err := streams(cmd)
	if err != nil {
		return err
	}

	v := view.NewPlan(s)

	ws, err := openAs(cmd, workspace.CommandPlan, a.config, false)
	if err != nil {
		return err
	}
	defer ws.Close()

	p, err := ws.Planner().Plan(cmd.Context(), planning.Options{SkipProof: a.skipProof, TTL: a.expiresIn, PreviousPlan: a.out, AllowPending: a.allowPending, Within: a.within,
		AllowUnreachable: a.allowUnreachable})
	if err != nil {
		return err
	}

	if err := v.Plan(p); err != nil {
		return err
	}

	if err := a.refuseStrict(p); err != nil {
		return err
	}

	if err := a.save(ws, v, p); err != nil {
		return err
	}

	if a.markdown != "" {
		if err := v.Markdown(a.markdown, p); err != nil {
			return err
		}
	}

	v.Published(p, ws.Requests)

	return planStatus(p, a.detailedExit)
}

// refuseStrict refuses (--strict) a plan whose drains would be held or whose writes the API
// server refused in a dry run.
func (a planArgs) refuseStrict(p *plan.Plan) error {
	if a.strict && p.DrainHolds > 0 {
		return fmt.Errorf("plan --strict: %d drain(s) would be held (the warnings above name each pod and what holds it); no plan was saved. "+
			"Make room (scale the budget's workload, move the pod), or plan without --strict", p.DrainHolds)
	}

	if a.strict && p.RefusedWrites() > 0 {
		return fmt.Errorf("plan --strict: the API server refused a dry run of %d write(s) apply would make (the warnings above name each and why); no plan was saved. "+
			"Fix the policy that refuses them, or plan without --strict", p.RefusedWrites())
	}

	return nil
}

// save saves the plan (--out), sealed with the credential's plan key.
func (a planArgs) save(ws *workspace.Workspace, v *view.PlanView, p *plan.Plan) error {
	if a.out == "" {
		return nil
	}

	cred, err := ws.Credential()
	if err != nil {
		return err
	}

	key, err := cred.PlanKey()
	if err != nil {
		return err
	}

	if err := plan.Save(a.out, p, key); err != nil {
		return fmt.Errorf("save plan to %s: %w", a.out, err)
	}

	v.Saved(a.out)

	return nil
}
