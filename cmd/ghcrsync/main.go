// Command ghcrsync rotates a GHCR pull credential across a Talos Linux Kubernetes cluster
// without leaving the cluster or the delivery pipeline wedged (see README.md). This package only
// parses flags, calls the packages that do the work, and renders through internal/view.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	// The TLS roots a machine without any uses (the shipped image has no base, and so no
	// /etc/ssl): Mozilla's, compiled in. A machine's own roots, where it has them, win.
	_ "golang.org/x/crypto/x509roots/fallback"
	// And the time zones run.window names, which the image has no /usr/share/zoneinfo for.
	_ "time/tzdata"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code: 128 + the signal's number
// (130 SIGINT, 143 SIGTERM) when a signal cancelled it.
func run(args []string, stdout, stderr io.Writer) int {
	// Every byte ghcrsync prints goes through the views' guard (no control characters, no line
	// a CI runner would read as a workflow command).
	guardOut := view.Guard
	if len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd) {
		guardOut = view.GuardCompletion // the completion protocol's ":4" directive line passes
	}

	stdout, stderr = guardOut(stdout), view.Guard(stderr)
	routeLibraryOutput(stderr)

	defer startProfile(stderr)()
	defer measureResources(stderr)()

	ctx, signalled, stop := catchSignals(stderr)
	defer stop()

	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)

	cmd, err := root.ExecuteContextC(ctx)

	return finish(cmd, withUsageHint(cmd, err), signalled(), stderr)
}

// finish says a command's error (on stderr, and as a GitHub annotation under Actions) and
// returns its exit status: 128 + the signal that cancelled it, or the exit-code table's.
func finish(cmd *cobra.Command, err error, signal int, stderr io.Writer) int {
	var ee exitError

	switch {
	case signal != 0:
		if err != nil && !errors.As(err, &ee) && !errors.Is(err, context.Canceled) {
			view.Error(stderr, err)
		}

		return 128 + signal
	case errors.As(err, &ee):
		return ee.code
	case err != nil:
		view.Error(stderr, err)

		if cmd == nil {
			break
		}

		if s, _ := streams(cmd); s.GitHub {
			view.Annotate(s.Annotations(), view.AnnotateError, cmd.CommandPath(), firstLine(err.Error()))
		}
	}

	return exitCode(err)
}

// withUsageHint adds where to read the usage to cobra's own argument errors.
func withUsageHint(cmd *cobra.Command, err error) error {
	if err == nil || cmd == nil {
		return err
	}

	for _, p := range []string{"accepts ", "requires ", "unknown command ", "invalid argument "} {
		if strings.HasPrefix(err.Error(), p) {
			return fmt.Errorf("%w: see `%s --help`", err, cmd.CommandPath())
		}
	}

	return err
}

// catchSignals cancels the returned context at the first SIGINT or SIGTERM (a CI job being
// cancelled: the command winds down to a safe point and says what is held), and exits at once
// at a second one (the state is written before every mutation, so it stays true).
func catchSignals(stderr io.Writer) (ctx context.Context, signalled func() int, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)

	var got atomic.Int32

	done := make(chan struct{})

	go func() {
		for {
			select {
			case s := <-ch:
				n := int32(s.(syscall.Signal))
				if got.Swap(n) != 0 {
					view.SecondSignal(stderr)
					os.Exit(128 + int(n))
				}

				view.Signalled(stderr, s.String())
				cancel()
			case <-done:
				return
			}
		}
	}()

	return ctx, func() int { return int(got.Load()) }, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ghcrsync",
		Short:         "Rotate a GHCR pull credential across a Talos Linux Kubernetes cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildVersion(),
	}

	root.SetVersionTemplate("ghcrsync {{.Version}}\n")
	pf := root.PersistentFlags()
	pf.String("kubeconfig", "", "kubeconfig file (overrides cluster.kubeconfig)")
	pf.String("context", "", "kubeconfig context (overrides cluster.context)")
	pf.String("talosconfig", "", "talosconfig file (overrides talos.talosconfig)")
	pf.String("talos-context", "", "talosconfig context (overrides talos.context)")
	pf.String("template-kubeconfig", "", "the template identity's kubeconfig: node templates are dry-run (plan) and written (apply) with it alone (overrides cluster.template_kubeconfig)")
	pf.Bool("no-color", false, "accepted for Terraform-style scripts: ghcrsync never colours its output")
	root.PersistentFlags().String("output", outputAuto,
		"GitHub Actions output (annotations, step summary): auto (when GITHUB_ACTIONS=true), github or plain")

	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w: see `%s --help`", err, c.CommandPath())
	})

	root.AddCommand(newPlan(), newShow(), newApply(), newFences(), newRelease(), newDestroy(), newState(), newRBAC(), newValidate(), newFmt(), newVersion(), newNodeKeyring(), newAdmission())

	return root
}

func newVersion() *cobra.Command {
	var asJSON bool

	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version (--json: with the Go version and the plan and state formats it reads)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return view.NewVersion(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr(), JSON: asJSON}).Version(view.VersionInfo{
				Version: buildVersion(), GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
				PlanFormat: plan.FormatVersion, StateFormat: state.FormatVersion,
			})
		},
	}

	cmd.Flags().BoolVar(&asJSON, "json", false, "print the version as JSON")

	return cmd
}

// defaultConfig is --config's default: $GHCRSYNC_CONFIG or ./ghcrsync.hcl.
func defaultConfig() string {
	if p := os.Getenv("GHCRSYNC_CONFIG"); p != "" {
		return p
	}

	return "ghcrsync.hcl"
}

// open opens the workspace of --config, locked when the command writes the state.
func open(cmd *cobra.Command, cfgPath string, lock bool) (*workspace.Workspace, error) {
	return workspace.Open(workspace.Options{ConfigPath: cfgPath, Lock: lock, Overrides: overrides(cmd)})
}

// openAs opens the workspace for a command class, checking its permissions first (before the
// state is read).
func openAs(cmd *cobra.Command, class, cfgPath string, lock bool) (*workspace.Workspace, error) {
	return workspace.Open(workspace.Options{ConfigPath: cfgPath, Lock: lock, Preflight: class, Context: cmd.Context(), Overrides: overrides(cmd)})
}

// openRepair opens the workspace of a command that repairs a wedge (fences, release): it goes on
// with an unreadable state — corrupt, or of another format — from the cluster's own records (the
// nodes' annotations, the Lease), saying so, and writes no state over it.
func openRepair(cmd *cobra.Command, class, cfgPath string, lock bool) (*workspace.Workspace, error) {
	return workspace.Open(workspace.Options{ConfigPath: cfgPath, Lock: lock, Preflight: class, Context: cmd.Context(), Overrides: overrides(cmd),
		UnreadableState: func(err error, _ *state.UnreadableError) error {
			view.Warning(cmd.ErrOrStderr(), fmt.Sprintf("the state cannot be read (%v): fences are read from the cluster's "+
				"annotations and the Lease, and the state is left as it is", err))

			return nil
		}})
}

// overrides are the global connection flags, which win over the configuration file.
func overrides(cmd *cobra.Command) config.Overrides {
	get := func(name string) string {
		v, _ := cmd.Flags().GetString(name)

		return v
	}

	return config.Overrides{
		Kubeconfig: get("kubeconfig"), Context: get("context"), Talosconfig: get("talosconfig"), TalosContext: get("talos-context"),
		TemplateKubeconfig: get("template-kubeconfig"),
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}

	return s
}
