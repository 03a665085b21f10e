// Command ghcrsync-sandbox runs the local sandbox: a real Kubernetes control plane with a
// simulated Talos fleet, cluster autoscaler, registry and CI API (see docs/sandbox.md).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ghcrsync-sandbox",
		Short:         "A local Talos/Kubernetes sandbox for ghcrsync",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newUp(), newDown(), newCtl(), newStatus())

	return root
}

func newUp() *cobra.Command {
	var (
		o        sandbox.Options
		detach   bool
		logLevel string
	)

	cmd := &cobra.Command{
		Use:   "up --dir DIR",
		Short: "Start the sandbox and run it in the foreground until SIGINT/SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Dir == "" {
				return errors.New("--dir is required")
			}

			if o.KeyringWriter != "" {
				abs, err := filepath.Abs(o.KeyringWriter)
				if err != nil {
					return err
				}

				o.KeyringWriter = abs
			}

			// A fleet asked for no autoscaled machines gets none, unless a scale rate is asked for too.
			if o.Autoscaled == 0 && !cmd.Flags().Changed("autoscaler-scale-rate") {
				o.AutoscalerScaleRate = 0
			}

			if detach {
				return upDetached(cmd, o.Dir)
			}

			return upForeground(cmd, o, logLevel)
		},
	}

	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "", "directory for the sandbox's files (kubeconfig, talosconfig, env, ...)")
	f.IntVar(&o.ControlPlanes, "control-planes", 3, "control-plane machines")
	f.IntVar(&o.Workers, "workers", 3, "static worker machines")
	f.IntVar(&o.Autoscaled, "autoscaled", 2, "autoscaler-managed worker machines")
	f.Int64Var(&o.Seed, "seed", 1, "seed for names and autoscaler decisions")
	f.DurationVar(&o.Heartbeat, "heartbeat", 10*time.Second, "kubelet status heartbeat interval")
	f.Var(&rebootRange{lo: &o.Reboot, hi: &o.RebootMax}, "reboot", "how long a machine reboot takes: a duration, or a range like 20s..40s (each reboot draws, seeded)")
	f.DurationVar(&o.AutoscalerInterval, "autoscaler-interval", 10*time.Second, "cluster-autoscaler loop interval")
	f.Float64Var(&o.AutoscalerScaleRate, "autoscaler-scale-rate", 0.02, "chance per autoscaler loop of a scale-down and of a scale-up (0: only via ctl; default 0 with --autoscaled 0)")
	f.BoolVar(&o.AutoscalerPaused, "autoscaler-paused", false, "start with the autoscaler paused")
	f.StringVar(&o.Flux, "flux", sandbox.FluxSim, "sim: Flux's kinds, nothing reading them; real: Flux's source-controller and kustomize-controller "+sandbox.FluxVersion+
		" (build them with: make flux)")
	f.StringVar(&o.Autoscaler, "autoscaler", sandbox.AutoscalerSim, "sim: the seeded simulation; real: the real cluster-autoscaler "+sandbox.ClusterAutoscalerVersion+
		" against a fake Hetzner Cloud API (build it with: make cluster-autoscaler)")
	f.StringVar(&o.TalosVersion, "talos-version", "1.13", "Talos version of the machines: 1.13 (registry auth needs a reboot) or 1.14 (live); a list like 1.13,1.14 mixes them, machine by machine")
	f.BoolVar(&o.VIP, "vip", false, "serve the API endpoint on a VIP that fails over across control planes")
	f.BoolVar(&o.InSync, "in-sync", false, "start the fleet on the secret file's credential (nothing to rotate)")
	f.BoolVar(&o.NoWorkloads, "no-workloads", false, "do not create the demo DaemonSet and Deployment")
	f.IntVar(&o.RealNodes, "real-nodes", 0, "static workers that run a real containerd and kubelet (as root; build them with: make runtime kubelet)")
	f.DurationVar(&o.TalosLatency, "talos-latency", 0, "round-trip added between clients and the Talos API endpoint (a WAN between a CI runner and the cluster)")
	f.DurationVar(&o.APILatency, "api-latency", 0, "round-trip added between clients and the Kubernetes API endpoint")
	f.StringVar(&o.KeyringWriter, "keyring-writer", "", "a ghcrsync binary to publish as the operator's image of ghcrsync and configure as the kubelet keyring's writer (nodes.kubelet_keyring)")
	f.DurationVar(&o.KeyringCache, "keyring-cache", 5*time.Minute, "how long a simulated kubelet keeps what it read of its keyring (the real kubelet's: 5m)")
	f.BoolVar(&detach, "detach", false, "start in the background and return once ready (stop it with: ghcrsync-sandbox down)")
	f.StringVar(&logLevel, "log-level", "info", "log level (trace, debug, info, warn, error)")

	return cmd
}

func upForeground(cmd *cobra.Command, o sandbox.Options, logLevel string) error {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}

	logFile, err := os.OpenFile(filepath.Join(o.Dir, "sandbox.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()

	o.Logger = hclog.New(&hclog.LoggerOptions{
		Name: "sandbox", Level: hclog.LevelFromString(logLevel), Output: io.MultiWriter(cmd.ErrOrStderr(), logFile),
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	sb, err := sandbox.Start(ctx, o)
	if err != nil {
		return err
	}
	defer sb.Stop()

	printFleet(cmd.OutOrStdout(), sb.FleetInfo())
	fmt.Fprintf(cmd.OutOrStdout(), "\nSandbox ready. Use it with: source %s\n", sb.Path(sandbox.EnvFile))

	<-ctx.Done()
	fmt.Fprintln(cmd.ErrOrStderr(), "stopping sandbox")

	return nil
}

// upDetached re-runs `up` without --detach in its own session and waits until it is ready.
func upDetached(cmd *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	_ = os.Remove(filepath.Join(dir, sandbox.ReadyFile))

	child, exited, err := startDetached(dir)
	if err != nil {
		return err
	}

	if err := awaitReady(dir, child, exited); err != nil {
		return err
	}

	pid := child.Process.Pid
	_ = child.Process.Release()

	var fleet []sandbox.MachineInfo
	if err := call(dir, "fleet", sandbox.Request{}, &fleet); err != nil {
		return err
	}

	printFleet(cmd.OutOrStdout(), fleet)
	fmt.Fprintf(cmd.OutOrStdout(), "\nSandbox ready (pid %d). Use it with: source %s\nStop it with: ghcrsync-sandbox down --dir %s\n",
		pid, filepath.Join(dir, sandbox.EnvFile), dir)

	return nil
}

// startDetached starts this command again without --detach, in its own session, its output
// in DIR/sandbox.out; exited has its exit.
func startDetached(dir string) (*exec.Cmd, <-chan error, error) {
	var args []string

	for _, a := range os.Args[1:] {
		if a != "--detach" && a != "--detach=true" {
			args = append(args, a)
		}
	}

	out, err := os.OpenFile(filepath.Join(dir, "sandbox.out"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer out.Close() // the child has its own descriptor

	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}

	child := exec.Command(exe, args...)
	child.Stdout, child.Stderr = out, out
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}

	if err := child.Start(); err != nil {
		return nil, nil, err
	}

	exited := make(chan error, 1)

	go func() { exited <- child.Wait() }()

	return child, exited, nil
}

// awaitReady waits for the sandbox's ready file, up to 5 minutes (then stops the child).
func awaitReady(dir string, child *exec.Cmd, exited <-chan error) error {
	deadline := time.After(5 * time.Minute)

	for {
		if _, err := os.Stat(filepath.Join(dir, sandbox.ReadyFile)); err == nil {
			return nil
		}

		select {
		case err := <-exited:
			return fmt.Errorf("sandbox exited before it was ready (%v); see %s", err, filepath.Join(dir, "sandbox.out"))
		case <-deadline:
			_ = child.Process.Signal(syscall.SIGTERM)

			return fmt.Errorf("sandbox not ready after 5m; see %s", filepath.Join(dir, "sandbox.out"))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func newDown() *cobra.Command {
	var dir string

	cmd := &cobra.Command{
		Use:   "down --dir DIR",
		Short: "Stop a sandbox started with --detach and wait until nothing of it runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, err := sandbox.ReadInfo(dir)
			if err != nil {
				return err
			}

			pids := append([]int{info.PID}, info.ControlPlanePIDs...)
			_ = syscall.Kill(info.PID, syscall.SIGTERM)

			deadline := time.Now().Add(60 * time.Second)
			for alive(pids) {
				if time.Now().After(deadline) {
					for _, p := range pids {
						_ = syscall.Kill(p, syscall.SIGKILL)
					}

					break
				}

				time.Sleep(100 * time.Millisecond)
			}

			if alive(pids) {
				return fmt.Errorf("sandbox processes %v still running after SIGKILL", pids)
			}

			_ = os.Remove(filepath.Join(dir, sandbox.InfoFile))
			fmt.Fprintln(cmd.OutOrStdout(), "sandbox stopped")

			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the sandbox's directory")
	_ = cmd.MarkFlagRequired("dir")

	return cmd
}

func alive(pids []int) bool {
	for _, p := range pids {
		if p <= 0 {
			continue
		}

		// A zombie is not alive; /proc tells.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err == nil && !strings.Contains(string(b), ") Z ") {
			return true
		}
	}

	return false
}

// rebootRange is --reboot: one duration, or "LO..HI".
type rebootRange struct{ lo, hi *time.Duration }

func (r *rebootRange) String() string {
	if r.lo == nil || *r.lo == 0 {
		return "5s"
	}

	if r.hi != nil && *r.hi > *r.lo {
		return r.lo.String() + ".." + r.hi.String()
	}

	return r.lo.String()
}

func (r *rebootRange) Set(s string) error {
	lo, hi, isRange := strings.Cut(s, "..")

	l, err := time.ParseDuration(lo)
	if err != nil || l <= 0 {
		return fmt.Errorf("%q is not a duration or a range LO..HI", s)
	}

	*r.lo, *r.hi = l, 0

	if isRange {
		h, err := time.ParseDuration(hi)
		if err != nil || h < l {
			return fmt.Errorf("%q: the range's end must be a duration not below its start", s)
		}

		*r.hi = h
	}

	return nil
}

func (r *rebootRange) Type() string { return "duration[..duration]" }

// ctlVerb is one verb of `ctl`: the arguments it takes, its help, and how they fill the admin
// API's request. The table is the verbs' one list: the help, the argument check and the request.
type ctlVerb struct {
	name, args, help string
	min, max         int
	fill             func(rest []string, req *sandbox.Request)
}

func onNode(rest []string, req *sandbox.Request)      { req.Node = rest[0] }
func forDuration(rest []string, req *sandbox.Request) { req.Duration = rest[0] }

// joinAfter is scale-up's optional provisioning time.
func joinAfter(rest []string, req *sandbox.Request) {
	if len(rest) > 0 {
		req.Duration = rest[0]
	}
}

var ctlVerbs = []ctlVerb{
	{"reboot", "NODE", "reboot a machine out of band (a third party: counted, not judged)", 1, 1, onNode},
	{"power-off", "NODE", "keep a machine down until powered on", 1, 1, onNode},
	{"power-on", "NODE", "power a machine on again", 1, 1, onNode},
	{"scale-down", "NODE", "the cluster autoscaler scales the node down (simulation only)", 1, 1, onNode},
	{"scale-up", "[JOIN_AFTER]", "the cluster autoscaler adds a node (simulation only); with a duration, its server is created now and joins after it", 0, 1, joinAfter},
	{"delete-node", "NODE", "the machine and its Node vanish", 1, 1, onNode},
	{"pause-autoscaler", "", "the autoscaler stops acting", 0, 0, nil},
	{"resume-autoscaler", "", "the autoscaler acts again", 0, 0, nil},
	{"revoke-credential", "USER", "the registry stops accepting USER", 1, 1, func(r []string, q *sandbox.Request) { q.User = r[0] }},
	{"deny-repository", "USER REPO", "USER logs in but may not pull REPO (org/name), as GHCR grants per package", 2, 2,
		func(r []string, q *sandbox.Request) { q.User, q.Repository = r[0], r[1] }},
	{"allow-repository", "USER REPO", "USER may pull REPO again", 2, 2, func(r []string, q *sandbox.Request) { q.User, q.Repository = r[0], r[1] }},
	{"hang-talos", "NODE", "the node's Talos API accepts calls and never answers", 1, 1, onNode},
	{"unhang-talos", "NODE", "the node's Talos API answers again", 1, 1, onNode},
	{"slow-talos", "NODE DURATION", "the node's Talos API answers each call DURATION late (0s: at once)", 2, 2,
		func(r []string, q *sandbox.Request) { q.Node, q.Duration = r[0], r[1] }},
	{"api-outage", "DURATION", "the Kubernetes API endpoint refuses connections for DURATION", 1, 1, forDuration},
	{"rotate-secret", "", "a fresh credential becomes the one secret.enc.yaml holds", 0, 0, nil},
	{"set-run-status", "ID ATTEMPT STATUS", "the CI API's run attempt status", 3, 3,
		func(r []string, q *sandbox.Request) { q.ID, q.Attempt, q.Status = r[0], r[1], r[2] }},
	{"etcd-alarm", "NODE NOSPACE|CORRUPT|none", "the control plane's etcd member raises an alarm (none: clears it)", 2, 2,
		func(r []string, q *sandbox.Request) { q.Node, q.Alarm = r[0], strings.TrimPrefix(r[1], "none") }},
	{"etcd-learner", "NODE", "its etcd member becomes a learner", 1, 1, onNode},
	{"etcd-voter", "NODE", "its etcd member becomes a voter again", 1, 1, onNode},
	{"move-address", "NODE [MACHINE]", "NODE's kubelet reports MACHINE's address as its InternalIP (none: its own)", 1, 2, moveAddress},
	{"report-ips", "NODE [IP,...|none]", "NODE's kubelet reports these InternalIPs (none: no InternalIP; no list: its own)", 1, 2, reportIPs},
	{"lose-answers", "DURATION", "the API endpoint carries out writes and cuts their answers, for DURATION", 1, 1, forDuration},
	{"lose-talos-answers", "NODE", "the machine's next Talos write is carried out and its answer lost", 1, 1, onNode},
	{"stall-pods", "NODE", "its container runtime hangs creating containers (ContainerCreating)", 1, 1, onNode},
	{"unstall-pods", "NODE", "its container runtime works again", 1, 1, onNode},
	{"kubelet-not-ready", "NODE", "its kubelet reports NotReady (the CNI never came up)", 1, 1, onNode},
	{"kubelet-ready", "NODE", "its kubelet reports Ready again", 1, 1, onNode},
	{"disruption", "SINCE", "the demo workloads' evictions and pull failures since SINCE (RFC 3339)", 1, 1,
		func(r []string, q *sandbox.Request) { q.Since = r[0] }},
	{"registry-flap", "DURATION [ANSWERS] [RETRY_AFTER]", "the registry answers every client, for DURATION, with one of ANSWERS (429,503,denied; default all) as ghcr.io in an incident", 1, 3,
		registryFlap},
	{"stats", "", `{"unsafe_writes", "interleaved_writes", "talos_writes", "reboots", "pulls", ...}`, 0, 0, nil},
	{"fleet", "", "the machines and their credential state", 0, 0, nil},
}

func registryFlap(rest []string, req *sandbox.Request) {
	req.Duration = rest[0]
	if len(rest) > 1 && rest[1] != "" {
		req.Answers = strings.Split(rest[1], ",")
	}

	if len(rest) > 2 {
		req.RetryAfter = rest[2]
	}
}

func moveAddress(rest []string, req *sandbox.Request) {
	req.Node = rest[0]
	if len(rest) == 2 && rest[1] != "none" {
		req.To = rest[1]
	}
}

func reportIPs(rest []string, req *sandbox.Request) {
	req.Node = rest[0]
	if len(rest) == 2 {
		req.IPs = strings.Split(rest[1], ",")
		if rest[1] == "none" {
			req.IPs = []string{}
		}
	}
}

// ctlHelp is the verbs' help, one line each.
func ctlHelp() string {
	var b strings.Builder

	b.WriteString("Verbs:")

	for _, v := range ctlVerbs {
		fmt.Fprintf(&b, "\n  %-40s %s", strings.TrimSpace(v.name+" "+v.args), v.help)
	}

	return b.String()
}

// request is the admin API's request for verb and its arguments, checked against the table.
func request(verb string, rest []string) (sandbox.Request, error) {
	var req sandbox.Request

	i := slices.IndexFunc(ctlVerbs, func(v ctlVerb) bool { return v.name == verb })
	if i < 0 {
		return req, fmt.Errorf("unknown verb %q; see `ghcrsync-sandbox ctl --help`", verb)
	}

	v := ctlVerbs[i]

	switch {
	case len(rest) >= v.min && len(rest) <= v.max:
	case v.min == v.max:
		return req, fmt.Errorf("%s takes %d argument(s): %s %s; see `ghcrsync-sandbox ctl --help`", verb, v.min, verb, v.args)
	default:
		return req, fmt.Errorf("%s takes %d to %d arguments: %s %s; see `ghcrsync-sandbox ctl --help`", verb, v.min, v.max, verb, v.args)
	}

	if v.fill != nil {
		v.fill(rest, &req)
	}

	return req, nil
}

func newCtl() *cobra.Command {
	var dir string

	cmd := &cobra.Command{
		Use:   "ctl --dir DIR VERB [ARGS]",
		Short: "Inject a fault or read counters: " + strings.Join(sandbox.Verbs, ", "),
		Long:  ctlHelp(),
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := request(args[0], args[1:])
			if err != nil {
				return err
			}

			var out json.RawMessage
			if err := call(dir, args[0], req, &out); err != nil {
				return err
			}

			var pretty bytes.Buffer
			_ = json.Indent(&pretty, out, "", "  ")
			fmt.Fprintln(cmd.OutOrStdout(), pretty.String())

			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the sandbox's directory")
	_ = cmd.MarkFlagRequired("dir")

	return cmd
}

func newStatus() *cobra.Command {
	var dir string

	cmd := &cobra.Command{
		Use:   "status --dir DIR",
		Short: "Print the fleet: nodes, roles, Talos versions, credential state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var fleet []sandbox.MachineInfo
			if err := call(dir, "fleet", sandbox.Request{}, &fleet); err != nil {
				return err
			}

			printFleet(cmd.OutOrStdout(), fleet)

			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the sandbox's directory")
	_ = cmd.MarkFlagRequired("dir")

	return cmd
}

func call(dir, verb string, req sandbox.Request, out any) error {
	info, err := sandbox.ReadInfo(dir)
	if err != nil {
		return err
	}

	body, _ := json.Marshal(req)

	resp, err := http.Post(info.Admin+"/v1/"+verb, "application/json", bytes.NewReader(body)) //nolint:noctx
	if err != nil {
		return fmt.Errorf("sandbox admin API %s: %w (is the sandbox running?)", info.Admin, err)
	}
	defer resp.Body.Close()

	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(data, &e)

		return fmt.Errorf("%s: %s", verb, e.Error)
	}

	return json.Unmarshal(data, out)
}

func printFleet(w io.Writer, fleet []sandbox.MachineInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tIP\tTALOS\tCONFIGURED\tEFFECTIVE\tSECRET FILE")

	for _, m := range fleet {
		role := m.Role
		if m.Autoscaled {
			role += " (autoscaled)"
		}

		if m.Endpoint {
			role += " (API endpoint)"
		}

		if m.Real {
			role += " (real kubelet, containerd)"
		}

		sync := "rotation due"
		if m.InSync {
			sync = "in sync"
		}

		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, role, m.IP, m.TalosVersion, m.Configured, m.Effective, sync)
	}

	_ = tw.Flush()
}
