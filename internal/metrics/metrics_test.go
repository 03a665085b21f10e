package metrics_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ghcrsync/ghcrsync/internal/metrics"
)

var (
	finished = time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	expires  = time.Date(2027, 3, 7, 0, 0, 0, 0, time.UTC)
)

func run(outcome string, exit int, safe bool) metrics.Run {
	return metrics.Run{
		Configuration: `flux-system/ghcr-auth-refresh "quoted"` + "\nline", Finished: finished, Duration: 754 * time.Second, ExitCode: exit, Outcome: outcome,
		SafeToRevoke: safe, Nodes: map[string]int{"done": 4, "failed": 1}, PullSecrets: map[string]int{"written": 3, "held-back": 1},
		Templates: map[string]int{"written": 1}, OldCredentialNodes: 1, OldCredentialUses: 2, CredentialExpires: expires,
	}
}

// parse reads the text format with Prometheus's own parser.
func parse(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()

	p := expfmt.NewTextParser(model.UTF8Validation)

	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("Prometheus's text parser refuses the metrics: %v\n%s", err, b)
	}

	return fams
}

// value is the one sample of name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()

	f, ok := fams[name]
	if !ok {
		t.Fatalf("no series %s", name)
	}

	if f.GetType() != dto.MetricType_GAUGE || f.GetHelp() == "" {
		t.Fatalf("%s: type %s, help %q: want a gauge with help", name, f.GetType(), f.GetHelp())
	}

next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}

		if labels["configuration"] != `flux-system/ghcr-auth-refresh "quoted"`+"\nline" {
			t.Fatalf("%s: configuration label %q", name, labels["configuration"])
		}

		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}

		return m.GetGauge().GetValue()
	}

	t.Fatalf("no sample of %s with %v", name, want)

	return 0
}

func TestRender(t *testing.T) {
	for _, tc := range []struct {
		name        string
		run         metrics.Run
		lastSuccess time.Time
		wantSuccess float64 // 0: no series
	}{
		{"a_partial_run_keeps_the_last_success", run("partial", 5, false), finished.Add(-48 * time.Hour), float64(finished.Add(-48 * time.Hour).Unix())},
		{"a_successful_run_is_its_own", run("done", 0, true), finished.Add(-48 * time.Hour), float64(finished.Unix())},
		{"never_succeeded", run("lease-held", 4, false), time.Time{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := metrics.Render(&b, tc.run, tc.lastSuccess); err != nil {
				t.Fatal(err)
			}

			fams := parse(t, b.Bytes())

			if _, ok := fams[metrics.LastSuccessName]; ok != (tc.wantSuccess != 0) {
				t.Fatalf("last success present %v, want %v", ok, tc.wantSuccess != 0)
			} else if ok && value(t, fams, metrics.LastSuccessName, nil) != tc.wantSuccess {
				t.Fatalf("last success %v, want %v", value(t, fams, metrics.LastSuccessName, nil), tc.wantSuccess)
			}

			for name, want := range map[string]float64{
				"ghcrsync_last_run_timestamp_seconds":          float64(finished.Unix()),
				"ghcrsync_last_run_duration_seconds":           754,
				"ghcrsync_last_run_exit_code":                  float64(tc.run.ExitCode),
				"ghcrsync_old_credential_in_use":               map[bool]float64{true: 0, false: 1}[tc.run.SafeToRevoke],
				"ghcrsync_old_credential_nodes":                1,
				"ghcrsync_old_credential_uses":                 2,
				"ghcrsync_credential_expiry_timestamp_seconds": float64(expires.Unix()),
			} {
				if got := value(t, fams, name, nil); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}

			for _, o := range metrics.Outcomes {
				if got := value(t, fams, "ghcrsync_last_run_outcome", map[string]string{"outcome": o}); got != map[bool]float64{true: 1, false: 0}[o == tc.run.Outcome] {
					t.Errorf("outcome %s = %v", o, got)
				}
			}

			if value(t, fams, "ghcrsync_nodes", map[string]string{"outcome": "failed"}) != 1 ||
				value(t, fams, "ghcrsync_pull_secrets", map[string]string{"outcome": "held-back"}) != 1 ||
				value(t, fams, "ghcrsync_node_templates", map[string]string{"outcome": "written"}) != 1 {
				t.Error("the counts by outcome are wrong")
			}
		})
	}
}

// The textfile: written atomically, a failed run carries the last success of the file it
// replaces; a file of another configuration's does not lend it its success.
func TestWriteFileCarriesTheLastSuccess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ghcrsync.prom")

	ok := run("done", 0, true)
	if err := metrics.WriteFile(path, ok); err != nil {
		t.Fatal(err)
	}

	later := run("partial", 5, false)
	later.Finished = finished.Add(time.Hour)

	if err := metrics.WriteFile(path, later); err != nil {
		t.Fatal(err)
	}

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if got := value(t, parse(t, b), metrics.LastSuccessName, nil); got != float64(finished.Unix()) {
		t.Fatalf("the failed run's file says the last success was %v, want %v", got, finished.Unix())
	}

	if !metrics.LastSuccess(b, "another/configuration").IsZero() {
		t.Fatal("another configuration's success was read as this one's")
	}
}

// The push: a POST (only the series sent are replaced: a failed run leaves the gateway's last
// success), grouped by job and the configuration, in the text format; an error answer is an
// error, and a gateway's basic-auth password is never shown.
func TestPush(t *testing.T) {
	var got struct {
		method, path, contentType string
		body                      []byte
	}

	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path, got.contentType = r.Method, r.URL.Path, r.Header.Get("Content-Type")
		got.body, _ = io.ReadAll(r.Body)

		if strings.Contains(r.URL.Path, "refuse") {
			http.Error(w, "bad metrics", http.StatusBadRequest)
		}
	}))
	defer gw.Close()

	if err := metrics.Push(context.Background(), gw.Client(), gw.URL, run("partial", 5, false)); err != nil {
		t.Fatal(err)
	}

	if got.method != http.MethodPost || !strings.HasPrefix(got.path, "/metrics/job/ghcrsync/configuration@base64/") || !strings.HasPrefix(got.contentType, "text/plain") {
		t.Fatalf("push: %s %s (%s)", got.method, got.path, got.contentType)
	}

	if _, ok := parse(t, got.body)[metrics.LastSuccessName]; ok {
		t.Fatal("a failed run pushed a last success")
	}

	u := strings.Replace(gw.URL, "http://", "http://user:s3cret@", 1) + "/refuse"
	if err := metrics.Push(context.Background(), gw.Client(), u, run("done", 0, true)); err == nil || strings.Contains(err.Error(), "s3cret") ||
		!strings.Contains(err.Error(), "400") {
		t.Fatalf("a refused push: %v", err)
	}
}
