package view

import (
	"fmt"
	"io"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
)

var symbols = []struct {
	action plan.Action
	symbol string
	legend string
}{
	{plan.ActionFence, "!", "fence: claim, cordon, drain, configure, reboot, prove, release"},
	{plan.ActionApplyLive, "~", "apply live: configure and prove, no cordon, no reboot"},
	{plan.ActionKeyring, "*", "kubelet keyring: configure live, write the kubelet's keyring and prove, no cordon, no drain, no reboot, no restart"},
	{plan.ActionDeselect, "-", "deselect: left alone by this run"},
}

func symbol(a plan.Action) string {
	for _, s := range symbols {
		if s.action == a {
			return s.symbol
		}
	}

	return " "
}

var verbs = map[plan.Action]string{
	plan.ActionFence:     "will be fenced",
	plan.ActionApplyLive: "will be updated live",
	plan.ActionKeyring:   "will take the credential through its kubelet keyring",
	plan.ActionDeselect:  "will be left alone",
	plan.ActionNoOp:      "is unchanged",
}

func describe(n plan.NodePlan) string {
	var attrs []string
	if n.Role != "" {
		attrs = append(attrs, string(n.Role))
	}

	if n.Endpoint {
		attrs = append(attrs, "API endpoint")
	}

	if n.Talos != "" {
		attrs = append(attrs, "Talos "+Clean(n.Talos))
	}

	if len(attrs) == 0 {
		return n.Name
	}

	return n.Name + " (" + strings.Join(attrs, ", ") + ")"
}

// planHuman renders a plan the way `ghcrsync plan` and `ghcrsync show` print it.
func planHuman(w io.Writer, p *plan.Plan) {
	fmt.Fprintf(w, "Credential revision %s for %s", human.Short(p.CredentialRevision), p.Registry)

	if p.ProofSkipped {
		fmt.Fprint(w, " (not proved: --skip-proof)")
	}

	if len(p.IsolatedFrom) > 0 {
		fmt.Fprintf(w, "\nIsolated: the registry refuses it %s (credential.deny).", strings.Join(p.IsolatedFrom, ", "))
	}

	fmt.Fprintf(w, "\nPlan created %s, valid until %s.\n\n", human.Clock(p.CreatedAt), human.Clock(p.ExpiresAt))

	rotations(w, p)

	if p.Emergency() {
		fmt.Fprintln(w, "EMERGENCY ROTATION: a credential in use is refused by the registry.")

		for _, u := range p.Refused() {
			fmt.Fprintf(w, "  ✗ %s\n", oneLine(u.Sentence()))
		}

		fmt.Fprintln(w)
	}

	if c := p.ContinuingSentence(); c != "" {
		fmt.Fprintf(w, "Continuing: %s.\n\n", oneLine(c))
	}

	legend(w, p)
	nodes(w, p)
	steering(w, p)

	if e := p.Estimate.Sentence(); e != "" {
		fmt.Fprintf(w, "Estimate: %s.\n\n", e)
	}
	secrets(w, p)
	templates(w, p)
	flux(w, p)
	owners(w, p)

	for _, warn := range p.Warnings {
		fmt.Fprintf(w, "Warning: %s\n\n", oneLine(warn))
	}

	planSummary(w, p)

	if p.Verdict != nil {
		fmt.Fprintln(w)
		planVerdict(w, p)
	}
}

// rotations lists every credential of a plan that rotates several (tenants): the cluster's, then
// each tenant's, with what it reaches and, for a tenant, what it proved it cannot pull.
func rotations(w io.Writer, p *plan.Plan) {
	if len(p.Tenants) == 0 {
		return
	}

	fmt.Fprintf(w, "Credentials: %d in this plan, each rotated on its own pull secrets.\n", 1+len(p.Tenants))
	fmt.Fprintf(w, "  %s: revision %s for %s — the nodes, node templates, root Flux secret and %s\n", Clean(p.Credential), human.Short(p.CredentialRevision),
		p.Registry, secretCount(p, ""))

	for _, t := range p.Tenants {
		fmt.Fprintf(w, "  %s: revision %s for %s — %s only", Clean(t.Name), human.Short(t.Revision), t.Registry, secretCount(p, t.Name))

		if t.ProofSkipped {
			fmt.Fprint(w, " (not proved: --skip-proof)")
		}

		if len(t.IsolatedFrom) > 0 {
			fmt.Fprintf(w, "; isolated: the registry refuses it %s", strings.Join(t.IsolatedFrom, ", "))
		}

		fmt.Fprintln(w)
	}

	fmt.Fprintln(w)
}

// secretCount says how many of a credential's consumer pull secrets the plan writes.
func secretCount(p *plan.Plan, credential string) string {
	var all, write int

	for _, sp := range p.Secrets {
		if sp.Credential != credential || sp.Role == plan.RoleRoot {
			continue
		}

		all++

		if sp.Action == plan.SecretCreate || sp.Action == plan.SecretUpdate {
			write++
		}
	}

	return fmt.Sprintf("%d consumer %s (%d to write)", all, human.Plural(all, "pull secret", "pull secrets"), write)
}

// steering says where the drains' pods go: the taint, the worker rolled first and its pods'
// fate; a blocked emergency says apply refuses it.
func steering(w io.Writer, p *plan.Plan) {
	st := p.Steering
	if st.Effect == "" || st.Seed == "" {
		return
	}

	if st.Blocked != "" {
		fmt.Fprintf(w, "Not applicable as planned: %s.\n\n", oneLine(st.Blocked))

		return
	}

	fmt.Fprintf(w, "Evicted pods: every node to rotate is tainted %s:%s until it is proved; %s.\n\n", taints.Steering, st.Effect, oneLine(st.Sentence))
}

// legend lists the symbols the plan uses.
func legend(w io.Writer, p *plan.Plan) {
	used := map[plan.Action]bool{}
	for _, n := range p.Nodes {
		used[n.Action] = true
	}

	secretsUsed := map[plan.SecretAction]bool{}
	for _, sp := range p.Secrets {
		secretsUsed[sp.Action] = true
	}

	if !p.Changes() && !used[plan.ActionDeselect] && !secretsUsed[plan.SecretSkip] {
		return
	}

	fmt.Fprintln(w, "Symbols:")

	for _, s := range symbols {
		if used[s.action] {
			fmt.Fprintf(w, "  %s %s\n", s.symbol, s.legend)
		}
	}

	if secretsUsed[plan.SecretCreate] {
		fmt.Fprintln(w, "  + create a pull secret")
	}

	if secretsUsed[plan.SecretUpdate] {
		fmt.Fprintln(w, "  ~ update a pull secret (compare-and-swap)")
	}

	if secretsUsed[plan.SecretSkip] && !used[plan.ActionDeselect] {
		fmt.Fprintln(w, "  - leave a pull secret alone")
	}

	if p.Summary.TemplatesUpdate > 0 {
		fmt.Fprintln(w, "  ~ update a node template's credential (compare-and-swap)")
	}

	if p.Summary.TemplatesRestart > 0 {
		fmt.Fprintln(w, "  ↻ restart a node template's reader (it read the template before it changed)")
	}

	fmt.Fprintln(w)
}

// nodes renders the nodes acted on (in order), then the unchanged and the deselected ones.
func nodes(w io.Writer, p *plan.Plan) {
	if s := p.Summary; s.Fence+s.ApplyLive+s.Keyring > 0 {
		fmt.Fprintln(w, "ghcrsync will act on these nodes, in this order (live updates first, several at a time; then fenced workers, then fenced control planes one at a time, the API endpoint's node last):")
		fmt.Fprintln(w)

		for _, n := range p.Nodes {
			if n.Order > 0 {
				node(w, n, fmt.Sprintf("%d. ", n.Order))
			}
		}
	}

	for _, section := range []struct {
		title  string
		action plan.Action
	}{{"Unchanged:", plan.ActionNoOp}, {"Deselected:", plan.ActionDeselect}} {
		first := true

		for _, n := range p.Nodes {
			if n.Action != section.action {
				continue
			}

			if first {
				fmt.Fprintf(w, "%s\n\n", section.title)

				first = false
			}

			node(w, n, "")
		}
	}
}

var (
	secretSymbols = map[plan.SecretAction]string{plan.SecretCreate: "+", plan.SecretUpdate: "~", plan.SecretSkip: "-", plan.SecretNoOp: " "}
	secretVerbs   = map[plan.SecretAction]string{plan.SecretCreate: "will be created", plan.SecretUpdate: "will be updated",
		plan.SecretSkip: "will be left alone", plan.SecretNoOp: "is unchanged"}
)

// secrets renders the pull secrets, the root Flux secret last.
func secrets(w io.Writer, p *plan.Plan) {
	if len(p.Secrets) == 0 {
		return
	}

	fmt.Fprintf(w, "Pull secrets (consumers, then the root Flux secret last; each receives the %s entry of the credential only):\n", p.Registry)
	fmt.Fprintln(w)

	for _, sp := range p.Secrets {
		role := sp.Role
		if sp.Credential != "" {
			role += ", credential " + Clean(sp.Credential)
		}

		fmt.Fprintf(w, "  %s %s/%s (%s) %s\n      # (because %s)\n", secretSymbols[sp.Action], sp.Namespace, sp.Secret, role, secretVerbs[sp.Action], oneLine(sp.Reason))

		if len(sp.ServiceAccounts) > 0 && sp.Action != plan.SecretSkip {
			fmt.Fprintf(w, "      # and referenced from service account(s) %s\n", strings.Join(sp.ServiceAccounts, ", "))
		}

		if sp.WriteRefused != "" {
			fmt.Fprintf(w, "      # REFUSED by the API server in a dry run of this write: %s\n", oneLine(sp.WriteRefused))
		}

		fmt.Fprintln(w)
	}
}

var templateVerbs = map[plan.TemplateAction]string{
	plan.TemplateUpdate: "will be updated", plan.TemplateRestart: "is unchanged; its reader will be restarted", plan.TemplateNoOp: "is unchanged",
	plan.TemplateLeave: "is left alone (not in its pools)",
}

// restarts is "N to restart, " when a template's reader is to be restarted.
func restarts(s plan.Summary) string {
	if s.TemplatesRestart == 0 {
		return ""
	}

	return fmt.Sprintf("%d to restart its reader, ", s.TemplatesRestart)
}

// templates renders the node templates: one line per template and pool.
func templates(w io.Writer, p *plan.Plan) {
	if len(p.Templates) == 0 {
		return
	}

	fmt.Fprintln(w, "Node templates (machines the autoscaler creates later boot from these; written after the consumer secrets, before the root Flux secret):")
	fmt.Fprintln(w)

	for _, t := range p.Templates {
		symbol := map[plan.TemplateAction]string{plan.TemplateUpdate: "~", plan.TemplateRestart: "↻"}[t.Action]
		if symbol == "" {
			symbol = " "
		}

		fmt.Fprintf(w, "  %s %s (%s, %s) %s\n      # (because %s)\n\n", symbol, Clean(t.Where()), Clean(t.Name), t.Format, templateVerbs[t.Action], oneLine(t.Reason))
	}
}

// flux renders the flux block's Kustomizations: suspended for the run, or left as they are.
func flux(w io.Writer, p *plan.Plan) {
	if len(p.Flux) == 0 {
		return
	}

	fmt.Fprintln(w, "Flux Kustomizations (suspended before the first write, resumed after the last; a recorded fence):")
	fmt.Fprintln(w)

	for _, f := range p.Flux {
		verb := "will be suspended for the run"
		if f.Action == plan.FluxLeave {
			verb = "will be left as it is"
		}

		fmt.Fprintf(w, "  %s %s\n      # (because %s)\n\n", Clean(f.Ref()), verb, oneLine(f.Reason))
	}
}

// owners renders who else manages the objects the run writes, and what it means.
func owners(w io.Writer, p *plan.Plan) {
	if len(p.Owners) == 0 {
		return
	}

	fmt.Fprintln(w, "Other owners of the objects this run writes:")
	fmt.Fprintln(w)

	for _, o := range p.Owners {
		fmt.Fprintf(w, "  ! %s: %s\n      # %s\n\n", Clean(o.Object), Clean(o.Owner), oneLine(o.Meaning))
	}
}

// planSummary is the plan's last line(s): Terraform's "Plan: …" or "No changes.".
func planSummary(w io.Writer, p *plan.Plan) {
	s := p.Summary
	if !p.Changes() {
		fmt.Fprintf(w, "No changes. The fleet already uses credential revision %s", human.Short(p.CredentialRevision))

		if s.Deselected > 0 {
			fmt.Fprintf(w, " on every node ghcrsync may act on; %d deselected", s.Deselected)
		}

		fmt.Fprintln(w, ".")

		return
	}

	fmt.Fprintf(w, "Plan: %d to fence, %d to apply live, %s%d unchanged, %d deselected.\n", s.Fence, s.ApplyLive, keyringCount(s), s.Unchanged, s.Deselected)

	if len(p.Secrets) > 0 {
		fmt.Fprintf(w, "Pull secrets: %d to create, %d to update, %d unchanged, %d left alone.\n", s.SecretsCreate, s.SecretsUpdate, s.SecretsUnchanged, s.SecretsSkipped)
	}

	if len(p.Templates) > 0 {
		fmt.Fprintf(w, "Node templates: %d to update, %s%d unchanged.\n", s.TemplatesUpdate, restarts(s), s.TemplatesUnchanged)
	}
}

// planSaved says where the plan was saved and how to apply it.
func planSaved(w io.Writer, path string) {
	fmt.Fprintf(w, "\nSaved the plan to: %s\n\nTo perform exactly these actions, run:\n  ghcrsync apply %s\n", path, path)
}

// planTo renders a plan in the format.
func planTo(w io.Writer, f Format, p *plan.Plan) error {
	if f == JSON {
		return writeJSON(w, newPlanJSON(p))
	}

	planHuman(w, p)

	return nil
}

func node(w io.Writer, n plan.NodePlan, prefix string) {
	fmt.Fprintf(w, "  %s %s%s %s\n", symbol(n.Action), prefix, describe(n), verbs[n.Action])
	fmt.Fprintf(w, "      # (because %s)\n", oneLine(n.Sentence))

	if n.TalosDryRun != "" {
		fmt.Fprintf(w, "      # (its Talos, asked with a dry run of the change: %s)\n", oneLine(n.TalosDryRun))
	}

	fmt.Fprintln(w)
}

// PlanJSON is the machine-readable plan (`--json`).
type PlanJSON struct {
	FormatVersion      string `json:"format_version"`
	CredentialRevision string `json:"credential_revision"`
	Registry           string `json:"registry"`
	ConfigDigest       string `json:"config_digest"`
	ProofSkipped       bool   `json:"proof_skipped"`
	// IsolatedFrom are the images the registry refused the credential (credential.deny).
	IsolatedFrom []string `json:"isolated_from,omitempty"`
	// Credential names the cluster credential and Tenants are the tenant credentials' rotations,
	// when the configuration has several (absent with one).
	Credential string                `json:"credential,omitempty"`
	Tenants    []plan.TenantRotation `json:"tenants,omitempty"`
	// CredentialExpiresAt is when the new credential expires, as the registry reported it ("":
	// not reported); CredentialExpiring is true within 14 days of it (1.2).
	CredentialExpiresAt string         `json:"credential_expires_at,omitempty"`
	CredentialExpiring  bool           `json:"credential_expiring"`
	CreatedAt           string         `json:"created_at"`
	ExpiresAt           string         `json:"expires_at"`
	State               plan.StateRef  `json:"state"`
	APIEndpoint         string         `json:"api_endpoint"`
	EndpointNode        string         `json:"endpoint_node,omitempty"`
	Nodes               []NodeJSON     `json:"nodes"`
	Consumers           []SecretJSON   `json:"consumers"`
	Templates           []TemplateJSON `json:"templates"`
	// PullSecretEntries are the registries whose entry the pull secrets receive: only the
	// configured one, never other entries of the SOPS file's dockerconfigjson.
	PullSecretEntries []string `json:"pull_secret_entries"`
	Warnings          []string `json:"warnings"`
	// DrainHolds counts the warnings predicting a held drain (plan --strict refuses on any; 1.2).
	DrainHolds int `json:"drain_holds"`
	// ConfigDrift are the nodes whose active machine config lost the credential ghcrsync
	// rotated them to (1.3).
	ConfigDrift []string     `json:"config_drift"`
	Summary     plan.Summary `json:"summary"`
	Changes     bool         `json:"changes"`
	// Verdict is who uses which credential as the plan found the cluster.
	Verdict *VerdictJSON `json:"verdict,omitempty"`
	// Emergency: a credential in use (not the new one) is refused by the registry;
	// CredentialsInUse lists each distinct credential the nodes and secrets hold, by digest.
	Emergency        bool                   `json:"emergency"`
	CredentialsInUse []plan.CredentialInUse `json:"credentials_in_use,omitempty"`
	// Steering is where the drains' pods go (blocked: apply refuses the plan as it is).
	Steering plan.Steering `json:"steering"`
	// Estimate is the expected wall time of apply and what fits in its time budget; Continuing
	// the rotation an earlier run started and did not finish (1.5).
	Estimate   *EstimateJSON   `json:"estimate,omitempty"`
	Continuing *ContinuingJSON `json:"continuing,omitempty"`
	// Flux is what the run does to each Kustomization of the flux block; OtherOwners are the
	// other managers of the objects it writes (1.3).
	Flux        []plan.FluxPlan   `json:"flux"`
	OtherOwners []plan.OtherOwner `json:"other_owners"`
}

// NodeJSON is one node of PlanJSON.
type NodeJSON struct {
	Name         string `json:"name"`
	UID          string `json:"uid"`
	Role         string `json:"role"`
	Action       string `json:"action"`
	ReasonCode   string `json:"reason_code"`
	Reason       string `json:"reason"`
	Order        int    `json:"order"`
	APIEndpoint  bool   `json:"api_endpoint"`
	TalosVersion string `json:"talos_version,omitempty"`
	// TalosDryRun is its Talos's answer to a dry run of the change (1.2).
	TalosDryRun string `json:"talos_dry_run,omitempty"`
	// DrainBlockers are the pods its drain will meet: held by a budget, refused (no
	// controller), or losing emptyDir data (1.4).
	DrainBlockers []plan.DrainBlocker `json:"drain_blockers,omitempty"`
	// EstimateSeconds is how long its rotation is expected to take; InBudget whether it fits in
	// the run's time budget (1.5).
	EstimateSeconds float64 `json:"estimate_seconds,omitempty"`
	InBudget        bool    `json:"in_budget,omitempty"`
}

// SecretJSON is one pull secret of PlanJSON.
type SecretJSON struct {
	Namespace       string   `json:"namespace"`
	Secret          string   `json:"secret"`
	Role            string   `json:"role"`
	Action          string   `json:"action"`
	Reason          string   `json:"reason"`
	ServiceAccounts []string `json:"service_accounts,omitempty"`
	// Credential is the tenant credential it receives ("": the cluster credential).
	Credential string `json:"credential,omitempty"`
}

// TemplateJSON is one node template config (a template, or one of its pools) of PlanJSON.
type TemplateJSON struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Secret    string `json:"secret"`
	Key       string `json:"key"`
	Format    string `json:"format"`
	Pool      string `json:"pool,omitempty"`
	Action    string `json:"action"`
	Reason    string `json:"reason"`
}

// PlanJSONFormatVersion is the version of PlanJSON; additive changes keep the major version
// (1.1: the verdict; 1.2: the credential's expiry, the predicted drain holds; 1.3: the Flux
// Kustomizations suspended for the run, the other owners, the machine-config drift; 1.4: each
// node's drain blockers; 1.5: the estimate, each node's, and the rotation continued).
const PlanJSONFormatVersion = "1.5"

// EstimateJSON is plan.Estimate with durations in seconds.
type EstimateJSON struct {
	WallSeconds    float64             `json:"wall_seconds"`
	Fenced         int                 `json:"fenced"`
	Live           int                 `json:"live"`
	Parallelism    int                 `json:"parallelism"`
	Classes        []ClassEstimateJSON `json:"classes"`
	HeldDrains     int                 `json:"held_drains"`
	BudgetSeconds  float64             `json:"budget_seconds,omitempty"`
	ReserveSeconds float64             `json:"reserve_seconds,omitempty"`
	Fit            int                 `json:"fit"`
	Acted          int                 `json:"acted"`
	Sentence       string              `json:"sentence"`
}

// ClassEstimateJSON is one class's expected duration per node and its source.
type ClassEstimateJSON struct {
	Class          string  `json:"class"`
	PerNodeSeconds float64 `json:"per_node_seconds"`
	Samples        int     `json:"samples"`
	Runs           int     `json:"runs"`
	// Source is "recorded" (the median of the class's recorded rotations), "recorded:CLASS"
	// (another class's) or "default" (the configuration's, before any).
	Source string `json:"source"`
}

// ContinuingJSON is the rotation in progress a plan continues.
type ContinuingJSON struct {
	Revision  string   `json:"revision"`
	Started   string   `json:"started"`
	StartedBy string   `json:"started_by"`
	Runs      int      `json:"runs"`
	Done      []string `json:"done"`
	Sentence  string   `json:"sentence"`
}

func newEstimateJSON(e *plan.Estimate) *EstimateJSON {
	if e == nil || e.Acted == 0 {
		return nil
	}

	out := &EstimateJSON{WallSeconds: e.Wall.Seconds(), Fenced: e.Fenced, Live: e.Live, Parallelism: e.Parallelism, HeldDrains: e.Held,
		BudgetSeconds: e.Budget.Seconds(), ReserveSeconds: e.Reserve.Seconds(), Fit: e.Fit, Acted: e.Acted, Sentence: e.Sentence(),
		Classes: []ClassEstimateJSON{}}

	for _, c := range e.Classes {
		src := "recorded"
		switch {
		case c.Default:
			src = "default"
		case c.From != "":
			src = "recorded:" + c.From
		}

		out.Classes = append(out.Classes, ClassEstimateJSON{Class: c.Class, PerNodeSeconds: c.PerNode.Seconds(), Samples: c.Samples, Runs: c.Runs, Source: src})
	}

	return out
}

func newContinuingJSON(p *plan.Plan) *ContinuingJSON {
	r := p.Continuing
	if r == nil {
		return nil
	}

	return &ContinuingJSON{Revision: r.Revision, Started: r.Started.UTC().Format("2006-01-02T15:04:05Z"), StartedBy: r.StartedBy, Runs: r.Runs,
		Done: append([]string{}, r.Done...), Sentence: p.ContinuingSentence()}
}

// NewPlanJSON converts a plan to its JSON view.
func newPlanJSON(p *plan.Plan) PlanJSON {
	out := PlanJSON{
		FormatVersion: PlanJSONFormatVersion, CredentialRevision: p.CredentialRevision, Registry: p.Registry,
		ConfigDigest: p.ConfigDigest, ProofSkipped: p.ProofSkipped, IsolatedFrom: p.IsolatedFrom, Credential: p.Credential, Tenants: p.Tenants, CredentialExpiring: p.CredentialExpiring(), DrainHolds: p.DrainHolds,
		CreatedAt: p.CreatedAt.Format("2006-01-02T15:04:05Z"), ExpiresAt: p.ExpiresAt.Format("2006-01-02T15:04:05Z"),
		State: p.State, APIEndpoint: p.APIEndpoint, EndpointNode: p.EndpointNode,
		Nodes: []NodeJSON{}, Consumers: []SecretJSON{}, Templates: []TemplateJSON{}, PullSecretEntries: []string{p.Registry}, Warnings: append([]string{}, p.Warnings...),
		Summary: p.Summary, Changes: p.Changes(), Verdict: newVerdictJSON(p.Verdict, nil),
		Emergency: p.Emergency(), CredentialsInUse: p.CredentialsInUse, Steering: p.Steering,
		Flux: append([]plan.FluxPlan{}, p.Flux...), OtherOwners: append([]plan.OtherOwner{}, p.Owners...), ConfigDrift: append([]string{}, p.Drifted...),
		Estimate: newEstimateJSON(p.Estimate), Continuing: newContinuingJSON(p),
	}

	for _, n := range p.Nodes {
		out.Nodes = append(out.Nodes, NodeJSON{
			Name: n.Name, UID: n.UID, Role: string(n.Role), Action: string(n.Action), ReasonCode: string(n.Reason),
			Reason: n.Sentence, Order: n.Order, APIEndpoint: n.Endpoint, TalosVersion: n.Talos, TalosDryRun: n.TalosDryRun,
			DrainBlockers: n.Blockers, EstimateSeconds: n.Estimate.Seconds(), InBudget: n.InBudget,
		})
	}

	for _, sp := range p.Secrets {
		out.Consumers = append(out.Consumers, SecretJSON{
			Namespace: sp.Namespace, Secret: sp.Secret, Role: sp.Role, Action: string(sp.Action), Reason: sp.Reason, ServiceAccounts: sp.ServiceAccounts,
			Credential: sp.Credential,
		})
	}

	for _, t := range p.Templates {
		out.Templates = append(out.Templates, TemplateJSON{
			Name: t.Name, Namespace: t.Namespace, Secret: t.Secret, Key: t.Key, Format: t.Format, Pool: t.Pool, Action: string(t.Action), Reason: t.Reason,
		})
	}

	if !p.CredentialExpiresAt.IsZero() {
		out.CredentialExpiresAt = p.CredentialExpiresAt.UTC().Format("2006-01-02T15:04:05Z")
	}

	return out
}

// planJSONTo writes the JSON view, indented.
func planJSONTo(w io.Writer, p *plan.Plan) error { return writeJSON(w, newPlanJSON(p)) }

// keyringCount is the summary's count of kubelet-keyring nodes ("" when there are none).
func keyringCount(s plan.Summary) string {
	if s.Keyring == 0 {
		return ""
	}

	return fmt.Sprintf("%d through the kubelet keyring, ", s.Keyring)
}
