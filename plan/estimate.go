package plan

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/state"
)

// How long will apply take, and what fits in a run's time budget? The estimate replays the
// executor's order — live updates several at a time, the seed alone when steering is hard, the
// fenced workers k at a time, the control planes one by one — with each node's expected
// duration: the median of the last recorded rotations of its class (the state's samples), or the
// configuration's default before any. A drain predicted to be held costs its drain_timeout (it
// then fails). A node fits when it ends before the budget less the reserve (the run's closing
// steps): apply starts no node that does not.

// Classes of a node's rotation: what its duration is estimated from.
const (
	ClassWorker       = "worker"
	ClassControlPlane = "control-plane"
	ClassAutoscaled   = "autoscaled"
	ClassLive         = "live"
	ClassKeyring      = "kubelet-keyring"
)

// EstimateSamples is how many of a class's latest recorded rotations its median is taken over.
const EstimateSamples = 20

// Timing is the estimate's input besides the plan: the recorded samples, the defaults, the
// parallelism and the budget.
type Timing struct {
	Samples          []state.Sample
	ExpectedNodeTime time.Duration
	ExpectedLiveTime time.Duration
	// ExpectedKeyringTime is a kubelet-keyring node's, before any is recorded: up to the
	// kubelet's five-minute keyring cache, and the proof.
	ExpectedKeyringTime time.Duration
	WorkerParallelism   int
	LiveParallelism     int
	DrainTimeout        time.Duration
	// Budget is the run's time budget (0: none) and Reserve what it keeps for its closing steps.
	Budget  time.Duration
	Reserve time.Duration
}

// ClassEstimate is one class's expected duration per node, and where it comes from.
type ClassEstimate struct {
	Class   string        `json:"class"`
	PerNode time.Duration `json:"per_node"`
	Samples int           `json:"samples,omitempty"` // recorded rotations the median is of
	Runs    int           `json:"runs,omitempty"`    // the runs they came from
	// Default: no rotation of the class is recorded yet: the configuration's figure.
	Default bool `json:"default,omitempty"`
	// From is the class whose samples stand in (an autoscaled worker without its own: the workers').
	From string `json:"from,omitempty"`
}

// Estimate is the expected wall time of the rotation and what fits in the budget.
type Estimate struct {
	Wall        time.Duration   `json:"wall"`
	Fenced      int             `json:"fenced"`
	Live        int             `json:"live"`
	Parallelism int             `json:"parallelism"`
	Classes     []ClassEstimate `json:"classes"`
	// Held are the nodes whose drain is predicted to be held (priced at drain_timeout each).
	Held    int           `json:"held,omitempty"`
	Budget  time.Duration `json:"budget,omitempty"`
	Reserve time.Duration `json:"reserve,omitempty"`
	// Fit counts the nodes acted on that fit in the budget (all of them without one).
	Fit   int `json:"fit"`
	Acted int `json:"acted"`
}

// ClassOf is the class of a planned node's rotation.
func ClassOf(np NodePlan) string {
	switch {
	case np.Action == ActionApplyLive:
		return ClassLive
	case np.Action == ActionKeyring:
		return ClassKeyring
	case np.Role == RoleControlPlane:
		return ClassControlPlane
	case np.Autoscaled:
		return ClassAutoscaled
	}

	return ClassWorker
}

// classEstimate is the median of the class's latest recorded rotations (an autoscaled worker
// falls back to the workers'), or the default.
func classEstimate(class string, t Timing) ClassEstimate {
	for _, c := range []string{class, fallbackClass(class)} {
		if c == "" {
			continue
		}

		if per, n, runs := median(t.Samples, c); n > 0 {
			e := ClassEstimate{Class: class, PerNode: per, Samples: n, Runs: runs}
			if c != class {
				e.From = c
			}

			return e
		}
	}

	def := t.ExpectedNodeTime

	switch class {
	case ClassLive:
		def = t.ExpectedLiveTime
	case ClassKeyring:
		def = t.ExpectedKeyringTime
	}

	return ClassEstimate{Class: class, PerNode: def, Default: true}
}

func fallbackClass(class string) string {
	if class == ClassAutoscaled {
		return ClassWorker
	}

	return ""
}

// median is the median duration of the latest EstimateSamples samples of class, how many there
// were and how many runs they came from.
func median(samples []state.Sample, class string) (time.Duration, int, int) {
	var of []state.Sample

	for _, s := range samples {
		if s.Class == class && s.Seconds > 0 {
			of = append(of, s)
		}
	}

	sort.SliceStable(of, func(i, j int) bool { return of[i].Finished.Before(of[j].Finished) })

	if len(of) > EstimateSamples {
		of = of[len(of)-EstimateSamples:]
	}

	if len(of) == 0 {
		return 0, 0, 0
	}

	secs := make([]float64, 0, len(of))
	runs := map[string]bool{}

	for _, s := range of {
		secs = append(secs, s.Seconds)
		runs[s.Run] = true
	}

	slices.Sort(secs)

	m := secs[len(secs)/2]
	if len(secs)%2 == 0 {
		m = (secs[len(secs)/2-1] + secs[len(secs)/2]) / 2
	}

	return time.Duration(m * float64(time.Second)), len(of), len(runs)
}

// estimate replays the executor's order with each node's expected duration: it sets each
// acted-on node's Estimate and InBudget, and returns the whole.
func estimate(p *Plan, t Timing) *Estimate {
	e := &Estimate{Budget: t.Budget, Reserve: t.Reserve, Parallelism: max(t.WorkerParallelism, 1)}
	classes := map[string]ClassEstimate{}

	per := func(np *NodePlan) time.Duration {
		c := ClassOf(*np)
		if _, ok := classes[c]; !ok {
			classes[c] = classEstimate(c, t)
		}

		d := classes[c].PerNode
		if np.Action == ActionFence && holdsDrain(*np) {
			d += t.DrainTimeout
		}

		return d
	}

	live, workers, controlPlanes := e.lanes(p, per)

	at := schedule(live, max(t.LiveParallelism, 1), 0)

	if len(workers) > 0 && p.Steering.Hard() && workers[0].Name == p.Steering.Seed {
		at = schedule(workers[:1], 1, at)
		workers = workers[1:]
	}

	at = schedule(workers, max(t.WorkerParallelism, 1), at)
	e.Wall = schedule(controlPlanes, 1, at)

	e.fit(p, t)

	for _, c := range []string{ClassLive, ClassKeyring, ClassWorker, ClassAutoscaled, ClassControlPlane} {
		if ce, ok := classes[c]; ok {
			e.Classes = append(e.Classes, ce)
		}
	}

	return e
}

// lanes are the acted-on nodes in the executor's three lanes — updated in place (live and keyring
// writes), fenced workers, control planes — each node given its expected duration (per) and
// counted.
func (e *Estimate) lanes(p *Plan, per func(*NodePlan) time.Duration) (live, workers, controlPlanes []*NodePlan) {
	for i := range p.Nodes {
		np := &p.Nodes[i]

		switch {
		case np.Order == 0:
			continue
		case np.Action == ActionKeyring, np.Action == ActionApplyLive && np.Role != RoleControlPlane:
			live = append(live, np) // a keyring write restarts nothing: control planes too
		case np.Role == RoleControlPlane:
			controlPlanes = append(controlPlanes, np)
		default:
			workers = append(workers, np)
		}

		np.Estimate = per(np)
		e.Acted++

		if np.Action.InPlace() {
			e.Live++
		} else {
			e.Fenced++
		}

		if np.Action == ActionFence && holdsDrain(*np) {
			e.Held++
		}
	}

	return live, workers, controlPlanes
}

// fit marks the nodes whose rotation ends within the budget, less its reserve (every node, with
// no budget).
func (e *Estimate) fit(p *Plan, t Timing) {
	for i := range p.Nodes {
		if np := &p.Nodes[i]; np.Order > 0 && (t.Budget == 0 || np.Ends+t.Reserve <= t.Budget) {
			np.InBudget = true
			e.Fit++
		}
	}
}

// NeverFits reports whether np's estimate is longer than a whole budget less its reserve: no
// run within that budget could rotate it, so deferring it would defer it for ever.
func NeverFits(np NodePlan, budget, reserve time.Duration) bool {
	return budget > 0 && np.Order > 0 && np.Estimate+reserve > budget
}

// neverFitWarning names the nodes no run within the budget can rotate, and the way out.
func neverFitWarning(p *Plan) []string {
	e := p.Estimate
	if e == nil || e.Budget == 0 {
		return nil
	}

	var names []string

	for _, np := range p.Nodes {
		if NeverFits(np, e.Budget, e.Reserve) {
			names = append(names, fmt.Sprintf("%s (≈ %s)", np.Name, minutes(np.Estimate)))
		}
	}

	if len(names) == 0 {
		return nil
	}

	return []string{fmt.Sprintf("No run within the budget (%s, less %s reserve) can rotate %s: each is expected to take longer than that. "+
		"apply does not start it and fails naming it — raise --within or run.budget, or rotate it in a run without a budget.",
		minutes(e.Budget), minutes(e.Reserve), strings.Join(names, ", "))}
}

// Rebudget marks again which nodes fit in a budget (apply's, which may not be the plan's): a
// node fits when it is expected to end before budget less reserve.
func (p *Plan) Rebudget(budget, reserve time.Duration) {
	fit := 0

	for i := range p.Nodes {
		np := &p.Nodes[i]
		np.InBudget = np.Order > 0 && (budget == 0 || np.Ends+reserve <= budget)

		if np.InBudget {
			fit++
		}
	}

	if p.Estimate != nil {
		p.Estimate.Budget, p.Estimate.Reserve, p.Estimate.Fit = budget, reserve, fit
	}
}

// schedule starts nodes in order on k slots from at (each on the slot free first) and sets
// when each ends; it returns when the last ends.
func schedule(nodes []*NodePlan, k int, at time.Duration) time.Duration {
	slots := make([]time.Duration, k)
	for i := range slots {
		slots[i] = at
	}

	end := at

	for _, np := range nodes {
		i := slices.Index(slots, slices.Min(slots))
		np.Ends = slots[i] + np.Estimate
		slots[i] = np.Ends
		end = max(end, np.Ends)
	}

	return end
}

// holdsDrain: the node's drain is predicted to be held (a budget, a bare pod).
func holdsDrain(np NodePlan) bool {
	return slices.ContainsFunc(np.Blockers, func(b DrainBlocker) bool { return b.Holds() })
}

// Sentence is the estimate in words: "≈ 41 min for 7 fenced nodes at 1 at a time (median 5.9 min
// per node, last 3 runs); budget 40 min: about 6 of 7 fit in this run, the rest in the next".
func (e *Estimate) Sentence() string {
	if e == nil || e.Acted == 0 {
		return ""
	}

	var what []string
	if e.Fenced > 0 {
		what = append(what, fmt.Sprintf("%d fenced %s at %d at a time", e.Fenced, human.Plural(e.Fenced, "node", "nodes"), e.Parallelism))
	}

	if e.Live > 0 {
		what = append(what, fmt.Sprintf("%d live %s", e.Live, human.Plural(e.Live, "update", "updates")))
	}

	s := fmt.Sprintf("≈ %s for %s (%s)", minutes(e.Wall), joinAnd(what), e.basis())

	if e.Held > 0 {
		s += fmt.Sprintf("; %d %s predicted to be held, counted at drain_timeout", e.Held, human.Plural(e.Held, "drain", "drains"))
	}

	switch {
	case e.Budget == 0:
	case e.Fit == e.Acted:
		s += fmt.Sprintf("; budget %s (less %s reserve): all fit in this run", minutes(e.Budget), minutes(e.Reserve))
	case e.Fit == 0:
		s += fmt.Sprintf("; budget %s (less %s reserve): none fits in this run", minutes(e.Budget), minutes(e.Reserve))
	default:
		s += fmt.Sprintf("; budget %s (less %s reserve): about %d of %d fit in this run, the rest in the next", minutes(e.Budget), minutes(e.Reserve), e.Fit, e.Acted)
	}

	return s
}

// basis says which figures the estimate used, class by class.
func (e *Estimate) basis() string {
	var parts []string

	for _, c := range e.Classes {
		switch {
		case c.Default:
			parts = append(parts, fmt.Sprintf("%s: %s per node, the configured default (no rotation recorded yet)", c.Class, minutes(c.PerNode)))
		case c.From != "":
			parts = append(parts, fmt.Sprintf("%s: median %s per node of the %s ones", c.Class, minutes(c.PerNode), c.From))
		default:
			parts = append(parts, fmt.Sprintf("%s: median %s per node, last %d %s", c.Class, minutes(c.PerNode), c.Runs, human.Plural(c.Runs, "run", "runs")))
		}
	}

	return joinAnd(parts)
}

func joinAnd(parts []string) string {
	switch len(parts) {
	case 0:
		return ""
	case 1:
		return parts[0]
	}

	out := parts[0]
	for _, p := range parts[1 : len(parts)-1] {
		out += ", " + p
	}

	return out + " and " + parts[len(parts)-1]
}

// minutes renders a duration as people read a deploy's: "41 min", "5.9 min", "40 s".
func minutes(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Round(time.Second)/time.Second))
	case d < 10*time.Minute:
		return fmt.Sprintf("%.1f min", d.Minutes())
	}

	return fmt.Sprintf("%d min", int(d.Round(time.Minute)/time.Minute))
}

// continuing is the rotation to this plan's revision an earlier run started and left unfinished.
func continuing(in Input) *state.Rotation {
	if r := in.Rotation; r != nil && r.Revision == in.CredentialRevision && r.Finished == nil {
		c := *r

		return &c
	}

	return nil
}

// ContinuingSentence says which rotation the plan continues: "continuing the rotation to R
// started 2026-12-04 10:00Z by RUN (2 runs so far): 4 of 11 nodes done".
func (p *Plan) ContinuingSentence() string {
	r := p.Continuing
	if r == nil {
		return ""
	}

	left := 0
	for _, n := range p.Nodes {
		if n.Order > 0 && !slices.Contains(r.Done, n.Name) {
			left++
		}
	}

	return fmt.Sprintf("continuing the rotation to revision %s started %s by run %s (%d %s so far): %d of %d nodes done",
		human.Short(r.Revision), r.Started.UTC().Format("2006-01-02 15:04Z"), r.StartedBy, r.Runs, human.Plural(r.Runs, "run", "runs"),
		len(r.Done), len(r.Done)+left)
}
