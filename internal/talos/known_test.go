package talos

import (
	"context"
	"testing"
	"time"

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
		{"written to since", func(_ *plan.Node, c *Client) { c.writing("10.0.0.1") }, false},
		{"rebooted through the client", func(_ *plan.Node, c *Client) { c.forget("10.0.0.1") }, false},
		{"another machine written to", func(_ *plan.Node, c *Client) { c.writing("10.0.0.9") }, true},
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

// A read of the machine's configs its caller vouches for (the proof's, after a live write) is
// known as a whole read's: its configs as read then, its version and runtime start as the
// caller says. Before it the write keeps what was known from being reused.
func TestAVouchedReadIsKnown(t *testing.T) {
	c := &Client{}
	started := time.Date(2026, 12, 8, 1, 0, 0, 0, time.UTC)
	n := plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1",
		Talos: &plan.TalosFacts{Version: "v1.14.0", ConfiguredDigest: "old", CRIStarted: started}}
	c.learn(&n, Read{})

	again := func() (plan.Node, bool) {
		m := plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1"}
		ok := c.reuse(&m, map[string]Read{})

		return m, ok
	}

	c.writing("10.0.0.1")

	if _, ok := again(); ok {
		t.Fatal("reused before the configs were read after the write")
	}

	read := &plan.TalosFacts{ConfiguredDigest: "new", ConfigUpdated: started.Add(30 * time.Second)}
	c.vouched(plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1",
		Talos: &plan.TalosFacts{Version: "v1.14.0", CRIStarted: started.Add(time.Minute)}}, read, Read{})

	m, ok := again()
	switch {
	case !ok:
		t.Fatal("not reused after the vouched read")
	case m.Talos.ConfiguredDigest != "new" || m.Talos.Version != "v1.14.0" || !m.Talos.CRIStarted.Equal(started.Add(time.Minute)):
		t.Fatalf("known facts %+v: want the new digest, the version, the runtime's start the caller saw", m.Talos)
	}

	fresh := &Client{} // nothing known before: the vouched read is all there is
	fresh.vouched(plan.Node{Name: "w2", UID: "u2", BootID: "b2", InternalIP: "10.0.0.2", Talos: &plan.TalosFacts{Version: "v1.14.0"}}, read, Read{})

	if !fresh.reuse(&plan.Node{Name: "w2", UID: "u2", BootID: "b2", InternalIP: "10.0.0.2"}, map[string]Read{}) {
		t.Fatal("a vouched read of a node not known before is not known")
	}
}

// A machine's name is asked again unless a whole read found it at the same Node (uid), boot
// and address: a replaced or re-addressed machine changes one of them.
func TestTheNameIsAskedOnceANodeBootAndAddress(t *testing.T) {
	for _, tc := range []struct {
		name  string
		again plan.Node
		named bool
	}{
		{"unchanged", plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1"}, true},
		{"registered anew", plan.Node{Name: "w1", UID: "u2", BootID: "b1", InternalIP: "10.0.0.1"}, false},
		{"booted", plan.Node{Name: "w1", UID: "u1", BootID: "b2", InternalIP: "10.0.0.1"}, false},
		{"another address", plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.2"}, false},
		{"never read", plan.Node{Name: "w2", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1"}, false},
		{"no boot id", plan.Node{Name: "w1", UID: "u1", InternalIP: "10.0.0.1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{}
			read := plan.Node{Name: "w1", UID: "u1", BootID: "b1", InternalIP: "10.0.0.1", Talos: &plan.TalosFacts{Version: "v1.14.0"}}
			c.learn(&read, Read{})
			c.writing("10.0.0.1") // a write changes the configs, not the machine's name

			if got := c.named(&tc.again); got != tc.named {
				t.Fatalf("named: %t, want %t", got, tc.named)
			}
		})
	}
}
