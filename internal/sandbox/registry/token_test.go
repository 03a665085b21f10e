package registry

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The token endpoint answers both ways a real client asks — GET with Basic auth, POST with an
// OAuth2 password grant (containerd's resolver) — and refuses a bad credential on each: only a
// request with no credential gets an anonymous token.
func TestTokenEndpointSpeaksBothGrants(t *testing.T) {
	r, err := Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { r.Close(context.Background()) })
	r.AddCredential("fleet", "s3cret")

	tokenURL := r.URL() + "/token?service=sandbox-registry&scope=repository:ghcrsync/app:pull"
	form := func(v url.Values) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, r.URL()+"/token", strings.NewReader(v.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")

		return req
	}
	basic := func(user, pass string) *http.Request {
		req, _ := http.NewRequest(http.MethodGet, tokenURL, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}

		return req
	}
	password := func(user, pass string) *http.Request {
		return form(url.Values{"grant_type": {"password"}, "username": {user}, "password": {pass}, "service": {"sandbox-registry"},
			"scope": {"repository:ghcrsync/app:pull"}, "client_id": {"containerd-client"}})
	}

	for _, tc := range []struct {
		name   string
		req    *http.Request
		status int
		user   string // the grant's user when a token is given
	}{
		{"get_basic_valid", basic("fleet", "s3cret"), 200, "fleet"},
		{"get_basic_wrong_password", basic("fleet", "nope"), 401, ""},
		{"get_basic_unknown_user", basic("nobody", "s3cret"), 401, ""},
		{"get_anonymous", basic("", ""), 200, ""},
		{"post_password_valid", password("fleet", "s3cret"), 200, "fleet"},
		{"post_password_wrong", password("fleet", "nope"), 401, ""},
		{"post_password_empty", password("", ""), 401, ""},
		{"post_refresh_token", form(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {"x"}}), 400, ""},
		{"put", func() *http.Request { q, _ := http.NewRequest(http.MethodPut, r.URL()+"/token", nil); return q }(), 405, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.DefaultClient.Do(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()

			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}

			if tc.status != 200 {
				return
			}

			var body struct {
				AccessToken string `json:"access_token"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)

			r.mu.Lock()
			g, ok := r.tokens[body.AccessToken]
			r.mu.Unlock()

			if !ok || g.user != tc.user {
				t.Fatalf("token for %q, want %q", g.user, tc.user)
			}
		})
	}

	// The access log names who was answered, never a password.
	var named bool
	for _, a := range r.AccessLog() {
		named = named || (a.User == "fleet" && a.What == "token" && a.Status == 200 && a.Method == http.MethodPost)
	}

	if !named {
		t.Fatalf("the access log does not name fleet's POST grant: %+v", r.AccessLog())
	}
}
