package sandboxtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Dropper loses answers: the request reaches the server, which carries it out, and then the
// client is told the connection was reset — what a timeout, a connection cut by the endpoint's
// reboot, or a signal inside the request looks like from the client. Rules are armed per verb
// (HTTP method or gRPC method) and object; each fires a given number of times.
type Dropper struct {
	mu    sync.Mutex
	rules []*dropRule
	fired []string
}

type dropRule struct {
	method, path, body string
	left               int
}

// Arm loses the answers of the next n requests with method (an HTTP method, or a gRPC method
// such as "/machine.MachineService/Reboot"), whose path contains path and whose body contains
// body ("" matches any).
func (d *Dropper) Arm(method, path, body string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()

	d.rules = append(d.rules, &dropRule{method: method, path: path, body: body, left: n})
}

// Fired lists the requests whose answers were lost, in order.
func (d *Dropper) Fired() []string {
	d.mu.Lock()
	defer d.mu.Unlock()

	return append([]string(nil), d.fired...)
}

func (d *Dropper) match(method, path string, body []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()

	for _, r := range d.rules {
		if r.left > 0 && r.method == method && strings.Contains(path, r.path) && bytes.Contains(body, []byte(r.body)) {
			r.left--
			d.fired = append(d.fired, method+" "+path)

			return true
		}
	}

	return false
}

// Kube wraps a Kubernetes client's transport.
func (d *Dropper) Kube(rt http.RoundTripper) http.RoundTripper {
	return roundTrip(func(req *http.Request) (*http.Response, error) {
		var body []byte

		if req.Body != nil && req.GetBody != nil {
			b, err := req.GetBody()
			if err == nil {
				body, _ = io.ReadAll(b)
				b.Close()
			}
		}

		// A server-side dry run is no write: its answer is never lost.
		drop := !strings.Contains(req.URL.RawQuery, "dryRun") && d.match(req.Method, req.URL.Path, body)

		resp, err := rt.RoundTrip(req)
		if err != nil || !drop {
			return resp, err
		}

		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()

		return nil, fmt.Errorf("sandbox dropped the answer (%d) of %s %s: %w", resp.StatusCode, req.Method, req.URL.Path, syscall.ECONNRESET)
	})
}

// Talos is a gRPC client interceptor that loses the answers of matching Talos calls.
func (d *Dropper) Talos() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		drop := d.match(method, method, nil)

		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil || !drop {
			return err
		}

		return status.Error(codes.Unavailable, "sandbox dropped the answer of "+method+": connection reset by peer")
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
