package talos

import (
	"context"

	"github.com/ghcrsync/ghcrsync/plan"
)

// known is what a whole read (FillFacts) learned of one node, kept until a write or a reboot
// through this client touches its address: a relist of a node whose Node (uid), boot and
// address did not change, and that nothing was written to since, reuses it instead of asking
// its machine again.
type known struct {
	uid, bootID, ip string
	facts           plan.TalosFacts
	read            Read
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
	if !ok || k.uid != n.UID || k.bootID != n.BootID || k.ip != n.InternalIP || n.UID == "" || n.BootID == "" {
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
