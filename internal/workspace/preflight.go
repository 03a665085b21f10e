package workspace

import (
	"context"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/permission"
)

// The command classes, each with its own identity (internal/permission).
const (
	CommandPlan    = permission.CommandPlan
	CommandFences  = permission.CommandFences
	CommandApply   = permission.CommandApply
	CommandRelease = permission.CommandRelease
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
	needs, err := w.Needs(ctx, needsOf)
	if err != nil {
		return err
	}

	denied, err := w.Kube.Denied(ctx, needs)
	if err != nil || len(denied) == 0 {
		return err
	}

	return &cluster.PermissionError{Command: command, Identity: w.Kube.Identity(ctx), Grant: grantHint, Denied: denied}
}

// Needs lists the Kubernetes permissions a command needs with this configuration and the
// consumer namespaces the cluster has now (permission.Needs).
func (w *Workspace) Needs(ctx context.Context, command string) ([]cluster.Access, error) {
	var targets []cluster.SecretTarget

	if command == CommandPlan || command == CommandApply {
		if w.Config.ConsumerSelector != nil {
			if denied, err := w.Kube.Denied(ctx, []cluster.Access{permission.ListNamespaces()}); err != nil || len(denied) > 0 {
				// The targets cannot be listed: what is needed besides them is reported with it.
				return permission.Needs(w.Config, command, nil), err
			}
		}

		var err error
		if targets, err = w.SecretTargets(ctx); err != nil {
			return nil, err
		}
	}

	return permission.Needs(w.Config, command, targets), nil
}
