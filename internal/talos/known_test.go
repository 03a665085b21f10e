package talos

import (
	"context"
	"testing"

	"github.com/ghcrsync/ghcrsync/plan"
)

// A whole read's facts are reused only under Reusing, only for the same Node (uid), boot and
// address, and never after a write or a reboot through the client touched the address.
func TestKnownFactsAreReusedOnlyWhileTheyStand(t *testing.T) {
	node := func() plan.Node {
		return plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1"}
	}

	for _, tc := range []struct {
		name   string
		change func(n *plan.Node, c *Client)
		reused bool
	}{
		{"unchanged", func(*plan.Node, *Client) {}, true},
		{"another Node of the name", func(n *plan.Node, _ *Client) { n.UID = "u2" }, false},
		{"rebooted by someone", func(n *plan.Node, _ *Client) { n.BootID = "b2" }, false},
		{"another address", func(n *plan.Node, _ *Client) { n.InternalIP = "10.0.0.2" }, false},
		{"written to since", func(_ *plan.Node, c *Client) { c.forget("10.0.0.1") }, false},
		{"another machine written to", func(_ *plan.Node, c *Client) { c.forget("10.0.0.9") }, true},
		{"no boot id to compare", func(n *plan.Node, _ *Client) { n.BootID = "" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{}

			read := node()
			read.Talos = &plan.TalosFacts{Version: "v1.14.0", ConfiguredDigest: "new"}
			c.learn(&read, Read{})

			again := node()
			tc.change(&again, c)

			reads := map[string]Read{}
			if got := c.reuse(&again, reads); got != tc.reused {
				t.Fatalf("reused: %t, want %t", got, tc.reused)
			}

			if tc.reused && (again.Talos == nil || again.Talos.ConfiguredDigest != "new" || again.Talos == read.Talos) {
				t.Fatalf("reused facts %+v: want a copy of the read's", again.Talos)
			}
		})
	}

	if reusing(context.Background()) || !reusing(Reusing(context.Background())) {
		t.Fatal("Reusing does not mark the context")
	}
}

// A whole read that failed forgets what an earlier one found: the next reuse asks the machine.
func TestAFailedReadForgets(t *testing.T) {
	c := &Client{}
	n := plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1", Talos: &plan.TalosFacts{Version: "v1.14.0"}}
	c.learn(&n, Read{})

	failed := plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1", TalosError: "unavailable"}
	c.learn(&failed, Read{})

	if c.reuse(&plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1"}, map[string]Read{}) {
		t.Fatal("the facts of a node whose last read failed were reused")
	}
}
