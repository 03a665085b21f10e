package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// seedRun is one seed: a rotation under faults drawn from the seed, recovery, convergence,
// and the invariants.
type seedRun struct {
	c    *campaign
	sb   *sandbox.Sandbox
	kube kubernetes.Interface // the operator's and the checks' client (not through the endpoint)
	seed uint64

	dir, cfg      string
	backend       string
	leaseDuration time.Duration
	old, cred     sandbox.Credential
	before        sandbox.Stats

	mu       sync.Mutex
	rng      *rand.Rand
	heals    []func()
	injected []string // "name(what)@t" per fault
	kinds    []string // fault names, for the totals
	applies  []*proc  // every apply process of the seed, in start order
	second   map[*proc]bool
	cordoned map[string]bool // nodes an operator cordoned
	tainted  map[string]bool // nodes an operator tainted
	staged   map[string]bool // nodes an operator staged a config change on
	carried  map[string]bool // staged changes re-staged with the credential: must survive
	problems []string

	stages   []string // "stage 1.2s"
	kill     string   // how the first apply was stopped
	outcome  string
	converge int // applies it took to converge
	leases   *leaseLog

	// revokedFirst: the old credential was revoked before the first plan (a leak: an emergency
	// rotation); started is when the seed's rotation began (the availability witness's start).
	revokedFirst bool
	started      time.Time

	holds holds // the drains the first plan predicted a budget would hold, and what happened
}

func (r *seedRun) onHeal(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heals = append(r.heals, f)
}

func (r *seedRun) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

func (r *seedRun) addApply(p *proc, second bool) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.applies = append(r.applies, p)
	if second {
		r.second[p] = true
	}
}

func (r *seedRun) markCordoned(n string) { r.mu.Lock(); r.cordoned[n] = true; r.mu.Unlock() }
func (r *seedRun) markTainted(n string)  { r.mu.Lock(); r.tainted[n] = true; r.mu.Unlock() }
func (r *seedRun) markStaged(n string)   { r.mu.Lock(); r.staged[n] = true; r.mu.Unlock() }

func (r *seedRun) draw(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return r.rng.IntN(n)
}

// run plays the seed. Problems are collected, not fatal, so that a failing seed still cleans
// up and the campaign goes on.
func (r *seedRun) run(ctx context.Context) {
	if err := r.setup(ctx); err != nil {
		r.problem("setup: %v", err)

		return
	}

	r.leases = watchLease(ctx, r.kube)
	defer r.leases.stop()

	lap := r.stopwatch()
	first := r.chaos(ctx)
	lap("chaos")
	r.heal(ctx)
	r.checkSecondApplies(first)
	lap("heal")

	if r.recover(ctx) {
		lap("recover")

		if r.convergeAll(ctx) {
			lap("converge")
			r.checkInvariants(ctx)
			lap("checks")
		}
	}

	r.checkLeaseHistory()
	r.teardown(ctx)
}

// stopwatch returns a func that records the time since its last call under a stage name.
func (r *seedRun) stopwatch() func(string) {
	last := time.Now()

	return func(stage string) {
		r.mu.Lock()
		r.stages = append(r.stages, fmt.Sprintf("%s %.1fs", stage, time.Since(last).Seconds()))
		r.mu.Unlock()

		last = time.Now()
	}
}

// setup resets the fleet, makes a fresh credential the desired one and writes this seed's
// configuration (drawn from the seed: state backend, parallelism, autoscaler policy, budget).
func (r *seedRun) setup(ctx context.Context) error {
	if err := r.sb.Reset(ctx); err != nil {
		return err
	}

	r.old = r.sb.NewCredential()

	cred, err := r.sb.RotateSecret(fmt.Sprintf("seed%d", r.seed))
	if err != nil {
		return err
	}

	r.cred = cred
	r.before = r.sb.Fleet().Stats()

	r.dir = filepath.Join(r.c.dir, fmt.Sprintf("seed-%d", r.seed))
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return err
	}

	r.backend = map[bool]string{true: "kubernetes", false: "local"}[r.seed%2 == 0]
	r.leaseDuration = 6 * time.Second
	r.cfg = filepath.Join(r.dir, "ghcrsync.hcl")
	r.c.cli.setLogDir(r.dir)

	policy := []string{"deselect", "include"}[r.draw(2)]
	parallel := 1 + r.draw(3)
	budget := []int{1, 2, 10}[r.draw(3)]

	if err := r.writeConfig(policy, parallel, budget); err != nil {
		return err
	}

	if r.sb.RealAutoscaler() {
		// The pool may shrink to nothing: every unneeded, unprotected node is deleted after the
		// seed's unneeded time, whatever ghcrsync is doing with it.
		unneeded := time.Duration(6+r.draw(10)) * time.Second
		if err := r.sb.ConfigureRealAutoscaler(sandbox.RealAutoscalerFlags{MinSize: 0, UnneededTime: unneeded}); err != nil {
			return err
		}

		r.note("autoscaler", "real, min 0, unneeded after "+unneeded.String())
	}

	r.sb.ResumeAutoscaler()

	// One seed in four is a leak: the old credential is revoked before the first plan.
	r.started = time.Now()
	if r.seed%4 == 3 {
		r.revokedFirst = r.sb.Registry().RevokeCredential(r.old.Username)
		r.note("leak", "the old credential is revoked before the first plan")
	}

	return nil
}

// writeConfig is the sandbox's ghcrsync.hcl with absolute paths, short timeouts and this
// seed's choices.
func (r *seedRun) writeConfig(policy string, parallel, budget int) error {
	src, err := os.ReadFile(r.sb.Path(sandbox.ConfigFile))
	if err != nil {
		return err
	}

	f, diags := hclwrite.ParseConfig(src, "ghcrsync.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return diags
	}

	str := cty.StringVal

	for _, b := range f.Body().Blocks() {
		body := b.Body()

		switch b.Type() {
		case "cluster":
			body.SetAttributeValue("kubeconfig", str(r.sb.Path(sandbox.KubeconfigFile)))
			body.SetAttributeValue("timeout", str("5s"))
		case "talos":
			body.SetAttributeValue("talosconfig", str(r.sb.Path(sandbox.TalosconfigFile)))
			body.SetAttributeValue("timeout", str("3s"))
		case "credential":
			body.SetAttributeValue("sops_file", str(r.sb.Path(sandbox.SecretFile)))
		case "nodes":
			body.SetAttributeValue("autoscaler_candidates", str(policy))
			body.SetAttributeValue("worker_parallelism", cty.NumberIntVal(int64(parallel)))
			body.SetAttributeValue("max_failures", cty.NumberIntVal(int64(budget)))
			body.SetAttributeValue("drain_timeout", str("15s"))
			body.SetAttributeValue("ready_timeout", str("20s"))
			// A fenced node takes seconds here: the estimate's default at the sandbox's scale,
			// so a drawn budget fits some nodes and not others.
			body.SetAttributeValue("expected_node_time", str("4s"))
			body.SetAttributeValue("expected_live_time", str("1s"))
		case "lease":
			// The run's closing steps take a second or two here (run.reserve at the sandbox's scale).
			run := f.Body().AppendNewBlock("run", nil).Body()
			run.SetAttributeValue("reserve", str("3s"))

			body.SetAttributeValue("duration", str(r.leaseDuration.String()))
			body.SetAttributeValue("heartbeat", str("2s"))
		case "state":
			body.SetAttributeValue("backend", str(r.backend))

			if r.backend == "kubernetes" {
				body.RemoveAttribute("path")
				body.SetAttributeValue("namespace", str("flux-system"))
				body.SetAttributeValue("secret", str(r.stateSecret()))
			} else {
				body.SetAttributeValue("path", str(filepath.Join(r.dir, "ghcrsync.state.json")))
			}
		}
	}

	r.note("config", fmt.Sprintf("%s state, parallelism %d, candidates %s, budget %d", r.backend, parallel, policy, budget))

	return os.WriteFile(r.cfg, f.Bytes(), 0o600)
}

func (r *seedRun) stateSecret() string { return fmt.Sprintf("ghcrsync-state-seed%d", r.seed) }

func (r *seedRun) note(k, v string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.injected = append(r.injected, k+"="+v)
}

// chaos plans, starts apply, and while it runs injects the faults drawn from the seed and
// (maybe) stops it with a signal. It returns the first apply.
func (r *seedRun) chaos(ctx context.Context) *proc {
	planFile := filepath.Join(r.dir, "first.plan")

	r.beforePlan(ctx)

	pj, ok := r.planApplicable(planFile)
	if !ok {
		return nil
	}

	r.afterPlan(ctx, pj)

	faults := r.drawFaults()
	kill, killAt := r.drawKill()
	within := r.drawBudget()

	args := []string{"apply", "--config", r.cfg}
	if within > 0 {
		args = append(args, "--within", within.String())
	}

	applyStart := time.Now()

	first, err := r.c.cli.start(append(args, planFile)...)
	if err != nil {
		r.problem("start apply: %v", err)

		return nil
	}

	r.addApply(first, false)

	fctx, stopFaults := context.WithCancel(ctx)

	var wg sync.WaitGroup

	wg.Go(func() { r.liftPlanHold(fctx) })

	for _, sf := range faults {
		wg.Add(1)

		go func() {
			defer wg.Done()

			if !sleep(fctx, sf.at) {
				return
			}

			what := sf.f.inject(fctx, r)

			r.mu.Lock()
			r.injected = append(r.injected, fmt.Sprintf("%s(%s)@%.1fs", sf.f.name, what, sf.at.Seconds()))
			r.kinds = append(r.kinds, sf.f.name)
			r.mu.Unlock()
		}()
	}

	r.kill = r.stop(first, kill, killAt)

	if err := first.wait(5 * time.Minute); err != nil {
		r.problem("first apply: %v", err)
	}

	stopFaults()
	wg.Wait()
	r.checkHolds(applyStart)

	code, _ := first.exit()
	r.outcome = fmt.Sprintf("exit %d", code)

	if want := map[string]int{"SIGINT": 130, "SIGTERM": 143}[r.kill]; want != 0 && code != want && code != 0 {
		r.problem("apply stopped by %s exited %d, want %d (or 0 if it had finished)\n%s", r.kill, code, want, first.output())
	}

	// 0 done, 1 an error, 4 the Lease held (a second apply won), 5 partial, 6 progressed (only
	// under a budget): anything else (2, 3 a refused plan, an unknown code) is not an outcome a
	// fault may produce.
	if code == 2 || code == 3 || code == 6 && within == 0 || code > 6 && code < 128 {
		r.problem("first apply exited %d\n%s", code, first.output())
	}

	// A run stopped by its budget holds nothing (a second apply still running may hold its
	// own: those are live): the next one continues.
	if code == 6 {
		if fj, ok := r.fences(); ok {
			for _, f := range fj.Fences {
				if !f.Live && f.Kind != fence.KindUnproven {
					r.problem("a progressed run (exit 6) left a fence: %s %s (%s)\n%s", f.Kind, f.Name, f.Reason, first.output())
				}
			}
		}
	}

	return first
}

// drawBudget draws the first apply's time budget (the fault kind "budget"): one seed in three
// runs under a random --within of 3 to 30 s — some shorter than a node, some fitting a few —
// the rest without one.
func (r *seedRun) drawBudget() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()

	if r.rng.IntN(3) != 0 {
		return 0
	}

	d := time.Duration(3+r.rng.IntN(28)) * time.Second
	r.kinds = append(r.kinds, "budget")
	r.injected = append(r.injected, fmt.Sprintf("budget(--within %s)", d))

	return d
}

type scheduled struct {
	f  fault
	at time.Duration
}

// drawFaults draws 1–4 distinct faults and when each starts.
func (r *seedRun) drawFaults() []scheduled {
	r.mu.Lock()
	defer r.mu.Unlock()

	n := 1 + r.rng.IntN(4)
	idx := r.rng.Perm(len(catalog))[:n]
	out := make([]scheduled, 0, n)

	for _, i := range idx {
		out = append(out, scheduled{f: catalog[i], at: time.Duration(r.rng.IntN(90)) * 100 * time.Millisecond})
	}

	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })

	return out
}

// drawKill draws how the first apply is stopped: not at all, SIGINT, SIGTERM, kill -9, or
// SIGINT then kill -9 2 s later (a CI runner that gives up), at a random time.
func (r *seedRun) drawKill() (string, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()

	modes := []string{"none", "none", "none", "SIGINT", "SIGTERM", "SIGKILL", "SIGKILL", "SIGINT+SIGKILL"}

	return modes[r.rng.IntN(len(modes))], time.Duration(200+r.rng.IntN(11000)) * time.Millisecond
}

// stop sends the drawn signal at its time, unless apply ended first.
func (r *seedRun) stop(p *proc, mode string, at time.Duration) string {
	if mode == "none" {
		return "none"
	}

	select {
	case <-p.done:
		return "none (finished first)"
	case <-time.After(at):
	}

	switch mode {
	case "SIGINT":
		p.signal(syscall.SIGINT)
	case "SIGTERM":
		p.signal(syscall.SIGTERM)
	case "SIGKILL":
		p.signal(syscall.SIGKILL)
	case "SIGINT+SIGKILL":
		p.signal(syscall.SIGINT)

		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
			p.signal(syscall.SIGKILL)
		}
	}

	r.note("kill", fmt.Sprintf("%s@%.1fs", mode, at.Seconds()))

	return mode
}

// heal undoes the faults that are not the operator's: machines answer and are powered on,
// the endpoint is back, the blocking PDB is gone, every Node Ready. The operator's cordons
// and taints stay; their staged changes are resolved as an operator would (discarded, or
// re-staged carrying the new credential).
func (r *seedRun) heal(ctx context.Context) {
	r.mu.Lock()
	heals := r.heals
	r.heals = nil
	r.mu.Unlock()

	for _, h := range heals {
		h()
	}

	if err := r.sb.WaitNodesReady(ctx, 2*time.Minute); err != nil {
		r.problem("after healing: %v", err)
	}

	for name := range r.staged {
		m, ok := r.sb.Fleet().Machine(name)
		if !ok {
			continue
		}

		// A node whose Talos reloads registry auth live never takes a staged change with it:
		// the operator discards theirs there (or half the time elsewhere).
		if strings.HasPrefix(m.TalosTag, "v1.14") || r.draw(2) == 0 {
			if err := r.discardStagedChange(ctx, name); err != nil {
				r.problem("discard staged change on %s: %v", name, err)
			}

			continue
		}

		cred := r.cred
		if err := r.stageOperatorChange(ctx, name, &cred); err != nil {
			r.problem("re-stage change with the credential on %s: %v", name, err)
		}

		r.carried[name] = true
	}
}

// checkSecondApplies: a second apply that ran and ended while the first still ran must have
// been refused (one that outlived the first may have taken over after it, which the Lease
// history checks).
func (r *seedRun) checkSecondApplies(first *proc) {
	if first == nil {
		return
	}

	_, firstEnded := first.exit()

	for p := range r.second {
		code, ended := p.exit()
		if ended.Before(firstEnded) && code == 0 {
			r.problem("a second apply ran while the first did, and was not refused\n%s", p.output())
		}
	}
}

// recover is the on-call runbook: fences, then release, then fences again (must be empty).
func (r *seedRun) recover(ctx context.Context) bool {
	rep, ok := r.fences()
	if !ok {
		return false
	}

	for _, f := range rep.Fences {
		if !f.Releasable && f.Kind != fence.KindUnproven {
			r.problem("after the run ended, fence %s/%s (holder %s) is not releasable: %s", f.Kind, f.Name, f.Holder, f.Reason)
		}
	}

	p, err := r.c.cli.run(2*time.Minute, "release", "--config", r.cfg)
	if err != nil || exitOf(p) != 0 {
		r.problem("release: %v exit %d\n%s", err, exitOf(p), outputOf(p))

		return false
	}

	// What release leaves is a node on an unproven hold only (its Talos config written, never
	// proved): the convergence proves it and lifts the hold (checked there).
	rep, ok = r.fences()
	if ok && slices.ContainsFunc(rep.Fences, func(f fence.Fence) bool { return f.Kind != fence.KindUnproven }) {
		r.problem("fences left after release: %+v", rep.Fences)

		return false
	}

	return ok
}

func (r *seedRun) fences() (view.FencesJSON, bool) {
	var rep view.FencesJSON

	// The API endpoint's node may still be coming back from a fault's reboot: an operator asks
	// again a moment later (for up to a minute); any other failure is a problem.
	var (
		p   *proc
		err error
	)

	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		p, err = r.c.cli.run(time.Minute, "fences", "--config", r.cfg, "--json")
		if err != nil || exitOf(p) == 0 || !strings.Contains(outputOf(p), "cannot reach the Kubernetes API") || time.Now().After(deadline) {
			break
		}
	}

	if err != nil || exitOf(p) != 0 {
		r.problem("fences: %v exit %d\n%s", err, exitOf(p), outputOf(p))

		return rep, false
	}

	if err := json.Unmarshal(p.stdout.Bytes(), &rep); err != nil {
		r.problem("fences --json is not JSON: %v\n%s", err, p.stdout.String())

		return rep, false
	}

	return rep, true
}

// convergeAll: with the faults over and the autoscaler quiet, fresh plan/apply rounds must
// bring every node to the credential.
func (r *seedRun) convergeAll(ctx context.Context) bool {
	if err := r.sb.PauseAutoscaler(ctx, true); err != nil {
		r.problem("pause autoscaler: %v", err)

		return false
	}

	// A control plane an operator cordoned counts as down for the etcd gate, so while it stays
	// cordoned the other control planes are never rotated (by design): the operator's
	// maintenance ends before convergence is asked for. A worker's cordon stays (and is checked).
	r.endControlPlaneMaintenance(ctx)

	for round := 1; round <= 4; round++ {
		planFile := filepath.Join(r.dir, fmt.Sprintf("converge-%d.plan", round))

		pj, ok := r.planApplicable(planFile)
		if !ok {
			return false
		}

		if !pj.Changes && pj.Verdict != nil && pj.Verdict.SafeToRevoke {
			// Converged: every node proved, so no node is left on an unproven hold.
			if rep, ok := r.fences(); !ok || len(rep.Fences) > 0 {
				r.problem("converged, but fences are held: %+v", rep.Fences)

				return false
			}

			return true
		}

		if !pj.Changes { // nothing ghcrsync would do, yet the old credential is in use (or no verdict)
			r.problem("convergence: no changes, but the verdict is %+v", pj.Verdict)

			return false
		}

		p, err := r.c.cli.start("apply", "--config", r.cfg, planFile)
		if err != nil {
			r.problem("start apply: %v", err)

			return false
		}

		r.addApply(p, false)
		r.converge++

		if err := p.wait(5 * time.Minute); err != nil {
			r.problem("converging apply: %v", err)

			return false
		}

		if code, _ := p.exit(); code != 0 {
			r.problem("converging apply %d exited %d with no fault running\n%s", round, code, p.output())

			return false
		}
	}

	r.problem("no convergence after 4 applies")

	return false
}

// endControlPlaneMaintenance uncordons the control planes an operator cordoned during the seed.
func (r *seedRun) endControlPlaneMaintenance(ctx context.Context) {
	r.mu.Lock()
	var names []string
	for name := range r.cordoned {
		if m, ok := r.sb.Fleet().Machine(name); ok && m.Role == sandbox.RoleControlPlane {
			names = append(names, name)
		}
	}
	r.mu.Unlock()

	for _, name := range names {
		err := r.updateNode(ctx, name, func(n *corev1.Node) bool {
			if !n.Spec.Unschedulable || n.Annotations[sandbox.OwnerAnnotation] != "" {
				return false // not cordoned any more, or fenced by a run: not the operator's to end
			}

			n.Spec.Unschedulable = false

			return true
		})
		if err != nil {
			r.problem("uncordon %s: %v", name, err)

			continue
		}

		r.mu.Lock()
		delete(r.cordoned, name)
		r.mu.Unlock()
	}
}

// planApplicable plans into out as an operator would: a plan apply would refuse as it is (an
// emergency whose first drain has nowhere to send its pods) is made again with --allow-pending,
// as the plan says to.
func (r *seedRun) planApplicable(out string) (view.PlanJSON, bool) {
	pj, ok := r.plan(out)
	if ok && pj.Steering.Blocked != "" {
		return r.plan(out, "--allow-pending")
	}

	return pj, ok
}

func (r *seedRun) plan(out string, flags ...string) (view.PlanJSON, bool) {
	var pj view.PlanJSON

	args := append([]string{"plan", "--config", r.cfg, "--json"}, flags...)
	if out != "" {
		args = append(args, "--out", out)
	}

	p, err := r.c.cli.run(time.Minute, args...)
	if err != nil || exitOf(p) != 0 {
		r.problem("plan: %v exit %d\n%s", err, exitOf(p), outputOf(p))

		return pj, false
	}

	if err := json.Unmarshal(p.stdout.Bytes(), &pj); err != nil {
		r.problem("plan --json is not JSON: %v", err)

		return pj, false
	}

	return pj, true
}

// teardown undoes the operator's marks and this seed's state Secret, so the next seed starts
// clean.
func (r *seedRun) teardown(ctx context.Context) {
	for name := range r.cordoned {
		_ = r.updateNode(ctx, name, func(n *corev1.Node) bool { n.Spec.Unschedulable = false; return true })
	}

	for name := range r.tainted {
		_ = r.updateNode(ctx, name, func(n *corev1.Node) bool {
			n.Spec.Taints = withoutOperatorTaint(n.Spec.Taints)

			return true
		})
	}

	// An operator's change still staged (ghcrsync had no reason to reboot its node) is resolved
	// as its operator would, so the next seed starts without it.
	for name := range r.staged {
		_ = r.discardStagedChange(ctx, name)
	}

	r.deleteBlockingPDB()

	if r.backend == "kubernetes" {
		_ = r.kube.CoreV1().Secrets("flux-system").Delete(ctx, r.stateSecret(), metav1.DeleteOptions{})
	}
}

func exitOf(p *proc) int {
	if p == nil {
		return -1
	}

	code, _ := p.exit()

	return code
}

func outputOf(p *proc) string {
	if p == nil {
		return ""
	}

	return p.output()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")

	return line
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0xc4a05)) }
