package view

import (
	"fmt"
	"io"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/plan"
)

// MarkdownMarker opens every Markdown plan's first line, which names the cluster the plan is for
// (Marker): a workflow finds the comment it posted before for that cluster by the whole line
// and updates that one instead of adding another — a matrix of clusters keeps a comment each.
const MarkdownMarker = "<!-- ghcrsync-plan"

// Marker is the first line of p's Markdown: MarkdownMarker and the cluster's identity.
func markerOf(p *plan.Plan) string {
	return MarkdownMarker + " cluster=" + commentSafe(p.ClusterUID) + " -->"
}

// commentSafe keeps what may sit inside an HTML comment on one line: letters, digits, '-', '.'.
func commentSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}

		return '_'
	}, s)
}

// MarkdownLimit bounds a Markdown plan written for a pull-request comment: GitHub refuses a
// comment over 65,536 characters. A longer plan is cut at a line, with a pointer to where the
// whole of it is.
const MarkdownLimit = 60000

// truncated is md cut to MarkdownLimit characters at a line boundary, with a note saying so
// (md itself when it fits).
func truncated(md string) string {
	if len([]rune(md)) <= MarkdownLimit {
		return md
	}

	cut := string([]rune(md)[:MarkdownLimit])
	if i := strings.LastIndexByte(cut, '\n'); i > 0 {
		cut = cut[:i+1]
	}

	return cut + "\n> [!NOTE]\n> **This plan is longer than a comment can hold and was cut here.** The whole plan is in the job's " +
		"step summary, and `ghcrsync show --markdown PLANFILE` prints it from the saved plan.\n"
}

// The labels a workflow may put on the pull request.
const (
	LabelNoChanges      = "ghcrsync:no-changes"
	LabelLiveUpdate     = "ghcrsync:live-update"
	LabelRebootRequired = "ghcrsync:reboot-required"
	// LabelSafeToRevoke: nothing uses the old credential any more.
	LabelSafeToRevoke = "ghcrsync:safe-to-revoke"
	// LabelEmergency: a credential in use is refused by the registry (an emergency rotation).
	LabelEmergency = "ghcrsync:emergency"
	// LabelCredentialExpiring: the new credential expires within 14 days (plan.ExpiryWarning).
	LabelCredentialExpiring = "ghcrsync:credential-expiring"
)

// disruption is what an action does to the workloads on the node.
var disruption = map[plan.Action]string{
	plan.ActionFence:     "cordon + drain + reboot",
	plan.ActionApplyLive: "CRI restart",
	plan.ActionKeyring:   "none (kubelet keyring)",
	plan.ActionNoOp:      "none",
	plan.ActionDeselect:  "none (left alone)",
}

// Labels are the pull-request labels that describe a plan.
func labelsOf(p *plan.Plan) []string {
	var out []string

	if !p.Changes() {
		out = append(out, LabelNoChanges)
	}

	if p.Summary.ApplyLive > 0 {
		out = append(out, LabelLiveUpdate)
	}

	if p.Summary.Fence > 0 {
		out = append(out, LabelRebootRequired)
	}

	if p.SafeToRevoke() {
		out = append(out, LabelSafeToRevoke)
	}

	if p.Emergency() {
		out = append(out, LabelEmergency)
	}

	if p.CredentialExpiring() {
		out = append(out, LabelCredentialExpiring)
	}

	return out
}

// Headline is the plan in one line: no changes, or how many reboots and live updates.
func headlineOf(p *plan.Plan) string {
	if !p.Changes() {
		return "No changes"
	}

	var parts []string

	if n := p.Summary.Fence; n > 0 {
		parts = append(parts, plural(n, "node reboot", "node reboots"))
	}

	if n := p.Summary.ApplyLive; n > 0 {
		parts = append(parts, plural(n, "live update", "live updates"))
	}

	if n := p.Summary.Keyring; n > 0 {
		parts = append(parts, plural(n, "kubelet keyring update", "kubelet keyring updates"))
	}

	if n := p.Summary.SecretsCreate + p.Summary.SecretsUpdate; n > 0 {
		parts = append(parts, plural(n, "pull secret to write", "pull secrets to write"))
	}

	if n := p.Summary.TemplatesUpdate; n > 0 {
		parts = append(parts, plural(n, "node template to update", "node templates to update"))
	}

	if n := p.Summary.TemplatesRestart; n > 0 {
		parts = append(parts, plural(n, "node template reader to restart", "node template readers to restart"))
	}

	return strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	return fmt.Sprintf("%d %s", n, human.Plural(n, one, many))
}

// planMarkdown renders a plan for a pull-request comment or a step summary, in the human plan's
// sections. Every value from outside ghcrsync goes through md, so none can break the tables or
// inject markup.
func planMarkdown(w io.Writer, p *plan.Plan) {
	for _, section := range []func(io.Writer, *plan.Plan){
		mdHeader, mdNodes, mdSecrets, mdTemplates, mdFlux, mdOwners, planVerdictMarkdown, mdWarnings, mdSummary,
	} {
		section(w, p)
	}
}

// mdHeader is the marker, the headline, the plan's identity and any emergency or steering note.
func mdHeader(w io.Writer, p *plan.Plan) {
	fmt.Fprintln(w, markerOf(p))
	fmt.Fprintf(w, "### ghcrsync plan: %s\n\n", headlineOf(p))
	fmt.Fprintf(w, "Credential revision `%s` for %s · cluster `%s` · plan created %s, valid until %s.\n\n",
		human.Short(p.CredentialRevision), md(p.Registry), human.ShortOrNone(p.ClusterUID),
		p.CreatedAt.UTC().Format("2006-01-02 15:04Z"), p.ExpiresAt.UTC().Format("2006-01-02 15:04Z"))

	if len(p.Tenants) > 0 {
		fmt.Fprintf(w, "| Credential | Revision | Reaches | Isolated from |\n|---|---|---|---|\n")
		fmt.Fprintf(w, "| %s | `%s` | nodes, node templates, root Flux secret, %s | |\n", md(p.Credential), human.Short(p.CredentialRevision), secretCount(p, ""))

		for _, t := range p.Tenants {
			fmt.Fprintf(w, "| %s | `%s` | %s | %s |\n", md(t.Name), human.Short(t.Revision), secretCount(p, t.Name), md(strings.Join(t.IsolatedFrom, ", ")))
		}

		fmt.Fprintln(w)
	}

	if p.Emergency() {
		fmt.Fprintln(w, "> [!CAUTION]")
		fmt.Fprintln(w, "> **Emergency rotation**: a credential in use is refused by the registry.")

		for _, u := range p.Refused() {
			fmt.Fprintf(w, "> - %s\n", md(u.Sentence()))
		}

		fmt.Fprintln(w)
	}

	if c := p.ContinuingSentence(); c != "" {
		fmt.Fprintf(w, "**Continuing** %s.\n\n", md(c))
	}

	if e := p.Estimate.Sentence(); e != "" {
		fmt.Fprintf(w, "**Estimate:** %s.\n\n", md(e))
	}

	if st := p.Steering; st.Blocked != "" {
		fmt.Fprintln(w, "> [!WARNING]")
		fmt.Fprintf(w, "> **Not applicable as planned**: %s.\n\n", md(st.Blocked))
	} else if st.Seed != "" {
		fmt.Fprintf(w, "Evicted pods: %s.\n\n", md(st.Sentence))
	}
}

// mdNodes is the table of the nodes acted on, the ones left alone (folded) and the unchanged count.
func mdNodes(w io.Writer, p *plan.Plan) {
	var acted, left []plan.NodePlan

	for _, n := range p.Nodes {
		switch n.Action {
		case plan.ActionFence, plan.ActionApplyLive, plan.ActionKeyring:
			acted = append(acted, n)
		case plan.ActionDeselect:
			left = append(left, n)
		}
	}

	if len(acted) > 0 {
		fmt.Fprintln(w, "| # | Node | Role | Talos | Action | Disruption | Reason |")
		fmt.Fprintln(w, "|---:|---|---|---|---|---|---|")

		for _, n := range acted {
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s |\n", n.Order, nodeCell(n), md(string(n.Role)), md(n.Talos),
				n.Action, disruption[n.Action], md(n.Sentence))
		}

		fmt.Fprintln(w)
	}

	if len(left) > 0 {
		fmt.Fprintf(w, "<details><summary>%s left alone</summary>\n\n", plural(len(left), "node", "nodes"))
		fmt.Fprintln(w, "| Node | Role | Why |")
		fmt.Fprintln(w, "|---|---|---|")

		for _, n := range left {
			fmt.Fprintf(w, "| %s | %s | %s |\n", nodeCell(n), md(string(n.Role)), md(n.Sentence))
		}

		fmt.Fprint(w, "\n</details>\n\n")
	}

	if n := p.Summary.Unchanged; n > 0 {
		fmt.Fprintf(w, "%s already on this credential.\n\n", plural(n, "node is", "nodes are"))
	}
}

// mdTable writes a section: its title, a table's header and rows (nothing when there are none).
func mdTable(w io.Writer, title string, header []string, rows [][]string) {
	if len(rows) == 0 {
		return
	}

	fmt.Fprintf(w, "#### %s\n\n| %s |\n|%s\n", title, strings.Join(header, " | "), strings.Repeat("---|", len(header)))

	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = md(c)
		}

		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}

	fmt.Fprintln(w)
}

func mdSecrets(w io.Writer, p *plan.Plan) {
	var rows [][]string
	for _, s := range p.Secrets {
		why := s.Reason
		if s.WriteRefused != "" {
			why += "; REFUSED by the API server in a dry run: " + s.WriteRefused
		}

		role := s.Role
		if s.Credential != "" {
			role += " (credential " + s.Credential + ")"
		}

		rows = append(rows, []string{s.Namespace + "/" + s.Secret, role, string(s.Action), why})
	}

	mdTable(w, "Pull secrets (each receives the "+md(p.Registry)+" entry only; the root Flux secret last)", []string{"Secret", "Role", "Action", "Why"}, rows)
}

func mdTemplates(w io.Writer, p *plan.Plan) {
	var rows [][]string
	for _, t := range p.Templates {
		rows = append(rows, []string{t.Name, plan.TemplateRef(t.Namespace, t.Secret, t.Key), t.Pool, string(t.Action), t.Reason})
	}

	mdTable(w, "Node templates (machines created later boot from these)", []string{"Template", "Secret key", "Pool", "Action", "Why"}, rows)
}

func mdFlux(w io.Writer, p *plan.Plan) {
	var rows [][]string
	for _, f := range p.Flux {
		rows = append(rows, []string{f.Ref(), string(f.Action), f.Reason})
	}

	mdTable(w, "Flux Kustomizations (suspended for the run, resumed at its end)", []string{"Kustomization", "Action", "Why"}, rows)
}

func mdOwners(w io.Writer, p *plan.Plan) {
	var rows [][]string
	for _, o := range p.Owners {
		rows = append(rows, []string{o.Object, o.Owner, o.Meaning})
	}

	mdTable(w, "Other owners of the objects this run writes", []string{"Object", "Owner", "What it means"}, rows)
}

func mdWarnings(w io.Writer, p *plan.Plan) {
	if len(p.Warnings) == 0 {
		return
	}

	fmt.Fprintln(w, "#### Warnings")
	fmt.Fprintln(w)

	for _, warning := range p.Warnings {
		fmt.Fprintf(w, "- %s\n", md(warning))
	}

	fmt.Fprintln(w)
}

// mdSummary is the plan's counts and its labels.
func mdSummary(w io.Writer, p *plan.Plan) {
	s := p.Summary
	fmt.Fprintf(w, "**Plan:** %d to fence, %d to apply live, %s%d unchanged, %d deselected. **Pull secrets:** %d to create, %d to update, %d unchanged, %d left alone.",
		s.Fence, s.ApplyLive, keyringCount(s), s.Unchanged, s.Deselected, s.SecretsCreate, s.SecretsUpdate, s.SecretsUnchanged, s.SecretsSkipped)

	if len(p.Templates) > 0 {
		fmt.Fprintf(w, " **Node templates:** %d to update, %s%d unchanged.", s.TemplatesUpdate, restarts(s), s.TemplatesUnchanged)
	}

	fmt.Fprint(w, "\n\n")

	var labels []string
	for _, l := range labelsOf(p) {
		labels = append(labels, "`"+l+"`")
	}

	fmt.Fprintf(w, "Labels: %s\n", strings.Join(labels, " "))
}

func nodeCell(n plan.NodePlan) string {
	name := md(n.Name)
	if n.Endpoint {
		name += " (API endpoint)"
	}

	return name
}

// md renders a value from outside ghcrsync inside Markdown (a table cell, a list item): control
// characters escaped (Clean), the characters that end a cell or start markup backslash-escaped,
// and HTML's special characters as entities — so a value can neither break the table, nor
// open a link, an image, code or an HTML element.
func md(s string) string {
	if s == "" {
		return "—"
	}

	var b strings.Builder

	for _, r := range Clean(s) {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		case '|', '\\', '`', '*', '_', '[', ']', '(', ')', '#', '!', '~', ':', '@':
			b.WriteByte('\\')
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}

	return b.String()
}
