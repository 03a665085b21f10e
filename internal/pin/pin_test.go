package pin

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	trusted := []string{"ghcr.io"}

	for _, tc := range []struct {
		name, url string
		hosts     []string
		want      string // "" = accepted
	}{
		{"https_on_a_trusted_host", "https://ghcr.io/token", trusted, ""},
		{"https_anywhere_without_a_list", "https://registry.example.com", nil, ""},
		{"http_to_loopback", "http://127.0.0.1:5000/token", []string{"127.0.0.1"}, ""},
		{"http_to_localhost", "http://localhost:5000", []string{"localhost"}, ""},
		{"http_to_ipv6_loopback", "http://[::1]:5000", []string{"::1"}, ""},
		{"another_loopback_name_is_another_host", "http://localhost:5000", []string{"127.0.0.1"}, "its host localhost is not trusted"},
		{"plain_http_elsewhere", "http://ghcr.io/token", trusted, "must be https"},
		{"untrusted_host", "https://evil.example.com/token", trusted, "its host evil.example.com is not trusted"},
		{"host_case_ignored", "https://GHCR.io/token", trusted, ""},
		{"not_a_url", "ghcr.io/token", trusted, "must be an https:// URL"},
		{"another_scheme", "ftp://ghcr.io", trusted, "must be an https:// URL"},
		{"userinfo_does_not_fool_it", "https://ghcr.io@evil.example.com/", trusted, "evil.example.com is not trusted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := URL(tc.url, tc.hosts)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRedirects(t *testing.T) {
	check := Redirects([]string{"ghcr.io"})
	req := func(raw string) *http.Request { u, _ := url.Parse(raw); return &http.Request{URL: u} }

	if err := check(req("https://ghcr.io/v2/x"), nil); err != nil {
		t.Fatalf("a redirect on the trusted host: %v", err)
	}

	for _, bad := range []string{"https://evil.example.com/", "http://ghcr.io/"} {
		if err := check(req(bad), nil); err == nil || !strings.Contains(err.Error(), "refused a redirect") {
			t.Errorf("redirect to %s: %v", bad, err)
		}
	}

	if err := check(req("https://ghcr.io/"), make([]*http.Request, 5)); err == nil {
		t.Error("a sixth redirect was followed")
	}
}
