package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
)

func newFences() *cobra.Command {
	var (
		cfgPath  string
		o        fence.InventoryOptions
		asJSON   bool
		exitCode bool
	)

	cmd := &cobra.Command{
		Use:   "fences",
		Short: "List the fences ghcrsync holds, with liveness evidence and how to release them",
		Example: `  ghcrsync fences
  ghcrsync fences --exit-code    # exit 2 while a fence is held (a post-deploy guard)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := openRepair(cmd, workspace.CommandFences, cfgPath, false)
			if err != nil {
				return err
			}
			defer ws.Close()

			rep, err := fence.Inventory(cmd.Context(), ws.Fences(), o)
			if err != nil {
				return err
			}

			s, err := streams(cmd)
			if err != nil {
				return err
			}

			if err := view.NewFences(s).Report(rep); err != nil {
				return err
			}

			return fencesStatus(rep, exitCode)
		},
	}

	cmd.Flags().StringVar(&cfgPath, "config", defaultConfig(), "configuration file")
	cmd.Flags().StringVar(&o.Holder, "holder", "", "judge as if releasing this holder id")
	_ = cmd.RegisterFlagCompletionFunc("holder", completeFromState("config", true))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the fences as JSON")
	cmd.Flags().BoolVar(&exitCode, "exit-code", false, "exit 2 when a fence is held (a post-deploy guard)")

	return cmd
}

// newDestroy is the old name of release, kept working for the scripts that call it but hidden
// and deprecated: to a Terraform user `destroy` tears down what was built, and release destroys
// nothing (it lifts ghcrsync's own fences).
func newDestroy() *cobra.Command {
	cmd := newRelease()
	cmd.Use, cmd.Hidden = "destroy", true
	cmd.Short = "Deprecated: call release (destroy destroys nothing; it lifts ghcrsync's own fences)"
	cmd.Example = strings.ReplaceAll(cmd.Example, "ghcrsync release", "ghcrsync destroy")

	release := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// On stderr: stdout may carry --json.
		s, err := streams(cmd)
		if err != nil {
			return err
		}

		view.NewRelease(s).Deprecated("ghcrsync destroy", "ghcrsync release",
			"it destroys nothing (it lifts ghcrsync's own fences), which is not what Terraform's destroy means")

		return release(cmd, args)
	}

	return cmd
}

// releaseArgs are release's flags.
type releaseArgs struct {
	cfgPath string
	o       fence.RecoveryOptions
	asJSON  bool
}

func newRelease() *cobra.Command {
	a := &releaseArgs{}

	cmd := &cobra.Command{
		Use:   "release",
		Short: "Undo the fences of a run that is over (node fences, then the Lease)",
		Long: `release undoes the fences a run left behind: it removes ghcrsync's annotations and its
scale-down guard, uncordons a node only if it was not cordoned before the claim, and releases the
Lease last — each write a compare-and-swap on what it read. A node whose Talos config was written
but whose runtime was never proved to pull with it stays cordoned (an unproven hold, listed by
ghcrsync fences): apply proves it and lifts the hold; --uncordon-unproven returns it to service
without a proof. It refuses while the owning run is
provably alive (live Lease, or a run status that is not completed); without a liveness source,
name the holder with --holder. --force releases a holder that may be alive.`,
		Example: `  ghcrsync release --dry-run          # what would be undone
  ghcrsync release                    # undo the fences of runs that are over
  ghcrsync release --node prod-worker-3
  ghcrsync release --holder HOLDER --force   # a run that may be alive (see ghcrsync fences)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}

	f := cmd.Flags()
	f.StringVar(&a.cfgPath, "config", defaultConfig(), "configuration file")
	f.StringVar(&a.o.Node, "node", "", "release only this node's fence")
	f.StringVar(&a.o.Holder, "holder", "", "the holder id whose fences to release (see ghcrsync fences)")
	f.BoolVar(&a.o.Force, "force", false, "release even if the holder's run may be alive (needs --holder)")
	f.BoolVar(&a.o.DryRun, "dry-run", false, "print what would be undone, and change nothing")
	f.BoolVar(&a.o.UncordonUnproven, "uncordon-unproven", false,
		"also return to service nodes whose Talos config was written but whose runtime was never proved to pull with it (by default they stay cordoned)")
	f.BoolVar(&a.asJSON, "json", false, "print the outcome as JSON")
	_ = cmd.RegisterFlagCompletionFunc("node", completeFromState("config", false))
	_ = cmd.RegisterFlagCompletionFunc("holder", completeFromState("config", true))

	return cmd
}

// run releases: the fences of runs that are over (or the named holder's, with --force).
func (a *releaseArgs) run(cmd *cobra.Command) error {
	s, err := streams(cmd)
	if err != nil {
		return err
	}

	v := view.NewRelease(s)
	o := a.o
	o.Progress = v.Progress()

	if o.Force {
		v.Forced(o.Holder)
	}

	class := workspace.CommandRelease
	if o.DryRun {
		class = workspace.CommandFences
	}

	ws, err := openRepair(cmd, class, a.cfgPath, !o.DryRun)
	if err != nil {
		return err
	}
	defer ws.Close()

	res, err := fence.Recover(cmd.Context(), ws.Fences(), o)
	if err != nil {
		return err
	}

	if err := v.Result(res); err != nil {
		return err
	}

	return releaseStatus(res)
}
