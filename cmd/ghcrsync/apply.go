package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/planning"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
)

// testHooks lets this package's tests act at exact points of a run; nil in production.
var testHooks apply.Hooks

type applyArgs struct {
	config           string
	autoApprove      bool
	allowPending     bool
	allowUnreachable bool
	within           time.Duration
	runRef           string
	logLevel         string
	logFormat        string
	json             bool
	verbose          bool
	metricsFile      string
	metricsPush      string
}

func newApply() *cobra.Command {
	var a applyArgs

	cmd := &cobra.Command{
		Use:   "apply [PLANFILE]",
		Short: "Execute a saved plan (or plan and apply with --auto-approve)",
		Long: `apply executes a plan saved by ghcrsync plan --out. It refuses a plan that expired, or that was
made from another configuration, credential revision or state, before it writes anything. It
runs under the configured Lease and writes the state before every mutation.`,
		Example: `  ghcrsync apply plan.out                 # execute a reviewed plan
  ghcrsync apply --auto-approve           # plan and apply in one go
  ghcrsync apply --json plan.out | jq .   # each step as a JSON line, then the outcome`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.run(cmd, args) },
	}

	f := cmd.Flags()
	f.StringVar(&a.config, "config", defaultConfig(), "configuration file")
	f.BoolVar(&a.autoApprove, "auto-approve", false, "plan, print the plan, and apply it in one go")
	f.BoolVar(&a.allowPending, "allow-pending", false, "with --auto-approve: as plan --allow-pending")
	f.BoolVar(&a.allowUnreachable, "allow-unreachable", false, "with --auto-approve: as plan --allow-unreachable")
	f.DurationVar(&a.within, "within", 0, "the run's time budget (default: run.budget): a node whose estimate does not fit in what is left is not started; "+
		"the run then stops at a safe point and exits 6 (progressed), and the next run continues")
	f.StringVar(&a.runRef, "run-ref", "", "run reference in the Lease holder id (default: gh<GITHUB_RUN_ID>.<GITHUB_RUN_ATTEMPT>, else local)")
	f.StringVar(&a.logLevel, "log-level", "info", "progress log level: trace, debug, info, warn or error")
	f.StringVar(&a.logFormat, "log-format", "text", "progress log format: text or json (one object per line)")
	f.BoolVar(&a.verbose, "verbose", false, "also print where each node's seconds went (one line per node) and the requests the run made, on stderr")
	f.StringVar(&a.metricsFile, "metrics-file", "", "write the run's Prometheus metrics to FILE (the node exporter's textfile collector; docs/metrics.md)")
	f.StringVar(&a.metricsPush, "metrics-push", "", "push the run's Prometheus metrics to the Pushgateway at URL (docs/metrics.md)")
	f.BoolVar(&a.json, "json", false, "print JSON Lines: each step as it happens (type \"event\"), then the outcome (type \"summary\")")

	return cmd
}

// newLogger is the progress log on w: level and format checked (a typo is an error, never a
// silent default), timestamps with date and zone.
func newLogger(w io.Writer, level, format string) (hclog.Logger, error) {
	lvl := hclog.LevelFromString(level)
	if lvl == hclog.NoLevel || strings.EqualFold(level, "off") {
		return nil, fmt.Errorf("unknown --log-level %q: use trace, debug, info, warn or error", level)
	}

	if format != "text" && format != "json" {
		return nil, fmt.Errorf("unknown --log-format %q: use text or json", format)
	}

	if format == "json" { // valid JSON through the stream's guard, whatever a field holds
		w = view.JSONLog(w)
	}

	return hclog.New(&hclog.LoggerOptions{
		Name: "ghcrsync", Level: lvl, Output: w, JSONFormat: format == "json", TimeFormat: "2006-01-02T15:04:05.000Z07:00",
	}), nil
}

// applyPlan loads the saved plan, or (--auto-approve) plans now and prints the plan first.
func applyPlan(cmd *cobra.Command, ws *workspace.Workspace, v *view.ApplyView, path string, a applyArgs) (*plan.Plan, error) {
	if path != "" {
		return plan.Load(path)
	}

	p, err := ws.Planner().Plan(cmd.Context(), planning.Options{AllowPending: a.allowPending, Within: a.within, AllowUnreachable: a.allowUnreachable})
	if err != nil {
		return nil, err
	}

	v.Planned(p)

	return p, nil
}

// planPath is the saved plan args name; "" with --auto-approve (plan and apply in one go).
func (a applyArgs) planPath(args []string) (string, error) {
	switch {
	case len(args) == 1:
		return args[0], nil
	case a.autoApprove:
		return "", nil
	}

	return "", errors.New("apply needs a saved plan (ghcrsync plan --out FILE), or --auto-approve to plan and apply in one go")
}

// run executes the saved plan (or, with --auto-approve, a fresh one) and exits 0 only when the
// old credential is safe to revoke.
func (a applyArgs) run(cmd *cobra.Command, args []string) (err error) {
	var res *apply.Result
	var cfg *config.Config // the workspace's, once opened

	start := time.Now()
	defer func() {
		a.writeMetrics(cmd.Context(), func(what string, werr error) { view.Warning(cmd.ErrOrStderr(), what+": "+werr.Error()) }, cfg, res, err, start)
	}()

	planPath, err := a.planPath(args)
	if err != nil {
		return err
	}

	logger, err := newLogger(cmd.ErrOrStderr(), a.logLevel, a.logFormat)
	if err != nil {
		return err
	}

	s, err := streams(cmd)
	if err != nil {
		return err
	}

	v := view.NewApply(s)

	// What apply reads is checked before the state is read; its writes once the plan stands.
	ws, err := workspace.Open(workspace.Options{ConfigPath: a.config, Lock: true, Preflight: workspace.CommandApply, PreflightReads: true,
		Context: cmd.Context(), Overrides: overrides(cmd)})
	if err != nil {
		return err
	}
	defer ws.Close()

	cfg = ws.Config

	p, err := applyPlan(cmd, ws, v, planPath, a)
	if err != nil {
		return err
	}

	// --json: JSON Lines, each step as it happens (Events), then the summary.
	o := apply.Options{PlanPath: planPath, RunRef: a.runRef, Progress: v.Progress(), Observe: v.Events(), Hooks: testHooks, Logger: logger, Within: a.within}

	in, err := ws.Apply()
	if err != nil {
		return err
	}

	res, err = apply.Run(cmd.Context(), in, p, o)
	if err != nil {
		return err
	}

	if err := v.Result(res, ws.Requests); err != nil {
		return err
	}

	return applyStatus(res)
}
