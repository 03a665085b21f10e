package talos

import (
	"context"

	"github.com/ghcrsync/ghcrsync/plan"
)

// known is what a whole read (FillFacts) learned of one node, or a read its caller vouched for
// (ConfigFacts: the proof's read of a node rotated live): a relist of a node whose Node (uid),
// boot and address did not change reuses it instead of asking its machine again. A reboot
// through this client forgets it; a write sets it aside (written) until such a read after it.
type known struct {
	uid, bootID, ip string
	facts           plan.TalosFacts
	read            Read
	written         bool
}

type reuseKey struct{}

// Reusing marks ctx: FillFacts under it reuses the facts of a node that has not changed since
// its last whole read (known). The late-node relists and the root's judgement read under it;
// plan, the credentials a run re-checks and the verdict — what says the old credential may be
// revoked — always ask every machine.
func Reusing(ctx context.Context) context.Context { return context.WithValue(ctx, reuseKey{}, true) }

func reusing(ctx context.Context) bool { v, _ := ctx.Value(reuseKey{}).(bool); return v }

// reuse fills n from what is known of it, when that still stands (reports whether it did).
func (c *Client) reuse(n *plan.Node, reads map[string]Read) bool {
	c.mu.Lock()
	defer c.mu.Unlock()

	k, ok := c.known[n.Name]
	if !ok || k.written || k.uid != n.UID || k.bootID != n.BootID || k.ip != n.InternalIP || n.UID == "" || n.BootID == "" {
		return false
	}

	facts := k.facts
	n.Talos, n.TalosError, n.TalosDenied = &facts, "", false
	reads[n.Name] = k.read

	return true
}

// learn keeps what a whole read found of n; a read that failed forgets what was known of it.
func (c *Client) learn(n *plan.Node, r Read) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if n.Talos == nil || n.TalosError != "" {
		delete(c.known, n.Name)

		return
	}

	if c.known == nil {
		c.known = map[string]known{}
	}

	c.known[n.Name] = known{uid: n.UID, bootID: n.BootID, ip: n.InternalIP, facts: *n.Talos, read: r}
}

// forget drops what is known of the node at an address: a write or a reboot is about to change
// it (forgotten before the call, so a call whose answer is lost leaves nothing to reuse).
func (c *Client) forget(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	for name, k := range c.known {
		if k.ip == ip {
			delete(c.known, name)
		}
	}
}

// writing sets aside what is known of the machine at an address: a write is about to change
// its configs (set aside before the call, so a write whose answer is lost leaves nothing to
// reuse).
func (c *Client) writing(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	for name, k := range c.known {
		if k.ip == ip {
			k.written = true
			c.known[name] = k
		}
	}
}

// vouched learns the Node at names, as a whole read would have, from a read of its configs
// the caller vouches for (ConfigFacts): its configs as read now, its Talos version and runtime
// start as at.Talos says (the start the proof's restart wait saw).
func (c *Client) vouched(at plan.Node, facts *plan.TalosFacts, r Read) {
	known := *facts
	if at.Talos != nil {
		known.Version, known.CRIStarted = at.Talos.Version, at.Talos.CRIStarted
	}

	at.Talos, at.TalosError = &known, ""
	c.learn(&at, r)
}

// named reports whether the machine at n's address said it is n in a whole read of the same Node
// (uid), boot and address: its configs are read again, its name is not. Another machine at the
// address is a replaced or re-addressed one, and each of those changes one of the three — a
// Node registered anew (uid), a machine booted (boot id), or the kubelet reporting its address
// (the address). What this cannot see: a machine that took the address of a running node
// whose kubelet has not yet reported that node's own new one (it does within its status
// update, 10 s by default). Every guard before a write, a claim or a reboot asks the name again.
func (c *Client) named(n *plan.Node) bool {
	c.mu.Lock()
	defer c.mu.Unlock()

	k, ok := c.known[n.Name]

	return ok && n.UID != "" && n.BootID != "" && k.uid == n.UID && k.bootID == n.BootID && k.ip == n.InternalIP
}
