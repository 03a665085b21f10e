// Package pin is the one rule for where ghcrsync may send a secret over the network: the
// registry's token realm (the password), the liveness API (the GitHub token). A destination is
// https (plain http only to a loopback host, for tests) on a host the configuration trusts.
package pin

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// URL checks a URL a secret is sent to: https (plain http only to a loopback host), and, when
// hosts is not nil, on one of hosts (compared by name: 127.0.0.1 and localhost are two hosts). The error says what to
// change; it names the host, never the whole URL (which may carry a query, or come from env()).
func URL(raw string, hosts []string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("it must be an https:// URL")
	}

	return check(u, hosts)
}

func check(u *url.URL, hosts []string) error {
	host := strings.ToLower(u.Hostname())

	if u.Scheme != "https" && !Loopback(host) {
		return fmt.Errorf("it must be https (plain http is accepted for a loopback host only), not %s://%s", u.Scheme, host)
	}

	if hosts != nil && !slices.Contains(hosts, host) {
		return fmt.Errorf("its host %s is not trusted: add it to trusted_hosts if it is yours", host)
	}

	return nil
}

// Base checks a registry endpoint is a base URL, scheme://host[:port]: a registry's API is at
// its host's root (/v2/), so a path or a query would be dropped, not used.
func Base(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return fmt.Errorf("it must be scheme://host[:port]: a registry's API is at its host's root (/v2/)")
	}

	return nil
}

// Host is the lower-case host of a URL ("" when it has none).
func Host(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}

	return strings.ToLower(u.Hostname())
}

// Loopback reports whether host is this machine: localhost or a loopback address.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}

	ip := net.ParseIP(strings.Trim(host, "[]"))

	return ip != nil && ip.IsLoopback()
}

// Redirects is an http.Client's CheckRedirect that follows a redirect only to a pinned
// destination (URL's rule), at most 5 times: a request carrying a secret is never re-sent to
// another host or over plain http.
func Redirects(hosts []string) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return fmt.Errorf("stopped after 5 redirects")
		}

		if err := check(req.URL, hosts); err != nil {
			return fmt.Errorf("refused a redirect: %w", err)
		}

		return nil
	}
}
