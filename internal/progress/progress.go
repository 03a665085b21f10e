// Package progress is what a long step reports while it goes on — an eviction, a retry, a wait
// for a node — as typed events. The packages that wait emit them through a Func; the view
// (view.Progress) words them. Nothing here prints.
package progress

import (
	"strings"
	"time"
)

// Event is one report of a step in progress, about a node.
type Event interface{ About() string }

// Func receives the events; nil discards them.
type Func func(Event)

// Emit reports e, if anyone listens.
func (f Func) Emit(e Event) {
	if f != nil {
		f(e)
	}
}

// Evicting: the drain asks for the pod's eviction now.
type Evicting struct{ Node, Pod string }

// EvictionRetry: the pod was not evicted yet (a budget holds it, the API did not answer, or —
// Destinations — where it could go could not be read); the drain asks again In.
type EvictionRetry struct {
	Node, Pod    string
	In           time.Duration // the next pause's base (its draw is up to half again longer)
	Why          string
	Destinations bool
	Attempt      int // the eviction requests asked for this pod so far
}

// Drainer is a line of kubectl's drain helper (the pods it found, what it ignores).
type Drainer struct{ Node, Line string }

// WaitingReady: a rebooted node is awaited (its new boot, Ready, its lifecycle taints gone).
type WaitingReady struct {
	Node             string
	Elapsed, Timeout time.Duration
	Awaited          string
}

// WaitingGone: a node being deleted after its Talos write is awaited until it goes (or its
// deletion is given up).
type WaitingGone struct {
	Node             string
	Elapsed, Timeout time.Duration
	Why              string
}

// WaitingSettled: release waits for a node whose Talos config was written to be Ready with its
// lifecycle taints cleared.
type WaitingSettled struct {
	Node             string
	Ready, Lifecycle bool
}

// WaitingProvisioned: the run waits, before its last listing of the fleet, for the machines an
// autoscaler node group is still creating to join as Nodes (About is the group).
type WaitingProvisioned struct {
	Group            string
	Machines         int
	Elapsed, Timeout time.Duration
}

func (e WaitingProvisioned) About() string { return e.Group }

func (e Evicting) About() string       { return e.Node }
func (e EvictionRetry) About() string  { return e.Node }
func (e Drainer) About() string        { return e.Node }
func (e WaitingReady) About() string   { return e.Node }
func (e WaitingGone) About() string    { return e.Node }
func (e WaitingSettled) About() string { return e.Node }

// Lines is a writer (for kubectl's drain helper) whose every line becomes a Drainer event.
func Lines(f Func, node string) LineWriter { return LineWriter{f: f, node: node} }

// LineWriter turns written lines into Drainer events.
type LineWriter struct {
	f    Func
	node string
}

func (w LineWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line != "" {
			w.f.Emit(Drainer{Node: w.node, Line: line})
		}
	}

	return len(b), nil
}
