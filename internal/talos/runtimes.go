package talos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/pool"
)

// The runtimes' restart waits of the nodes rotated live at once ask together: each question for
// a runtime's last start waits a moment for the others, then one one-to-many ServiceList answers
// them all (apid fans it out to the machines its metadata names), and the waits that follow
// line up, so a wave of live nodes polls with one call, not one a node. The moment is a quarter
// of a second: a wave's writes end spread over that much on a loaded control plane (50 ms
// shared nothing in CI: six nodes, six calls), and the runtime's restart it waits for takes
// seconds. A call that fails as a whole (a machine that never answers holds it to the deadline)
// is asked again node by node, so one bad machine fails alone.

// gather is how long a question waits for others to share its call.
const gather = 250 * time.Millisecond

type runtimeAnswer struct {
	started time.Time
	err     error
}

// runtimes are the questions waiting for the next shared call, by address.
type runtimes struct {
	mu      sync.Mutex
	waiting map[string][]chan runtimeAnswer
}

// RuntimeStarted is when the node's container runtime (its cri service) last entered Running:
// a Talos 1.14 live reload restarts it when the rendered registry config changed.
func (c *Client) RuntimeStarted(ctx context.Context, node string) (time.Time, error) {
	ch := make(chan runtimeAnswer, 1)

	c.rt.mu.Lock()
	first := len(c.rt.waiting) == 0

	if c.rt.waiting == nil {
		c.rt.waiting = map[string][]chan runtimeAnswer{}
	}

	c.rt.waiting[node] = append(c.rt.waiting[node], ch)
	c.rt.mu.Unlock()

	if first {
		go c.askRuntimes(context.WithoutCancel(ctx))
	}

	select {
	case a := <-ch:
		return a.started, a.err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// askRuntimes answers every question gathered in the next moment with one call.
func (c *Client) askRuntimes(ctx context.Context) {
	_ = clock.Sleep(ctx, clock.System, gather)

	c.rt.mu.Lock()
	waiting := c.rt.waiting
	c.rt.waiting = nil
	c.rt.mu.Unlock()

	answers := c.runtimesStarted(ctx, addresses(waiting))

	for node, chans := range waiting {
		for _, ch := range chans {
			ch <- answers[node]
		}
	}
}

func addresses(waiting map[string][]chan runtimeAnswer) []string {
	out := make([]string, 0, len(waiting))
	for node := range waiting {
		out = append(out, node)
	}

	return out
}

// runtimesStarted asks the nodes' service lists in one call, or one a node when that fails.
func (c *Client) runtimesStarted(ctx context.Context, nodes []string) map[string]runtimeAnswer {
	out := map[string]runtimeAnswer{}

	if len(nodes) > 1 {
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()

		if svc, err := c.c.MachineClient.ServiceList(client.WithNodes(cctx, nodes...), &emptypb.Empty{}); err == nil {
			for _, m := range svc.GetMessages() {
				a := runtimeAnswer{started: criStarted(m)}
				if e := m.GetMetadata().GetError(); e != "" {
					a = runtimeAnswer{err: fmt.Errorf("service list: %s", e)}
				}

				out[m.GetMetadata().GetHostname()] = a
			}

			for _, n := range nodes {
				if _, ok := out[n]; !ok {
					out[n] = runtimeAnswer{err: fmt.Errorf("service list: no reply for %s in the one-to-many call", n)}
				}
			}

			return out
		}
	}

	var mu sync.Mutex

	pool.Each(len(nodes), len(nodes), func(i int) { // one: itself; or the shared call failed as a whole
		nctx, cancel := c.bounded(ctx, nodes[i])
		defer cancel()

		a := runtimeAnswer{}
		if services, err := c.c.ServiceList(nctx); err != nil {
			a.err = fmt.Errorf("service list: %w", err)
		} else {
			a.started = CRIStarted(services)
		}

		mu.Lock()
		out[nodes[i]] = a
		mu.Unlock()
	})

	return out
}
