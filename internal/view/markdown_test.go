package view_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
)

const hostile = "::error title=pwned::owned\n::add-mask::x\r\x1b[31m| col | [link](http://evil) ![i](http://evil/i.png) <img src=x> @org/team #1 `code` **b** \u202e"

// A hostile value in any cell cannot add a column or a row, open a link, an image, an HTML
// element, code or a mention, or put a workflow command at the start of a line.
func TestMarkdownHoldsHostileValues(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	p := &plan.Plan{
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), CredentialRevision: "9f8e7d6c5b4a39281706", Registry: "ghcr.io",
		Nodes: []plan.NodePlan{
			{Name: "prod-worker-1", Role: plan.RoleWorker, Action: plan.ActionFence, Order: 1, Talos: hostile, Sentence: hostile},
			{Name: "prod-worker-2", Role: plan.RoleWorker, Action: plan.ActionDeselect, Sentence: hostile},
		},
		Secrets:  []plan.SecretPlan{{Namespace: "team-a", Secret: "ghcr-pull", Role: "consumer", Action: "update", Reason: hostile}},
		Warnings: []string{hostile},
		Summary:  plan.Summary{Fence: 1, Deselected: 1, SecretsUpdate: 1},
	}

	var b bytes.Buffer

	view.PlanMarkdown(&b, p)
	out := b.String()

	unescapedPipe := regexp.MustCompile(`(^|[^\\])\|`)
	columns := 0

	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "::") || strings.ContainsAny(line, "\r\x1b\u202e") {
			t.Errorf("unsafe line: %q", line)
		}

		if strings.HasPrefix(line, "|") {
			n := len(unescapedPipe.FindAllString(line, -1))
			if strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| #") || strings.HasPrefix(line, "| Node") || strings.HasPrefix(line, "| Secret") {
				columns = n
			} else if n != columns {
				t.Errorf("row has %d cell borders, its table %d: %s", n, columns, line)
			}
		}
	}

	for _, markup := range []string{"](", "<img", "`code`", "**b**", " @org", " #1", "![i]"} {
		if strings.Contains(out, markup) {
			t.Errorf("markup %q got through:\n%s", markup, out)
		}
	}

	if !strings.Contains(out, `\@org/team \#1`) {
		t.Errorf("the value is not shown escaped:\n%s", out)
	}
}

// An annotation holds its message on one line whatever the message holds, with the title's
// separators escaped as the runner reads them.
func TestAnnotationIsOneCommand(t *testing.T) {
	got := view.AnnotationText(view.AnnotateError, "node a:b,c", hostile)

	if strings.Count(got, "\n") != 1 || !strings.HasSuffix(got, "\n") || strings.ContainsAny(got, "\r\x1b") {
		t.Fatalf("annotation spans lines or holds controls: %q", got)
	}

	if !strings.HasPrefix(got, "::error title=node a%3Ab%2Cc::::error title=pwned") {
		t.Fatalf("annotation: %q", got)
	}

	// The legacy form is honoured anywhere in a line, an annotation's too.
	if got := view.AnnotationText(view.AnnotateError, "t ##[x]", "held by ##[add-mask]pwned"); strings.Contains(got, "##[") {
		t.Fatalf("annotation carries a legacy workflow command: %q", got)
	}

	// Through a guarded stream, mid-line: it starts a line of its own, and nothing else the
	// stream carries can start with "::".
	var b bytes.Buffer

	g := view.Guard(&b)
	_, _ = g.Write([]byte("progress " + hostile))
	view.Annotate(g, view.AnnotateWarning, "", "50% done\nnext")

	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	commands := 0

	for _, l := range lines {
		if strings.HasPrefix(strings.TrimLeft(l, " \t"), "::") {
			commands++

			if l != "::warning::50%25 done\\nnext" {
				t.Errorf("command line: %q", l)
			}
		}
	}

	if commands != 1 {
		t.Fatalf("%d command lines, want 1:\n%s", commands, b.String())
	}
}

// A plan too long for a pull-request comment is cut at a line under MarkdownLimit, saying so and
// where the whole plan is; a plan that fits is left whole (the control). The marker line names
// the cluster and cannot close its comment early, whatever the uid holds.
func TestMarkdownFitsAComment(t *testing.T) {
	short := "<!-- ghcrsync-plan cluster=x -->\n### ghcrsync plan: No changes\n"
	if got := view.Truncated(short); got != short {
		t.Fatalf("a plan that fits was changed:\n%s", got)
	}

	long := short + strings.Repeat("| prod-worker-1 | worker | v1.13.9 | fence | cordon + drain + reboot | the config changed |\n", 2000)

	got := view.Truncated(long)
	if n := len([]rune(got)); n > 65536 || n < view.MarkdownLimit-200 {
		t.Fatalf("the cut plan has %d characters", n)
	}

	if !strings.HasPrefix(got, short) || !strings.Contains(got, "was cut here") || !strings.Contains(got, "ghcrsync show --markdown") {
		t.Fatalf("the cut plan does not say so:\n%s", got[len(got)-400:])
	}

	body := strings.TrimSuffix(got[:strings.Index(got, "\n> [!NOTE]")], "\n")
	if last := body[strings.LastIndexByte(body, '\n')+1:]; !strings.HasSuffix(last, "|") {
		t.Fatalf("the plan was cut inside a line: %q", last)
	}

	p := &plan.Plan{ClusterUID: "uid --> <script>"}
	if m := view.MarkerOf(p); strings.Count(m, "-->") != 1 || !strings.HasSuffix(m, " -->") || strings.Contains(m, "<script") {
		t.Fatalf("marker %q", m)
	}
}
