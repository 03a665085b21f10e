package apply

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/plan"
)

// watchedAPI is the API behind the watch: each Get answers the Node at its resourceVersion and is
// counted, so a case can tell a read the watch served from one it sent to the API.
type watchedAPI struct {
	Nodes // the methods a case does not reach
	nodes map[string]*corev1.Node
	gets  int
}

func (a *watchedAPI) Get(_ context.Context, name string) (*corev1.Node, error) {
	a.gets++

	n, ok := a.nodes[name]
	if !ok {
		return nil, errors.New("not found: " + name)
	}

	return n.DeepCopy(), nil
}

// testWatch is a Node watch holding nodes, fresh or quiet.
type testWatch struct {
	fresh bool
	nodes map[string]*corev1.Node
}

func (w *testWatch) Fresh(time.Duration) bool { return w.fresh }

func (w *testWatch) Get(name string) (*corev1.Node, bool) {
	n, ok := w.nodes[name]
	if !ok {
		return nil, false
	}

	return n.DeepCopy(), true
}

func (w *testWatch) Changes(context.Context, string) <-chan struct{} { return nil }

func (w *testWatch) Destinations(context.Context) ([]plan.Destination, error) { return nil, nil }

// casFrom is the compare-and-swap the watch's read starts: it records the Node it started from
// and answers it one resourceVersion on, marked.
type casFrom struct {
	Watches
	api   *watchedAPI
	first *corev1.Node
}

func (c *casFrom) CASPatchFrom(ctx context.Context, first *corev1.Node, name string, _ int, _ func(*corev1.Node) error,
	_ func(*corev1.Node) map[string]any, _ func(int)) (*corev1.Node, error) {
	c.first = first

	n := first
	if n == nil {
		var err error
		if n, err = c.api.Get(ctx, name); err != nil {
			return nil, err
		}
	}

	out := n.DeepCopy()
	out.ResourceVersion = "100"
	out.Annotations = map[string]string{"written": "yes"}

	return out, nil
}

func node(name, rv, seen string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv, Annotations: map[string]string{"seen": seen}}}
}

// TestWatchedNodesGet is the watch's freshness rule: a Node is served from a busy watch, from the
// run's own write when that is newer, and from the API when the watch is quiet or does not hold it.
func TestWatchedNodesGet(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fresh    bool
		watch    *corev1.Node // the watch's copy of n1 (nil: it holds none)
		own      *corev1.Node // the run's last write to n1 (nil: none)
		wantSeen string
		wantAPI  int // Gets sent to the API
	}{
		{"a busy watch serves the Node", true, node("n1", "10", "watch"), nil, "watch", 0},
		{"a quiet watch sends the read to the API", false, node("n1", "10", "watch"), nil, "api", 1},
		{"a Node the watch does not hold is read from the API", true, nil, nil, "api", 1},
		{"the run's own write, newer than the watch, is served", true, node("n1", "10", "watch"), node("n1", "11", "own"), "own", 0},
		{"the watch, caught up past the run's write, is served", true, node("n1", "12", "watch"), node("n1", "11", "own"), "watch", 0},
		{"a resourceVersion that is not a number is not taken as newer", true, node("n1", "10", "watch"), node("n1", "x", "own"), "watch", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &watchedAPI{nodes: map[string]*corev1.Node{"n1": node("n1", "9", "api")}}
			w := &testWatch{fresh: tc.fresh, nodes: map[string]*corev1.Node{}}

			if tc.watch != nil {
				w.nodes["n1"] = tc.watch
			}

			wn := &watchedNodes{Nodes: api, watch: w, wrote: map[string]*corev1.Node{}}
			if tc.own != nil {
				wn.wrote["n1"] = tc.own
			}

			n, err := wn.Get(context.Background(), "n1")
			if err != nil {
				t.Fatal(err)
			}

			if got := n.Annotations["seen"]; got != tc.wantSeen || api.gets != tc.wantAPI {
				t.Errorf("served %q with %d API reads, want %q with %d", got, api.gets, tc.wantSeen, tc.wantAPI)
			}
		})
	}
}

// TestWatchedNodesCASPatch: the compare-and-swap starts from the Node the watch served (no GET),
// and its answer is what the next read serves while the watch has not caught up.
func TestWatchedNodesCASPatch(t *testing.T) {
	api := &watchedAPI{nodes: map[string]*corev1.Node{"n1": node("n1", "9", "api")}}
	w := &testWatch{fresh: true, nodes: map[string]*corev1.Node{"n1": node("n1", "10", "watch")}}
	cas := &casFrom{api: api}
	wn := &watchedNodes{Nodes: api, kube: cas, watch: w, wrote: map[string]*corev1.Node{}}

	if _, err := wn.CASPatch(context.Background(), "n1", 10, nil, nil, nil); err != nil {
		t.Fatal(err)
	}

	if cas.first == nil || cas.first.Annotations["seen"] != "watch" || api.gets != 0 {
		t.Fatalf("the patch started from %v with %d API reads, want the watch's Node and none", cas.first, api.gets)
	}

	n, err := wn.Get(context.Background(), "n1")
	if err != nil {
		t.Fatal(err)
	}

	if n.Annotations["written"] != "yes" {
		t.Errorf("after the write the read served %v, want the write's answer (the watch is behind it)", n.Annotations)
	}

	// Control: a quiet watch gives the patch no start; it reads the Node itself.
	w.fresh = false

	if _, err := wn.CASPatch(context.Background(), "n1", 10, nil, nil, nil); err != nil {
		t.Fatal(err)
	}

	if cas.first == nil || cas.first.Annotations["seen"] != "api" {
		t.Errorf("with the watch quiet the patch started from %v, want the API's Node", cas.first)
	}
}

// provers record which path proved a runtime.
type provers struct{ by string }

type proveBy struct {
	p    *provers
	name string
}

func (p proveBy) ProveRuntime(context.Context, string, plan.Probe, time.Duration) error {
	p.p.by = p.name

	return nil
}

func (proveBy) Wait() {}

// TestWatchedNodesProveRuntime: a proof follows its pod in the probe watch when there is one, and
// through the API (its own watch of one pod) when the probe watch did not start.
func TestWatchedNodesProveRuntime(t *testing.T) {
	p := &provers{}

	for _, tc := range []struct {
		name   string
		probes bool
		want   string
	}{
		{"the run's probe watch", true, "watch"},
		{"no probe watch: the pod's own", false, "api"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wn := &watchedNodes{workloads: workloadsProving{p}, watch: &testWatch{}}
			if tc.probes {
				wn.probes = proveBy{p, "watch"}
			}

			if err := wn.ProveRuntime(context.Background(), "n1", plan.Probe{}, time.Second); err != nil {
				t.Fatal(err)
			}

			if p.by != tc.want {
				t.Errorf("proved by %q, want %q", p.by, tc.want)
			}
		})
	}
}

// workloadsProving is the API's proof path.
type workloadsProving struct{ p *provers }

func (w workloadsProving) ProveRuntime(context.Context, string, plan.Probe, time.Duration) error {
	w.p.by = "api"

	return nil
}

func (workloadsProving) Drain(context.Context, string, time.Duration, progress.Func, drain.Check) error {
	return nil
}

func (workloadsProving) Destinations(context.Context) ([]plan.Destination, error) { return nil, nil }
