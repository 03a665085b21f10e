package metrics_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/metrics"
)

// The example alert rules of docs/metrics.md: a Prometheus rule file's shape, each rule with a
// duration Prometheus parses, a severity and a summary, and every ghcrsync series it names one
// that ghcrsync writes (a renamed series fails here, not silently in someone's Prometheus).
func TestExampleAlertsNameRealSeries(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}

	m := regexp.MustCompile("(?s)```yaml\n(groups:.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/metrics.md has no ```yaml block of alert rules")
	}

	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}

	if err := yaml.UnmarshalStrict(m[1], &rules); err != nil {
		t.Fatalf("the alert rules: %v", err)
	}

	// Every series ghcrsync writes, from a run that sets every one.
	var b bytes.Buffer
	if err := metrics.Render(&b, run("done", 0, true), time.Time{}); err != nil {
		t.Fatal(err)
	}

	written := map[string]bool{}
	for name := range parse(t, b.Bytes()) {
		written[name] = true
	}

	n := 0

	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++

			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %q: want an alert name, an expression, a severity and a summary", r.Alert)
			}

			if _, err := model.ParseDuration(r.For); err != nil {
				t.Errorf("rule %s: for %q: %v", r.Alert, r.For, err)
			}

			names := regexp.MustCompile(`ghcrsync_[a-z_]+`).FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("rule %s names no ghcrsync series", r.Alert)
			}

			for _, name := range names {
				if !written[name] {
					t.Errorf("rule %s names %s, which ghcrsync does not write", r.Alert, name)
				}
			}

			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
				t.Errorf("rule %s: unbalanced parentheses", r.Alert)
			}
		}
	}

	if n < 4 {
		t.Fatalf("%d example rules, want the four docs/metrics.md describes", n)
	}
}
