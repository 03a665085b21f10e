package requests

import (
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
