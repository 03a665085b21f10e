// Package metrics is a run's outcome as Prometheus metrics (the text exposition format, in the
// names and units Prometheus's naming guide asks for): a file for the node exporter's textfile
// collector, and a push to a Pushgateway. Render is pure; WriteFile and Push are the edges.
package metrics

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	neturl "net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
	"github.com/ghcrsync/ghcrsync/internal/redact"
)

// Run is what a run's metrics say.
type Run struct {
	// Configuration identifies the configuration (its Lease, namespace/name): the one label
	// every series carries, so two configurations' files or pushes never mix.
	Configuration string
	Finished      time.Time
	Duration      time.Duration
	ExitCode      int
	// Outcome is one of Outcomes.
	Outcome string
	// SafeToRevoke: the verdict found the old credential used nowhere (exit 0).
	SafeToRevoke bool
	// Nodes, PullSecrets and Templates count the run's objects by their outcome.
	Nodes, PullSecrets, Templates map[string]int
	// OldCredentialNodes are the Nodes still using the old credential at the end (the verdict);
	// OldCredentialUses every use of it (nodes, pull secrets, templates).
	OldCredentialNodes, OldCredentialUses int
	// CredentialExpires is when the new credential expires, as the registry said (zero: unknown).
	CredentialExpires time.Time
}

// Outcomes are the run outcomes: apply's (done, progressed, partial, cancelled) and those of a
// run that stopped before its work (refused: a stale or unauthentic plan; lease-held; error).
var Outcomes = []string{"done", "progressed", "partial", "cancelled", "refused", "lease-held", "error"}

// LastSuccessName is the series a run that did not succeed carries over from the last one that did.
const LastSuccessName = "ghcrsync_last_success_timestamp_seconds"

// Render writes r in the text format. lastSuccess is when the last run ended safe to revoke
// before this one (zero: never; a successful r is its own).
func Render(w io.Writer, r Run, lastSuccess time.Time) error {
	pg := &page{label: `configuration="` + escape(r.Configuration) + `"`}

	if r.SafeToRevoke {
		lastSuccess = r.Finished
	}

	pg.run(r, lastSuccess)
	pg.counts(r)
	pg.oldCredential(r)

	_, err := w.Write(pg.b.Bytes())

	return err
}

// page is the text format being written: every sample carries the configuration's label.
type page struct {
	b     bytes.Buffer
	label string
}

func (pg *page) gauge(name, help string) {
	fmt.Fprintf(&pg.b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
}

func (pg *page) sample(name, extra string, v float64) {
	labels := pg.label
	if extra != "" {
		labels += "," + extra
	}

	fmt.Fprintf(&pg.b, "%s{%s} %s\n", name, labels, strconv.FormatFloat(v, 'g', -1, 64))
}

func seconds(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }

// run is the run itself: when it ended, the last success, how long it took, its exit code and
// outcome.
func (pg *page) run(r Run, lastSuccess time.Time) {
	pg.gauge("ghcrsync_last_run_timestamp_seconds", "When the last ghcrsync apply ended.")
	pg.sample("ghcrsync_last_run_timestamp_seconds", "", seconds(r.Finished))

	if !lastSuccess.IsZero() {
		pg.gauge(LastSuccessName, "When the last ghcrsync apply ended with the old credential used nowhere (safe to revoke).")
		pg.sample(LastSuccessName, "", seconds(lastSuccess))
	}

	pg.gauge("ghcrsync_last_run_duration_seconds", "How long the last ghcrsync apply ran.")
	pg.sample("ghcrsync_last_run_duration_seconds", "", r.Duration.Seconds())

	pg.gauge("ghcrsync_last_run_exit_code", "The last ghcrsync apply's exit code (docs/ci.md).")
	pg.sample("ghcrsync_last_run_exit_code", "", float64(r.ExitCode))

	pg.gauge("ghcrsync_last_run_outcome", "The last ghcrsync apply's outcome: 1 for the one it had.")

	for _, o := range Outcomes {
		pg.sample("ghcrsync_last_run_outcome", `outcome="`+o+`"`, boolean(o == r.Outcome))
	}
}

// counts are the run's objects by outcome.
func (pg *page) counts(r Run) {
	for _, c := range []struct {
		name, help string
		by         map[string]int
	}{
		{"ghcrsync_nodes", "The last run's nodes by outcome.", r.Nodes},
		{"ghcrsync_pull_secrets", "The last run's pull secrets (consumers and the root) by outcome.", r.PullSecrets},
		{"ghcrsync_node_templates", "The last run's node templates by outcome.", r.Templates},
	} {
		pg.gauge(c.name, c.help)

		for _, k := range slices.Sorted(maps.Keys(c.by)) {
			pg.sample(c.name, `outcome="`+escape(k)+`"`, float64(c.by[k]))
		}
	}
}

// oldCredential is the verdict: whether, and where, the old credential is still used; and when
// the new one expires.
func (pg *page) oldCredential(r Run) {
	pg.gauge("ghcrsync_old_credential_in_use", "1 while the old credential is still used somewhere in the cluster (do not revoke it), else 0.")
	pg.sample("ghcrsync_old_credential_in_use", "", boolean(!r.SafeToRevoke))

	pg.gauge("ghcrsync_old_credential_nodes", "The Nodes still using the old credential at the end of the last run.")
	pg.sample("ghcrsync_old_credential_nodes", "", float64(r.OldCredentialNodes))

	pg.gauge("ghcrsync_old_credential_uses", "Every use of the old credential at the end of the last run: nodes, pull secrets, node templates.")
	pg.sample("ghcrsync_old_credential_uses", "", float64(r.OldCredentialUses))

	if !r.CredentialExpires.IsZero() {
		pg.gauge("ghcrsync_credential_expiry_timestamp_seconds", "When the new credential expires, as the registry reported it.")
		pg.sample("ghcrsync_credential_expiry_timestamp_seconds", "", seconds(r.CredentialExpires))
	}
}

// WriteFile writes r to path for the textfile collector, atomically (the collector never reads a
// half-written file), carrying over the last success of the file it replaces.
func WriteFile(path string, r Run) error {
	last := time.Time{}

	if prev, err := readlimit.File(path, 1<<20); err == nil {
		last = LastSuccess(prev, r.Configuration)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("metrics file %s: %w", path, err)
	}

	var b bytes.Buffer
	if err := Render(&b, r, last); err != nil {
		return err
	}

	if err := atomicfile.Write(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("metrics file %s: %w", path, err)
	}

	return nil
}

// LastSuccess is the last success a metrics file records for configuration (zero: none).
func LastSuccess(prev []byte, configuration string) time.Time {
	want := LastSuccessName + `{configuration="` + escape(configuration) + `"} `

	sc := bufio.NewScanner(bytes.NewReader(prev))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), want)
		if !ok {
			continue
		}

		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f > 0 {
			return time.UnixMilli(int64(f * 1000)).UTC()
		}
	}

	return time.Time{}
}

// Push sends r to the Pushgateway at gateway, grouped by job "ghcrsync" and the configuration.
// It POSTs (replacing only the series it sends): a run that did not succeed sends no last
// success, so the gateway keeps the previous run's.
func Push(ctx context.Context, client *http.Client, gateway string, r Run) error {
	var b bytes.Buffer
	if err := Render(&b, r, time.Time{}); err != nil {
		return err
	}

	url := strings.TrimRight(gateway, "/") + "/metrics/job/ghcrsync/configuration@base64/" +
		base64.RawURLEncoding.EncodeToString([]byte(r.Configuration))

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &b)
	if err != nil {
		return fmt.Errorf("push metrics: %s", redact.Error(err))
	}

	req.Header.Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")

	shown := gateway
	if u, err := neturl.Parse(gateway); err == nil {
		u.User = nil // a gateway's basic-auth password is never shown
		shown = u.String()
	}

	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("push metrics to %s: %s", shown, redact.Error(err))
	}
	defer resp.Body.Close()

	if resp.StatusCode/100 != 2 {
		body, _ := readlimit.Reader(resp.Body, 512, "the Pushgateway's answer")

		return fmt.Errorf("push metrics to %s: %s %s", shown, resp.Status, strings.TrimSpace(string(body)))
	}

	return nil
}

// escape is a label value in the text format: backslash, double quote and line feed escaped.
func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func boolean(b bool) float64 {
	if b {
		return 1
	}

	return 0
}
