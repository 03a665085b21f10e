package requests

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestVerb(t *testing.T) {
	for _, tc := range []struct{ name, method, url, want string }{
		{"list_nodes", "GET", "/api/v1/nodes", "LIST"},
		{"get_node", "GET", "/api/v1/nodes/prod-worker-1", "GET"},
		{"list_namespaced", "GET", "/api/v1/namespaces/team-a/secrets", "LIST"},
		{"get_namespaced", "GET", "/api/v1/namespaces/team-a/secrets/ghcr-pull", "GET"},
		{"get_namespace", "GET", "/api/v1/namespaces/kube-system", "GET"},
		{"list_namespaces", "GET", "/api/v1/namespaces", "LIST"},
		{"group_lease", "GET", "/apis/coordination.k8s.io/v1/namespaces/flux-system/leases/ghcr-auth-refresh", "GET"},
		{"watch", "GET", "/api/v1/nodes?watch=true", "WATCH"},
		{"patch", "PATCH", "/api/v1/nodes/prod-worker-1", "PATCH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.url, nil)
			if got := verb(req); got != tc.want {
				t.Fatalf("verb(%s %s) = %s, want %s", tc.method, tc.url, got, tc.want)
			}
		})
	}
}

func TestTransportCounts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()

	var c Counter

	client := &http.Client{Transport: c.Transport(http.DefaultTransport)}
	for _, p := range []string{"/api/v1/nodes", "/api/v1/nodes/a", "/api/v1/nodes/b"} {
		resp, err := client.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}

		resp.Body.Close()
	}

	if c.Total() != 3 || c.String() != "3 (GET 2, LIST 1)" {
		t.Fatalf("counted %s", c.String())
	}
}

func TestStepsTallyCallsByTheStepTheirContextNames(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()

	var kube, talos Counter

	client := &http.Client{Transport: kube.Transport(http.DefaultTransport)}
	get := func(ctx context.Context, path string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}

		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}

		resp.Body.Close()
	}

	ctx := context.Background()
	get(WithStep(ctx, "prove"), "/api/v1/nodes/a")
	get(WithStep(ctx, "prove"), "/api/v1/namespaces/probe/pods")
	get(WithStep(ctx, "configure"), "/api/v1/nodes/a")
	get(ctx, "/api/v1/nodes")
	talos.add(WithStep(ctx, "configure"), "ApplyConfiguration")

	want := "  configure    Kubernetes 1 (GET 1); Talos 1 (ApplyConfiguration 1)\n" +
		"  prove        Kubernetes 2 (GET 1, LIST 1); Talos 0\n" +
		"  (no step)    Kubernetes 1 (LIST 1); Talos 0\n"
	if got := Steps(&kube, &talos); got != want {
		t.Fatalf("Steps =\n%s\nwant\n%s", got, want)
	}

	if kube.String() != "4 (GET 2, LIST 2)" {
		t.Fatalf("the total counts every call: %s", kube.String())
	}

	var none Counter
	if got := Steps(&none, nil); got != "" {
		t.Fatalf("no step named: Steps = %q, want empty", got)
	}
}
