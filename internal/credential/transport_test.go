package credential

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// The transport under a proof sends nothing to a destination pin refuses, whatever asked for it
// (a challenge's realm, a redirect), caps every answer, and keeps an expiry only from an
// answer to the credential. The controls: the same server, trusted, is asked and answers.
func TestPinnedTransport(t *testing.T) {
	var asked int

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked++

		w.Header().Set(ExpirationHeader, "2026-12-31 12:00:00 UTC")

		switch r.URL.Path {
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", readlimit.Body+10)))
		case "/drip":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Second)
			_, _ = w.Write([]byte("late"))
		case "/redirect":
			http.Redirect(w, r, strings.Replace("http://"+r.Host, "127.0.0.1", "localhost", 1)+"/elsewhere", http.StatusTemporaryRedirect)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name, url string
		hosts     []string
		basic     bool
		wantErr   string
		wantAsked int
		expires   bool
	}{
		{name: "trusted_host_with_the_credential", url: srv.URL + "/token", hosts: []string{"127.0.0.1"}, basic: true, wantAsked: 1, expires: true},
		{name: "trusted_host_anonymous_keeps_no_expiry", url: srv.URL + "/token", hosts: []string{"127.0.0.1"}, wantAsked: 1},
		{name: "untrusted_host", url: strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/token", hosts: []string{"127.0.0.1"}, basic: true, wantErr: "its host localhost is not trusted"},
		{name: "plain_http_to_a_remote_host", url: "http://ghcr.io/token", hosts: []string{"ghcr.io"}, basic: true, wantErr: "must be https"},
		{name: "redirect_to_an_untrusted_host", url: srv.URL + "/redirect", hosts: []string{"127.0.0.1"}, basic: true, wantErr: "its host localhost is not trusted", wantAsked: 1},
		{name: "a_body_dripped_past_the_deadline", url: srv.URL + "/drip", hosts: []string{"127.0.0.1"}, wantErr: "deadline exceeded", wantAsked: 1},
		{name: "answer_over_the_cap", url: srv.URL + "/big", hosts: []string{"127.0.0.1"}, wantErr: "larger than", wantAsked: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked = 0
			p := newPinned(tc.hosts, 500*time.Millisecond, clock.System)

			req, _ := http.NewRequest(http.MethodGet, tc.url, nil)
			if tc.basic {
				req.SetBasicAuth(user, pass)
			}

			resp, err := (&http.Client{Transport: p}).Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}

			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error naming %q", err, tc.wantErr)
			case asked != tc.wantAsked:
				t.Fatalf("the server was asked %d time(s), want %d", asked, tc.wantAsked)
			case p.expiry().IsZero() == tc.expires:
				t.Fatalf("expiry %s, want one: %v", p.expiry(), tc.expires)
			}

			var r *refusal
			if strings.Contains(tc.wantErr, "trusted") && !errors.As(err, &r) {
				t.Fatalf("not the transport's refusal: %v", err)
			}
		})
	}
}
