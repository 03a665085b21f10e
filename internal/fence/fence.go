// Package fence finds the fences ghcrsync holds (node fences and the run Lease), judges from
// liveness evidence whether each may be released, and releases them. Classify is pure: the
// observation and the liveness verdicts in, the report out.
package fence

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Kinds of fence.
const (
	KindNode  = "node"
	KindLease = "lease"
	// KindUnproven is a node on ghcrsync's unproven hold: cordoned because its Talos config holds
	// a credential its runtime was never proved to pull with. No run holds it; apply proves it,
	// `release --uncordon-unproven` lifts it.
	KindUnproven = "unproven"
)

// HoldObs is a node on an unproven hold.
type HoldObs struct {
	Name, UID, Revision string
	Cordoned            bool
}

// NodeObs is a node that carries a ghcrsync fence, or a state record that says it may.
type NodeObs struct {
	Name   string
	Exists bool
	UID    string
	Owner  string
	Phase  state.Phase
	Record *state.Fence // from the node's annotation
	// RecordErr is why the node's recovery record annotation, present, is not one ghcrsync
	// can trust ("" when valid or absent).
	RecordErr      string
	StateRecord    *state.Record
	Cordoned       bool
	ScaleDownGuard bool
	Ready          bool
	Lifecycle      bool // lifecycle taints present
}

// LeaseObs is the run Lease.
type LeaseObs struct {
	Namespace, Name string
	Holder          string
	RenewTime       *time.Time
	// Written is the API server's time of the Lease's latest change: when set, Live judges by it
	// and Observation.Now is the server's clock too.
	Written     *time.Time
	Duration    time.Duration
	Transitions int
}

// serverGrace covers the API server's times being whole seconds (its Date header and the
// managed fields' time): a Lease is judged live that long longer, never shorter.
const serverGrace = 2 * time.Second

// Live reports whether the Lease is held and renewed within its duration: by the API server's
// clock when its time of the latest change is known (now is then the server's), else by the
// renew time the holder wrote.
func (l *LeaseObs) Live(now time.Time) bool {
	if l == nil || l.Holder == "" {
		return false
	}

	if l.Written != nil {
		return now.Before(l.Written.Add(l.Duration + serverGrace))
	}

	return l.RenewTime != nil && now.Before(l.RenewTime.Add(l.Duration))
}

// vouches reports whether the live Lease names holder h: its run is live, whatever else says.
func (l *LeaseObs) vouches(h string, now time.Time) bool { return l.Live(now) && l.Holder == h }

// Verdict is the liveness evidence about one holder's run.
type Verdict struct {
	Checked  bool // a liveness source answered
	Terminal bool
	// Exited is proof beyond a Lease: the holder's process on this host is gone, so nothing can
	// still write on its behalf, whatever its Lease's renew time says.
	Exited   bool
	Evidence string
	Err      error
}

// Observation is everything Classify looks at.
type Observation struct {
	Now        time.Time
	ConfigPath string
	Nodes      []NodeObs
	Steered    []SteerObs
	Holds      []HoldObs
	Flux       []FluxObs
	// Kured are ghcrsync's entries in kured's reboot lock.
	Kured    []maintenance.OurEntry
	Lease    *LeaseObs
	Verdicts map[string]Verdict // by holder
	// Holder is an explicit --holder; Force lets it release a holder that may be alive.
	Holder string
	Force  bool
	// UncordonUnproven makes unproven holds releasable (release --uncordon-unproven).
	UncordonUnproven bool
	// SecretsInFlight are pull secrets a run had started writing and not confirmed.
	SecretsInFlight []state.SecretRecord
}

// Fence is one held fence, with the evidence and what to do about it.
type Fence struct {
	Kind       string      `json:"kind"`
	Name       string      `json:"name"`
	Holder     string      `json:"holder"`
	Phase      state.Phase `json:"phase,omitempty"`
	Live       bool        `json:"live"`
	Releasable bool        `json:"releasable"`
	Reason     string      `json:"reason"`
	Command    string      `json:"command,omitempty"`

	Exists         bool   `json:"exists"`
	Cordoned       bool   `json:"cordoned,omitempty"`
	WasCordoned    *bool  `json:"was_cordoned,omitempty"`
	ScaleDownGuard bool   `json:"scale_down_guard,omitempty"`
	Evidence       string `json:"evidence"`

	// For release.
	UID    string       `json:"-"`
	Record *state.Fence `json:"-"`
}

// Report is the inventory.
type Report struct {
	Fences []Fence `json:"fences"`
	// Malformed are the nodes whose recovery record is malformed: while any is, release
	// releases nothing.
	Malformed []string `json:"malformed_records,omitempty"`
	Notes     []string `json:"notes,omitempty"`
	Summary   string   `json:"summary"`
}

// Classify builds the report: node fences by name, the steering taints, the Flux suspensions,
// then the Lease (released last).
func Classify(o Observation) Report {
	rep := Report{Fences: []Fence{}}

	nodes := append([]NodeObs(nil), o.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })

	for _, n := range nodes {
		f, malformed := classifyNode(n, o)
		if malformed {
			rep.Malformed = append(rep.Malformed, n.Name)
		}

		rep.Fences = append(rep.Fences, f)
	}

	for _, s := range o.Steered {
		rep.Fences = append(rep.Fences, classifySteering(s, o))
	}

	for _, h := range o.Holds {
		rep.Fences = append(rep.Fences, classifyHold(h, o))
	}

	for _, x := range o.Flux {
		rep.Fences = append(rep.Fences, classifyFlux(x, o))
	}

	for _, e := range o.Kured {
		rep.Fences = append(rep.Fences, classifyKured(e, o, rep))
	}

	if l := o.Lease; l != nil && l.Holder != "" {
		f := Fence{Kind: KindLease, Name: l.Namespace + "/" + l.Name, Holder: l.Holder, Exists: true}
		assessLiveness(&f, o)

		f.Evidence = fmt.Sprintf("%s (duration %s, transitions %d); %s", human.Renewed(l.RenewTime, o.Now), l.Duration, l.Transitions, f.Evidence)
		rep.Fences = append(rep.Fences, f)
	}

	for _, sr := range o.SecretsInFlight {
		what := "pull secret"
		if sr.Role == plan.RoleTemplate {
			what = "node template"
		}

		rep.Notes = append(rep.Notes, fmt.Sprintf(what+" %s/%s (%s) was being written with revision %s when its run stopped: "+
			"not a fence, but it may hold either credential; run plan to see what remains", sr.Namespace, sr.Name, sr.Role, human.Short(sr.DesiredRevision)))
	}

	rep.Summary = summary(rep.Fences)

	return rep
}

// classifyNode is the report's entry for one node fence; malformed is true when its recovery
// record cannot be trusted (release then releases nothing).
func classifyNode(n NodeObs, o Observation) (Fence, bool) {
	holder := n.holder()

	f := Fence{
		Kind: KindNode, Name: n.Name, Holder: holder, Phase: n.Phase, Exists: n.Exists,
		Cordoned: n.Cordoned, ScaleDownGuard: n.ScaleDownGuard, UID: n.UID, Record: n.Record,
	}

	// The state is written before each mutation and the annotation after it: when both belong
	// to this holder, the state's phase is the furthest the run may have gone.
	if n.StateRecord != nil && (f.Phase == "" || n.StateRecord.Owner == holder) {
		f.Phase = n.StateRecord.Phase
	}

	if n.Record == nil && n.StateRecord != nil {
		rec := n.StateRecord.Fence
		f.Record = &rec
	}

	if f.Record != nil {
		wc := f.Record.WasCordoned
		f.WasCordoned = &wc
	}

	if n.RecordErr != "" {
		f.Reason = "NOT releasable: its recovery record annotation (" + object.RecordAnnotation + ") is malformed: " + n.RecordErr +
			"; a damaged or tampered record says nothing true about what to restore, so no fence is released while it is there: " +
			"check the node's cordon and taints, then fix or remove the annotation"
		f.Evidence = "malformed recovery record"

		return f, true
	}

	if holder == "" { // an owner annotation with no value, and no state record naming one
		f.Reason = "NOT releasable: the node's " + object.OwnerAnnotation + " annotation is empty, so whose fence it is cannot be told; " +
			"check its cordon and taints, then remove ghcrsync's annotations by hand"
		f.Evidence = "empty owner annotation"

		return f, false
	}

	assessLiveness(&f, o)

	switch {
	case !n.Exists && !f.Live:
		f.Releasable, f.Command = true, ""
		f.Reason = "the node no longer exists: nothing is held on the cluster (only the state record remains)"
	case n.Owner == "" && !f.Live:
		f.Releasable, f.Command = true, ""
		f.Reason = "no ghcrsync annotation on the node: only the state record remains"
	case f.Releasable && phaseMutated(f.Phase) && (!n.Ready || n.Lifecycle):
		f.Reason += "; its Talos config was written, so release waits until it is Ready with its lifecycle taints cleared"
	}

	return f, false
}

func phaseMutated(p state.Phase) bool { return p.TalosWritten() }

// classifyHold is the report's entry for a node on an unproven hold: listed so a person sees
// it (it is out of service), released only when asked to return it to service unproven.
func classifyHold(h HoldObs, o Observation) Fence {
	f := Fence{Kind: KindUnproven, Name: h.Name, Exists: true, Cordoned: h.Cordoned, UID: h.UID,
		Evidence: object.UnprovenAnnotation + "=" + h.Revision + ", cordoned=" + strconv.FormatBool(h.Cordoned)}

	f.Reason = "unproven: its Talos config holds credential revision " + human.Short(h.Revision) + ", but its runtime was never proved to " +
		"pull with it, so it stays cordoned; `ghcrsync apply` proves it and lifts the hold"
	if o.UncordonUnproven {
		f.Releasable = true
		f.Reason = "unproven, returned to service WITHOUT a proof (--uncordon-unproven)"
	}

	if !hasControl(o.ConfigPath) && !hasControl(h.Name) {
		f.Command = "ghcrsync apply --config " + Quote(o.ConfigPath) + " --auto-approve   # or: ghcrsync release --config " + Quote(o.ConfigPath) +
			" --node " + Quote(h.Name) + " --uncordon-unproven"
	}

	return f
}

// assessLiveness sets liveness, releasability, reason and command for f's holder.
func assessLiveness(f *Fence, o Observation) {
	leaseLive := o.Lease.vouches(f.Holder, o.Now)
	v, checked := o.Verdicts[f.Holder]
	explicit := o.Holder != "" && o.Holder == f.Holder

	switch {
	case checked && v.Exited:
		f.Releasable = true
		f.Evidence = v.Evidence
		f.Reason = "held by a run whose process has exited: releasable"
	case leaseLive && explicit && o.Force:
		f.Live, f.Releasable = true, true
		f.Evidence = fmt.Sprintf("Lease %s/%s is live and names this holder", o.Lease.Namespace, o.Lease.Name)
		f.Reason = "held by a LIVE run, released anyway (--force): that run may still write to Talos and the cluster"
	case leaseLive:
		f.Live = true
		f.Evidence = fmt.Sprintf("Lease %s/%s is live and names this holder", o.Lease.Namespace, o.Lease.Name)
		f.Reason = "held by a live run (its Lease is renewed): wait for it to finish"
	case checked && v.Err != nil:
		f.Live = true
		f.Evidence = v.Err.Error()
		f.Reason = "the run's liveness cannot be checked, so it is treated as alive"

		if explicit && o.Force {
			f.Releasable = true
			f.Reason = "liveness unknown, released anyway (--force): the run may still be alive"
		}
	case checked && v.Terminal:
		f.Releasable = true
		f.Evidence = v.Evidence
		f.Reason = "held by a terminated run: releasable"
	case checked && v.Checked:
		f.Live = true
		f.Evidence = v.Evidence
		f.Reason = "held by a run that has not completed"

		if explicit && o.Force {
			f.Releasable = true
			f.Reason = "held by a run that has not completed, released anyway (--force)"
		}
	case explicit:
		f.Releasable = true
		f.Evidence = v.Evidence
		f.Reason = "no live Lease names this holder, and it was named explicitly (--holder)"
	default:
		f.Evidence = v.Evidence
		if f.Evidence == "" {
			f.Evidence = "no liveness source is configured"
		}

		f.Reason = "the holder's run cannot be proven terminated: name it to release (--holder), as with terraform force-unlock"
	}

	f.Command = command(o.ConfigPath, f, !f.Releasable && !f.Live)
}

// command is the exact release command for f, its values shell-quoted. A value with control
// characters (a newline, say) has no one-line POSIX quoting: no command is printed for it.
func command(cfg string, f *Fence, needsHolder bool) string {
	if f.Live && !f.Releasable {
		return ""
	}

	if hasControl(cfg) || hasControl(f.Name) || hasControl(f.Holder) {
		return ""
	}

	args := []string{"ghcrsync", "release", "--config", Quote(cfg)}
	if f.Kind == KindNode || f.Kind == KindSteering {
		args = append(args, "--node", Quote(f.Name))
	}

	if needsHolder || f.Releasable {
		args = append(args, "--holder", Quote(f.Holder))
	}

	return strings.Join(args, " ")
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0
}

// Display renders a value read from the cluster for a person: shell-quoted, or — when it holds
// control characters — Go-quoted with escapes, so it can never break a line or a terminal.
func Display(s string) string {
	if hasControl(s) {
		return strconv.Quote(s)
	}

	return Quote(s)
}

// Quote quotes s for a POSIX shell: single quotes, with embedded ones as '\”.
func Quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@", r))
	}) < 0 {
		return s
	}

	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func summary(fs []Fence) string {
	if len(fs) == 0 {
		return "No fence is held."
	}

	var releasable, live, unproven, held int

	for _, f := range fs {
		switch {
		case f.Releasable:
			releasable++
		case f.Kind == KindUnproven:
			held++
		case f.Live:
			live++
		default:
			unproven++
		}
	}

	if held > 0 {
		return fmt.Sprintf("%d %s held: %d releasable, %d held by a live run, %d whose run cannot be proven terminated, %d %s on an unproven hold "+
			"(cordoned: Talos config written, runtime never proved; run apply).", len(fs), human.Plural(len(fs), "fence", "fences"),
			releasable, live, unproven, held, human.Plural(held, "node", "nodes"))
	}

	switch {
	case releasable == len(fs):
		return fmt.Sprintf("%d %s held by a terminated run: releasable.", len(fs), human.Plural(len(fs), "fence", "fences"))
	case live == len(fs):
		return fmt.Sprintf("%d %s held by a live run: not releasable.", len(fs), human.Plural(len(fs), "fence", "fences"))
	}

	return fmt.Sprintf("%d %s held: %d releasable, %d held by a live run, %d whose run cannot be proven terminated.",
		len(fs), human.Plural(len(fs), "fence", "fences"), releasable, live, unproven)
}
