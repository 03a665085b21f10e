package view

import (
	"fmt"
	"io"
	"slices"

	"github.com/ghcrsync/ghcrsync/plan"
)

// The verdict — is it safe to revoke the old credential? — in every rendering, the same words.

var useMarks = map[plan.UseState]string{plan.UseNew: "✓", plan.UseOld: "✗", plan.UseUnknown: "?"}

// useKinds name a use's kind for people.
var useKinds = map[string]string{
	plan.UseNode: "node", plan.UseSecret: "pull secret", plan.UseRoot: "root Flux secret",
	plan.UseTemplate: "node template", plan.UseFleet: "fleet", plan.UseUnmanaged: "unmanaged pull secret",
	plan.UseProvisioning: "node group provisioning",
}

// verdictHuman writes the verdict and each use of the old credential with what to do.
func verdictHuman(w io.Writer, v *plan.Revocation, verdictErr error) {
	switch {
	case verdictErr != nil:
		fmt.Fprintf(w, "Verdict: unknown — %s. Do not revoke the old credential until `ghcrsync plan` says it is safe.\n", oneLine(verdictErr.Error()))

		return
	case v == nil:
		return
	}

	if len(v.Tenants) > 0 {
		credentialsHuman(w, v, func(c plan.Revocation) []plan.Use { return c.Still() })

		return
	}

	fmt.Fprintf(w, "Verdict: %s\n", oneLine(v.Sentence()))

	usesHuman(w, "  ", v.Still())
}

// usesHuman writes each use with why and what to do, indented.
func usesHuman(w io.Writer, indent string, uses []plan.Use) {
	for _, u := range uses {
		fmt.Fprintf(w, "%s%s %s %s: %s\n", indent, useMarks[u.State], useKinds[u.Kind], Clean(u.Name), oneLine(u.Why))

		if u.Next != "" {
			fmt.Fprintf(w, "%s    → %s\n", indent, oneLine(u.Next))
		}
	}
}

// credentialsHuman writes the verdict of several credentials: one line each, by name, then what
// still uses its old one (uses picks them: the cluster's, or what a plan leaves).
func credentialsHuman(w io.Writer, v *plan.Revocation, uses func(plan.Revocation) []plan.Use) {
	fmt.Fprintln(w, "Verdict, by credential:")

	for _, c := range v.All() {
		fmt.Fprintf(w, "  %s: %s\n", Clean(c.Credential), oneLine(c.Sentence()))
		usesHuman(w, "    ", uses(c))
	}
}

// planVerdict writes a plan's verdict: the sentence, then what the plan, carried out, would
// still leave on the old credential (each with why and what to do).
func planVerdict(w io.Writer, p *plan.Plan) {
	if p.Verdict == nil {
		return
	}

	if len(p.Verdict.Tenants) > 0 {
		leaves := p.Leaves()
		credentialsHuman(w, p.Verdict, func(c plan.Revocation) []plan.Use { return plan.Among(leaves, c.Still()) })

		return
	}

	fmt.Fprintf(w, "Verdict: %s\n", oneLine(p.Verdict.Sentence()))

	if p.Verdict.SafeToRevoke {
		return
	}

	leaves := p.Leaves()
	if len(leaves) == 0 {
		fmt.Fprintln(w, "This plan, applied in full, leaves nothing on the old credential (apply judges the cluster again at its end).")

		return
	}

	fmt.Fprintln(w, "This plan, applied in full, still leaves the old credential in use by:")

	for _, u := range leaves {
		fmt.Fprintf(w, "  %s %s %s: %s\n", useMarks[u.State], useKinds[u.Kind], Clean(u.Name), oneLine(u.Why))

		if u.Next != "" {
			fmt.Fprintf(w, "      → %s\n", oneLine(u.Next))
		}
	}
}

// VerdictJSON is the verdict in the JSON views.
type VerdictJSON struct {
	SafeToRevoke bool      `json:"safe_to_revoke"`
	Revision     string    `json:"revision"`
	Sentence     string    `json:"sentence"`
	New          int       `json:"new"`
	Old          int       `json:"old"`
	Unknown      int       `json:"unknown"`
	Still        []UseJSON `json:"still_used_by"`
	Error        string    `json:"error,omitempty"`
	// Credential names the credential judged, and Credentials are each credential's verdict,
	// when the configuration has several (the fields above then judge them all together).
	Credential  string        `json:"credential,omitempty"`
	Credentials []VerdictJSON `json:"credentials,omitempty"`
}

// UseJSON is one use of the old credential.
type UseJSON struct {
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	State string `json:"state"`
	Holds string `json:"holds,omitempty"`
	Why   string `json:"why"`
	Next  string `json:"next,omitempty"`
}

func newVerdictJSON(v *plan.Revocation, verdictErr error) *VerdictJSON {
	switch {
	case verdictErr != nil:
		return &VerdictJSON{Still: []UseJSON{}, Error: verdictErr.Error(),
			Sentence: "Unknown: " + verdictErr.Error() + ". Do not revoke the old credential until `ghcrsync plan` says it is safe."}
	case v == nil:
		return nil
	}

	if len(v.Tenants) == 0 {
		return oneVerdictJSON(*v)
	}

	// Each credential's verdict; the fields of all of them together start from the cluster's.
	var out VerdictJSON

	for i, c := range v.All() {
		one := *oneVerdictJSON(c)
		if i == 0 {
			out = one
			out.Still = slices.Clone(one.Still)
		} else {
			out.New, out.Old, out.Unknown = out.New+c.New, out.Old+c.Old, out.Unknown+c.Unknown
			out.Still = append(out.Still, one.Still...)
		}

		out.Credentials = append(out.Credentials, one)
	}

	out.SafeToRevoke, out.Sentence, out.Credential = v.Clean(), v.Sentence(), ""

	return &out
}

// oneVerdictJSON is one credential's verdict (v without its tenants: All's).
func oneVerdictJSON(v plan.Revocation) *VerdictJSON {
	out := &VerdictJSON{SafeToRevoke: v.SafeToRevoke, Revision: v.Revision, Sentence: v.Sentence(), New: v.New, Old: v.Old, Unknown: v.Unknown,
		Still: []UseJSON{}, Credential: v.Credential}

	for _, u := range v.Still() {
		out.Still = append(out.Still, UseJSON{Kind: u.Kind, Name: u.Name, State: string(u.State), Holds: u.Holds, Why: u.Why, Next: u.Next})
	}

	return out
}

// planVerdictMarkdown is planVerdict for a pull-request comment.
func planVerdictMarkdown(w io.Writer, p *plan.Plan) {
	if p.Verdict == nil {
		return
	}

	if len(p.Verdict.Tenants) > 0 {
		leaves := p.Leaves()
		credentialsMarkdown(w, p.Verdict, "Left on the old credential by this plan", func(c plan.Revocation) []plan.Use { return plan.Among(leaves, c.Still()) })

		return
	}

	if p.Verdict.SafeToRevoke {
		fmt.Fprintf(w, "#### Verdict: safe to revoke the old credential\n\n%s\n\n", md(p.Verdict.Sentence()))

		return
	}

	leaves := p.Leaves()
	fmt.Fprintf(w, "#### Verdict: do not revoke the old credential yet\n\n%s\n\n", md(p.Verdict.Sentence()))

	if len(leaves) == 0 {
		fmt.Fprint(w, "This plan, applied in full, leaves nothing on the old credential (apply judges the cluster again at its end).\n\n")

		return
	}

	usesMarkdown(w, "Left on the old credential by this plan", leaves)
}

// usesMarkdown is a table of what uses the old credential: name, kind, why, what to do.
func usesMarkdown(w io.Writer, title string, uses []plan.Use) {
	fmt.Fprintf(w, "| %s | Kind | Why | What to do |\n", title)
	fmt.Fprintln(w, "|---|---|---|---|")

	for _, u := range uses {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", md(u.Name), useKinds[u.Kind], md(u.Why), md(u.Next))
	}

	fmt.Fprintln(w)
}

// verdictMarkdown writes the verdict as a section of a plan comment or a step summary.
func verdictMarkdown(w io.Writer, v *plan.Revocation, verdictErr error) {
	switch {
	case verdictErr != nil:
		fmt.Fprintf(w, "#### Verdict: unknown\n\n%s. Do not revoke the old credential until `ghcrsync plan` says it is safe.\n\n", md(verdictErr.Error()))

		return
	case v == nil:
		return
	}

	if len(v.Tenants) > 0 {
		credentialsMarkdown(w, v, "Still uses the old credential", plan.Revocation.Still)

		return
	}

	head := "do not revoke the old credential yet"
	if v.SafeToRevoke {
		head = "safe to revoke the old credential"
	}

	fmt.Fprintf(w, "#### Verdict: %s\n\n%s\n\n", head, md(v.Sentence()))

	if still := v.Still(); len(still) > 0 {
		usesMarkdown(w, "Still uses the old credential", still)
	}
}

// credentialsMarkdown is the verdict of several credentials: a line each, then one table of what
// still uses an old credential (uses picks them: what is left, or what a plan leaves).
func credentialsMarkdown(w io.Writer, v *plan.Revocation, title string, uses func(plan.Revocation) []plan.Use) {
	head := "do not revoke every old credential yet"
	if v.Clean() {
		head = "safe to revoke the old credentials"
	}

	fmt.Fprintf(w, "#### Verdict: %s\n\n", head)

	var still []plan.Use

	for _, c := range v.All() {
		fmt.Fprintf(w, "- **%s**: %s\n", md(c.Credential), md(c.Sentence()))

		still = append(still, uses(c)...)
	}

	fmt.Fprintln(w)

	if len(still) > 0 {
		usesMarkdown(w, title, still)
	}
}

// verdictAnnotation is the verdict as a workflow annotation: a notice when revoking is safe,
// a warning otherwise.
func verdictAnnotation(w io.Writer, v *plan.Revocation, verdictErr error) {
	switch {
	case verdictErr != nil:
		Annotate(w, AnnotateWarning, "ghcrsync: do not revoke the old credential yet", verdictErr.Error())
	case v == nil:
	case v.Clean():
		Annotate(w, AnnotateNotice, "ghcrsync: safe to revoke the old credential", v.Sentence())
	default:
		Annotate(w, AnnotateWarning, "ghcrsync: do not revoke the old credential yet", v.Sentence())
	}
}
