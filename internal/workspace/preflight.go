package workspace

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/permission"
)

// The command classes, each with its own identity (internal/permission).
const (
	CommandPlan    = permission.CommandPlan
	CommandFences  = permission.CommandFences
	CommandApply   = permission.CommandApply
	CommandRelease = permission.CommandRelease
	// CommandTemplate is the node templates' writer, apply's for that step only.
	CommandTemplate = permission.CommandTemplate
)

// grantHint is how an identity gets what a command needs: the roles `ghcrsync rbac` renders
// from this very list.
const grantHint = "render them with `ghcrsync rbac --config FILE` and apply its output"

// Preflight checks, before anything is written, that the cluster grants every permission the
// command needs with this configuration: a command RBAC would stop half-way fails here, naming
// what is missing.
func (w *Workspace) Preflight(ctx context.Context, command string) error {
	return w.preflight(ctx, command, command)
}

// PreflightReads checks what command needs to read (everything plan reads): apply checks that
// before it reads the state and makes or checks a plan, its writes once the plan stands.
func (w *Workspace) PreflightReads(ctx context.Context, command string) error {
	return w.preflight(ctx, command, CommandPlan)
}

func (w *Workspace) preflight(ctx context.Context, command, needsOf string) error {
	targets, err := w.targets(ctx, needsOf)
	if err != nil {
		return err
	}

	needs := permission.Needs(w.Config, needsOf, targets)
	escapesOf := []string{needsOf}

	writesTemplates := command == CommandApply && len(w.Config.NodeTemplates) > 0
	// With a template identity, it writes the node templates and makes their dry runs (plan's,
	// and those of the plan apply makes): checked on its own connection (below), not on this one.
	split := (writesTemplates || command == CommandPlan && len(w.Config.NodeTemplates) > 0) && w.Config.Cluster.TemplateKubeconfig != ""
	templateWrite := w.templateWrites()

	switch {
	case split:
		needs = slices.DeleteFunc(needs, templateWrite)
	case writesTemplates && needsOf == CommandApply: // apply's own connection writes them: it needs the template identity's rights
		needs = append(needs, permission.Needs(w.Config, CommandTemplate, nil)...)
		escapesOf = append(escapesOf, CommandTemplate)
	}

	denied, err := w.Kube.Denied(ctx, needs)
	if err != nil {
		return err
	}

	outside, denied := permission.OutsideRoles(needs, denied, permission.SelectorOnly(w.Config, targets))
	if len(denied) > 0 {
		grant := grantHint
		if slices.ContainsFunc(denied, templateWrite) {
			grant += "; node templates are written by the template identity: give its kubeconfig as cluster.template_kubeconfig or --template-kubeconfig"
		}

		return &cluster.PermissionError{Command: command, Identity: w.Kube.Identity(ctx), Grant: grant, Denied: denied}
	}

	if split { // once, before the fleet is read (a plan makes the templates' dry runs)
		if err := w.preflightTemplates(ctx, command); err != nil {
			return err
		}
	}

	for _, ns := range outside {
		w.outside[ns] = true
	}

	inside := slices.DeleteFunc(slices.Clone(targets), func(t cluster.SecretTarget) bool { return w.outside[t.Namespace] })

	var escapes []cluster.Escape
	for _, of := range escapesOf {
		escapes = append(escapes, permission.Escapes(w.Config, of, inside)...)
	}

	return w.contained(ctx, w.Kube, command, escapes)
}

// templateWrites reports whether an access is one of the template identity's writes.
func (w *Workspace) templateWrites() func(cluster.Access) bool {
	needs := permission.Needs(w.Config, CommandTemplate, nil)

	return func(a cluster.Access) bool { return a.Verb != "get" && slices.Contains(needs, a) }
}

// preflightTemplates checks the template identity's connection (cluster.template_kubeconfig):
// the same cluster as the command's (its kube-system namespace), every right the template writes
// need, and the admission policy that bounds them in force.
func (w *Workspace) preflightTemplates(ctx context.Context, of string) error {
	if w.templatesChecked {
		return nil
	}

	tc, err := w.TemplateKube()
	if err != nil {
		return err
	}

	command := of + " (node templates)"

	denied, err := tc.Denied(ctx, permission.Needs(w.Config, CommandTemplate, nil))
	if err != nil {
		return err
	}

	if len(denied) > 0 {
		return &cluster.PermissionError{Command: command, Identity: tc.Identity(ctx), Grant: grantHint, Denied: denied}
	}

	mine, err := w.Kube.ClusterUID(ctx)
	if err != nil {
		return err
	}

	theirs, err := tc.ClusterUID(ctx)
	if err != nil {
		return err
	}

	if mine != theirs {
		return fmt.Errorf("cluster.template_kubeconfig %s reaches another cluster (%s, kube-system uid %s) than %s's (%s, uid %s): "+
			"point it at this cluster; nothing was changed", w.Config.Cluster.TemplateKubeconfig, tc.Server, theirs, of, w.Kube.Server, mine)
	}

	if err := w.contained(ctx, tc, command, permission.Escapes(w.Config, CommandTemplate, nil)); err != nil {
		return err
	}

	w.templatesChecked = true

	return nil
}

// contained proves that the admission policies bounding the command's writes are in force: each
// escape (a write the identity's rights allow and its policy must refuse) is tried as a
// server-side dry run and must come back refused by that policy. The policies bind ghcrsync's
// service accounts: an identity that is not a service account (a person's, an admin's) is not
// what they bound, and is not checked.
func (w *Workspace) contained(ctx context.Context, conn *cluster.Connection, command string, escapes []cluster.Escape) error {
	if len(escapes) == 0 {
		return nil
	}

	who := conn.Identity(ctx)
	if !strings.HasPrefix(who, "system:serviceaccount:") {
		return nil
	}

	if err := conn.Contained(ctx, escapes); err != nil {
		return fmt.Errorf("ghcrsync %s will not run as %s: its writes are not bounded to the fields ghcrsync writes (%w). "+
			"Install the admission policies `ghcrsync rbac --config FILE` renders (they come first in its output; docs/rbac.md), "+
			"and give the API server a few seconds to load them; nothing was changed", command, who, err)
	}

	return nil
}

// targets are the consumer secrets a command's permissions are checked for: the ones the
// cluster has now, for the commands that read them (none when the namespaces cannot be listed:
// the missing list right is then reported with the rest).
func (w *Workspace) targets(ctx context.Context, command string) ([]cluster.SecretTarget, error) {
	if command != CommandPlan && command != CommandApply {
		return nil, nil
	}

	if len(w.Config.Selectors()) > 0 {
		if denied, err := w.Kube.Denied(ctx, []cluster.Access{permission.ListNamespaces()}); err != nil || len(denied) > 0 {
			return nil, err
		}
	}

	return w.Fleet().Targets(ctx)
}
