package view

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// The views of the commands other than plan and apply (command.go): each command renders through
// its own, made on its streams, and calls no renderer itself.

// ShowView is `ghcrsync show`'s view.
type ShowView struct{ s Streams }

// NewShow is the show command's view on s.
func NewShow(s Streams) *ShowView { return &ShowView{s: s} }

// Plan renders a saved plan: human, JSON (--json) or, with markdown, a pull-request comment.
func (v *ShowView) Plan(p *plan.Plan, markdown bool) error {
	if markdown {
		planMarkdown(v.s.Out, p)

		return nil
	}

	return planTo(v.s.Out, v.s.format(), p)
}

// FencesView is `ghcrsync fences`'s view.
type FencesView struct{ s Streams }

// NewFences is the fences command's view on s.
func NewFences(s Streams) *FencesView { return &FencesView{s: s} }

// Report renders the inventory, in release order (human or JSON).
func (v *FencesView) Report(r fence.Report) error { return fencesTo(v.s.Out, v.s.format(), r) }

// ReleaseView is `ghcrsync release`'s view.
type ReleaseView struct{ s Streams }

// NewRelease is the release command's view on s.
func NewRelease(s Streams) *ReleaseView { return &ReleaseView{s: s} }

// Progress words the release's progress on Err.
func (v *ReleaseView) Progress() progress.Func { return Progress(v.s.Err) }

// Forced warns, on Err, that --force releases a holder's fences though its run may be alive.
func (v *ReleaseView) Forced(holder string) { forceWarning(v.s.Err, holder) }

// Deprecated warns, on Err, that the command was called by a name that will go.
func (v *ReleaseView) Deprecated(old, instead, why string) { deprecated(v.s.Err, old, instead, why) }

// Result renders what was released, kept and left (human or JSON).
func (v *ReleaseView) Result(res *fence.RecoveryResult) error {
	return releaseTo(v.s.Out, v.s.format(), res)
}

// ValidateView is `ghcrsync validate`'s view.
type ValidateView struct{ s Streams }

// NewValidate is the validate command's view on s.
func NewValidate(s Streams) *ValidateView { return &ValidateView{s: s} }

// Result renders the findings: each annotated on its line under GitHub Actions, then human or
// terraform validate's JSON (--json).
func (v *ValidateView) Result(r config.Validation) error {
	if v.s.GitHub {
		validateAnnotations(v.s.Annotations(), r)
	}

	if v.s.JSON {
		return validateJSONTo(v.s.Out, r)
	}

	validateHuman(v.s.Out, r)

	return nil
}

// FmtView is `ghcrsync fmt`'s view.
type FmtView struct{ s Streams }

// NewFmt is the fmt command's view on s.
func NewFmt(s Streams) *FmtView { return &FmtView{s: s} }

// Unparsed renders, on Err, why a file does not parse (each finding with its line).
func (v *FmtView) Unparsed(r config.Validation) { validateHuman(v.s.Err, r) }

// Formatted names each file fmt changed (or, with --check, would change), one per line.
func (v *FmtView) Formatted(files []string) { formattedFiles(v.s.Out, files) }

// StateView is the view of `ghcrsync state`'s commands.
type StateView struct{ s Streams }

// NewState is the state commands' view on s.
func NewState(s Streams) *StateView { return &StateView{s: s} }

// List renders the state's records (human or JSON).
func (v *StateView) List(st *state.State, backend string) error {
	return stateList(v.s.Out, v.s.format(), st, backend)
}

// Record renders one node's record as JSON.
func (v *StateView) Record(r *state.Record) error { return stateRecord(v.s.Out, r) }

// Pulled writes the whole state as JSON.
func (v *StateView) Pulled(st *state.State) error { return statePull(v.s.Out, st) }

// Removed says a node's record was removed.
func (v *StateView) Removed(node string) { stateRemoved(v.s.Out, node) }

// Pushed says a state was pushed to the backend.
func (v *StateView) Pushed(st *state.State, backend string) { statePushed(v.s.Out, st, backend) }

// Warning warns on Err.
func (v *StateView) Warning(msg string) { Warning(v.s.Err, msg) }

// RBACView is `ghcrsync rbac`'s view.
type RBACView struct{ s Streams }

// NewRBAC is the rbac command's view on s.
func NewRBAC(s Streams) *RBACView { return &RBACView{s: s} }

// Objects renders the RBAC objects and admission policies as YAML documents.
func (v *RBACView) Objects(source string, skipped []string, objs []runtime.Object) error {
	return rbacTo(v.s.Out, source, skipped, objs)
}

// VersionView is `ghcrsync version`'s view.
type VersionView struct{ s Streams }

// NewVersion is the version command's view on s.
func NewVersion(s Streams) *VersionView { return &VersionView{s: s} }

// Version renders the version: a line, or (--json) one object with the formats it reads.
func (v *VersionView) Version(info VersionInfo) error {
	if v.s.JSON {
		return versionJSON(v.s.Out, info)
	}

	versionLine(v.s.Out, info.Version)

	return nil
}

// Inputs lists the files the configuration reads, one per line (--list-inputs).
func (v *ValidateView) Inputs(files []string) {
	for _, f := range files {
		fmt.Fprintln(v.s.Out, Clean(f))
	}
}

// AdmissionView is `ghcrsync admission`'s view.
type AdmissionView struct{ s Streams }

// NewAdmission is the admission command's view on s.
func NewAdmission(s Streams) *AdmissionView { return &AdmissionView{s: s} }

// Listening says where the webhook listens, and for how many node templates.
func (v *AdmissionView) Listening(addr string, templates int) {
	fmt.Fprintf(v.s.Out, "ghcrsync admission: listening on https://%s/validate for %d node template(s)\n", Clean(addr), templates)
}

// KeyringView is `ghcrsync keyring`'s view (the writer pod's command).
type KeyringView struct{ s Streams }

// NewKeyring is the keyring command's view on s.
func NewKeyring(s Streams) *KeyringView { return &KeyringView{s: s} }

// Report says what the writer found or did, in the line its pod's log and termination message
// carry.
func (v *KeyringView) Report(r keyring.Report) { fmt.Fprintln(v.s.Out, r.String()) }
