package verdict

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// apply --metrics-file on the sandbox: a rotation writes a file Prometheus's own parser reads,
// with the run's outcome (done, exit 0, the old credential used nowhere, the nodes done) and its
// last success; then a saved plan made stale by another rotation of the credential is refused
// (exit 3): the file says refused and keeps the last success — what an alert on a stalled
// rotation reads.
func TestApplyWritesItsMetrics(t *testing.T) {
	sb := sandboxtest.Get(t)
	cfg := config(t, sb, nil)
	prom := filepath.Join(t.TempDir(), "ghcrsync.prom")

	rotate(t, sb, "metrics")

	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", cfg, "--metrics-file", prom); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	done := readMetrics(t, prom)
	success := gauge(t, done, "ghcrsync_last_success_timestamp_seconds", "")

	if gauge(t, done, "ghcrsync_last_run_outcome", "done") != 1 || gauge(t, done, "ghcrsync_last_run_exit_code", "") != 0 ||
		gauge(t, done, "ghcrsync_old_credential_in_use", "") != 0 || gauge(t, done, "ghcrsync_nodes", "done") < 1 ||
		success != gauge(t, done, "ghcrsync_last_run_timestamp_seconds", "") {
		t.Fatalf("after a rotation the metrics say:\n%s", mustRead(t, prom))
	}

	// A plan made stale: refused, exit 3; the last success stays.
	plan := filepath.Join(t.TempDir(), "plan.out")
	rotate(t, sb, "metrics-next")

	if r := ghcrsync(t, sb, "plan", "--config", cfg, "--out", plan); r.code != 0 {
		t.Fatalf("plan: exit %d\n%s", r.code, r.stderr)
	}

	rotate(t, sb, "metrics-stale")

	if r := ghcrsync(t, sb, "apply", "--config", cfg, "--metrics-file", prom, plan); r.code != 3 {
		t.Fatalf("a stale plan: exit %d, want 3\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	refused := readMetrics(t, prom)
	if gauge(t, refused, "ghcrsync_last_run_outcome", "refused") != 1 || gauge(t, refused, "ghcrsync_last_run_exit_code", "") != 3 ||
		gauge(t, refused, "ghcrsync_last_success_timestamp_seconds", "") != success ||
		gauge(t, refused, "ghcrsync_last_run_timestamp_seconds", "") <= success {
		t.Fatalf("after a refused run the metrics say:\n%s", mustRead(t, prom))
	}

	// The cluster converged again for the tests after this one.
	converge(t, sb)
}

func mustRead(t *testing.T, path string) string {
	t.Helper()

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	return string(b)
}

// readMetrics parses the file with Prometheus's own text parser.
func readMetrics(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()

	p := expfmt.NewTextParser(model.UTF8Validation)

	fams, err := p.TextToMetricFamilies(strings.NewReader(mustRead(t, path)))
	if err != nil {
		t.Fatalf("%s does not parse: %v", path, err)
	}

	return fams
}

// gauge is the value of name's sample whose outcome label is outcome ("": the one sample).
func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name, outcome string) float64 {
	t.Helper()

	f := fams[name]
	if f == nil {
		t.Fatalf("no series %s", name)
	}

	for _, m := range f.GetMetric() {
		got := ""

		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" {
				got = l.GetValue()
			}
		}

		if got == outcome {
			return m.GetGauge().GetValue()
		}
	}

	t.Fatalf("no sample of %s with outcome %q", name, outcome)

	return 0
}
