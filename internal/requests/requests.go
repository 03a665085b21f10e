// Package requests counts the calls ghcrsync makes to the Kubernetes API and to Talos, so a
// command can say what it cost (`plan --verbose`) and a benchmark can record it.
package requests

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
)

// Counter counts calls by kind (an HTTP verb, a gRPC method), and by the step that made them
// (WithStep). Safe for concurrent use.
type Counter struct {
	mu     sync.Mutex
	n      map[string]int
	byStep map[string]map[string]int
}

// Add counts one call of kind.
func (c *Counter) Add(kind string) { c.add(context.Background(), kind) }

// add counts one call of kind, under the step ctx names, if any.
func (c *Counter) add(ctx context.Context, kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.n == nil {
		c.n = map[string]int{}
	}

	c.n[kind]++

	step, _ := ctx.Value(stepKey{}).(string)
	if step == "" {
		return
	}

	if c.byStep == nil {
		c.byStep = map[string]map[string]int{}
	}

	if c.byStep[step] == nil {
		c.byStep[step] = map[string]int{}
	}

	c.byStep[step][kind]++
}

type stepKey struct{}

// WithStep names the step whose calls ctx carries: a Counter tallies them under it too.
func WithStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, stepKey{}, step)
}

// ByStep is the calls counted under each step named by WithStep: step → kind → count.
func (c *Counter) ByStep() map[string]map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()

	out := make(map[string]map[string]int, len(c.byStep))
	for step, kinds := range c.byStep {
		out[step] = maps.Clone(kinds)
	}

	return out
}

// Total is the number of calls counted.
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()

	t := 0
	for _, v := range c.n {
		t += v
	}

	return t
}

// String is "N (kind a, kind b, …)", kinds sorted.
func (c *Counter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()

	return tally(c.n)
}

// tally renders counts by kind as "N (kind a, kind b, …)", kinds sorted; "0" when none.
func tally(n map[string]int) string {
	kinds := make([]string, 0, len(n))
	total := 0

	for k, v := range n {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
		total += v
	}

	sort.Strings(kinds)

	if total == 0 {
		return "0"
	}

	return fmt.Sprintf("%d (%s)", total, strings.Join(kinds, ", "))
}

// Steps renders the calls each named step made to Kubernetes and to Talos (either counter may
// be nil), one line per step, steps sorted, then the calls made under no step; "" when no call
// was made under a step.
func Steps(kube, talos *Counter) string {
	var by [2]map[string]map[string]int

	steps := map[string]bool{}

	for i, c := range []*Counter{kube, talos} {
		if c != nil {
			by[i] = c.ByStep()
			for step := range by[i] {
				steps[step] = true
			}
		}
	}

	if len(steps) == 0 {
		return ""
	}

	var b strings.Builder

	for _, step := range slices.Sorted(maps.Keys(steps)) {
		fmt.Fprintf(&b, "  %-12s Kubernetes %s; Talos %s\n", step, tally(by[0][step]), tally(by[1][step]))
	}

	rest := [2]map[string]int{}

	for i, c := range []*Counter{kube, talos} {
		if c == nil {
			continue
		}

		c.mu.Lock()
		rest[i] = maps.Clone(c.n)
		c.mu.Unlock()

		for _, kinds := range by[i] {
			for k, v := range kinds {
				if rest[i][k] -= v; rest[i][k] == 0 {
					delete(rest[i], k)
				}
			}
		}
	}

	fmt.Fprintf(&b, "  %-12s Kubernetes %s; Talos %s\n", "(no step)", tally(rest[0]), tally(rest[1]))

	return b.String()
}

// Transport wraps an HTTP round-tripper (client-go's rest.Config.Wrap) and counts each request
// by verb: GET of a collection is counted as LIST.
func (c *Counter) Transport(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{c: c, next: rt}
}

type roundTripper struct {
	c    *Counter
	next http.RoundTripper
}

func (r roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r.c.add(req.Context(), verb(req))

	return r.next.RoundTrip(req)
}

// verb names a Kubernetes API request: LIST for a GET of a collection (a path ending in a
// resource type, not a name), WATCH for ?watch, else the HTTP method.
func verb(req *http.Request) string {
	if req.Method != http.MethodGet {
		return req.Method
	}

	if req.URL.Query().Get("watch") == "true" {
		return "WATCH"
	}

	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	// /api/v1/nodes, /api/v1/namespaces/NS/pods, /apis/GROUP/VERSION/namespaces/NS/leases
	rest := parts
	if len(rest) > 0 && rest[0] == "api" && len(rest) >= 2 {
		rest = rest[2:]
	} else if len(rest) > 0 && rest[0] == "apis" && len(rest) >= 3 {
		rest = rest[3:]
	}

	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) != 2 {
		rest = rest[2:]
	}

	if len(rest) == 1 {
		return "LIST"
	}

	return "GET"
}

// UnaryInterceptor counts each unary gRPC call by method name (its last path element).
func (c *Counter) UnaryInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		c.add(ctx, method[strings.LastIndexByte(method, '/')+1:])

		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamInterceptor counts each streaming gRPC call by method name.
func (c *Counter) StreamInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		c.add(ctx, method[strings.LastIndexByte(method, '/')+1:])

		return streamer(ctx, desc, cc, method, opts...)
	}
}
