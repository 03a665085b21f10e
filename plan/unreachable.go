package plan

import (
	"fmt"
	"strings"
)

// Unreachable are the nodes of the fleet (nodes.selector's) whose Talos API could not be read,
// with what was answered: the plan leaves them alone, and rotates nothing there.
func (p *Plan) Unreachable() []NodePlan {
	var out []NodePlan

	for _, n := range p.Nodes {
		if n.Reason == ReasonTalosUnreachable {
			out = append(out, n)
		}
	}

	return out
}

// selected counts the plan's nodes that are Nodes now (not only recorded by an earlier run).
func (p *Plan) selected() int {
	n := 0

	for _, np := range p.Nodes {
		if np.Reason != ReasonNotFound {
			n++
		}
	}

	return n
}

// UnreachableError is a plan that could not read more than half of its nodes' Talos APIs (every
// one of a small fleet): it would rotate a fraction of the fleet, or none, and still look like a
// plan — a green check that did nothing.
type UnreachableError struct {
	Nodes    []NodePlan
	Selected int
	Endpoint string // where the Talos API was asked ("" the nodes' own addresses)
}

func (e *UnreachableError) Error() string {
	names := make([]string, 0, len(e.Nodes))
	for _, n := range e.Nodes {
		names = append(names, n.Name)
	}

	shown := names
	if len(shown) > 10 {
		shown = append(shown[:10:10], fmt.Sprintf("%d more", len(names)-10))
	}

	where := "their addresses"
	if e.Endpoint != "" {
		where = e.Endpoint
	}

	first := e.Nodes[0].Sentence

	return fmt.Sprintf("the Talos API of %d of the %d selected nodes could not be read (%s), asked through %s; the first said: %s. "+
		"A plan that reads no node's Talos rotates none of them: make the Talos API reachable from here (talos.endpoints, a firewall), "+
		"then plan again — or, to plan the others all the same, pass --allow-unreachable; nothing was planned",
		len(e.Nodes), e.Selected, strings.Join(shown, ", "), where, first)
}

// CheckReachable refuses a plan that could not read more than half of its selected nodes' Talos
// APIs: every one of them, or most. A node or two down in a large fleet is left alone and said.
func (p *Plan) CheckReachable(endpoint string) error {
	if gone := p.Unreachable(); len(gone) > 0 && 2*len(gone) > p.selected() {
		return &UnreachableError{Nodes: gone, Selected: p.selected(), Endpoint: endpoint}
	}

	return nil
}
