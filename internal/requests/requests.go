// Package requests counts the calls ghcrsync makes to the Kubernetes API and to Talos, so a
// command can say what it cost (`plan --verbose`) and a benchmark can record it.
package requests

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
)

// Counter counts calls by kind (an HTTP verb, a gRPC method). Safe for concurrent use.
type Counter struct {
	mu sync.Mutex
	n  map[string]int
}

// Add counts one call of kind.
func (c *Counter) Add(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.n == nil {
		c.n = map[string]int{}
	}

	c.n[kind]++
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

	kinds := make([]string, 0, len(c.n))
	total := 0

	for k, v := range c.n {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
		total += v
	}

	sort.Strings(kinds)

	if total == 0 {
		return "0"
	}

	return fmt.Sprintf("%d (%s)", total, strings.Join(kinds, ", "))
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
	r.c.Add(verb(req))

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
		c.Add(method[strings.LastIndexByte(method, '/')+1:])

		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamInterceptor counts each streaming gRPC call by method name.
func (c *Counter) StreamInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		c.Add(method[strings.LastIndexByte(method, '/')+1:])

		return streamer(ctx, desc, cc, method, opts...)
	}
}
