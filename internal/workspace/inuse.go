package workspace

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/plan"
)

// CheckInUse asks the registry about each distinct credential held (by auth digest), with the
// same token flow and targets as the desired credential's proof: valid; refused (the registry
// rejects it, 401 or 403: revoked, expired, or without access to an image — the runtimes
// holding it cannot pull new images); or unreachable (no answer to go by). The desired
// credential was proved already and is not asked again. A plan made with --skip-proof asks
// nothing (nil).
func (w *Workspace) CheckInUse(ctx context.Context, held []Held, desired string, skipped bool) []plan.CredentialInUse {
	if skipped || len(held) == 0 {
		return nil
	}

	uses := map[string]*plan.CredentialInUse{}
	creds := map[string]*credential.Credential{}

	var order []string

	for _, h := range held {
		d := h.Cred.AuthDigest()

		u, ok := uses[d]
		if !ok {
			u = &plan.CredentialInUse{Digest: d, Desired: d == desired}
			uses[d], creds[d] = u, h.Cred
			order = append(order, d)
		}

		if h.Node != "" {
			u.Nodes = append(u.Nodes, h.Node)
		} else {
			u.Secrets = append(u.Secrets, h.Secret)
		}
	}

	cfg := w.Config.Credential
	targets, _ := w.proveTargets()

	out := make([]plan.CredentialInUse, 0, len(order))

	for _, d := range order {
		u := uses[d]

		if u.Desired {
			u.State, u.Detail = plan.CredentialValid, "the credential this plan rotates to, proved above"
			out = append(out, *u)

			continue
		}

		u.State, u.Detail, u.Denied = judgeTargets(ctx, credential.Registry{Endpoint: cfg.Endpoint, TrustedHosts: cfg.TrustedHosts}, creds[d], targets)

		out = append(out, *u)
	}

	return out
}

// judgeTargets asks the registry about a credential in use, package by package: refused when
// the registry refuses the credential itself (at the token step) or every package; partial when
// it pulls some packages and is denied others (a package the old token was never granted: a
// warning naming it, no emergency); else as the proof of each package says.
func judgeTargets(ctx context.Context, r credential.Registry, c *credential.Credential, targets []string) (state, detail string, denied []string) {
	var firstErr error

	pulled := 0

	for _, t := range targets {
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := credential.Prove(pctx, r, c, []string{t})
		cancel()

		var pe *credential.ProofError

		switch {
		case err == nil:
			pulled++

			continue
		case judgeProof(err) == plan.CredentialRefused && errors.As(err, &pe) && pe.Step == "manifest":
			denied = append(denied, t)
		default: // refused as a whole, or no answer: the other packages would say the same
			return judgeProof(err), err.Error(), nil
		}

		if firstErr == nil {
			firstErr = err
		}
	}

	switch {
	case len(denied) == 0:
		return plan.CredentialValid, "", nil
	case pulled == 0:
		return plan.CredentialRefused, firstErr.Error(), nil
	}

	return plan.CredentialPartial, firstErr.Error(), denied
}

// judgeProof is what a proof's outcome says of a credential in use.
func judgeProof(err error) string {
	var pe *credential.ProofError

	switch {
	case err == nil:
		return plan.CredentialValid
	case errors.As(err, &pe) && (pe.Status == http.StatusUnauthorized || pe.Status == http.StatusForbidden):
		return plan.CredentialRefused
	}

	return plan.CredentialUnreachable
}

// Recheck is CheckInUse again, for a run under way: the credentials the nodes held when it
// started (HeldByNodes) asked of the registry now. A credential revoked since the plan shows as
// refused, and the nodes still holding it cannot take an evicted pod.
type Recheck func(ctx context.Context) []plan.CredentialInUse

// HeldByNodes reads the credentials the nodes' active configs hold now (one LIST of the Nodes,
// one Talos read each; the credentials stay in memory) and returns how to ask the registry
// about them again.
func (w *Workspace) HeldByNodes(ctx context.Context, desired string) (Recheck, error) {
	nodes, _, err := w.Kube.Nodes(ctx, w.Config.Nodes.Selector)
	if err != nil {
		return nil, err
	}

	tc, err := w.Talos(ctx)
	if err != nil {
		return nil, err
	}

	var held []Held

	for name, c := range tc.FillFacts(ctx, nodes, w.Config.Credential.Registry, w.Config.Talos.Concurrency) {
		if c != nil {
			held = append(held, Held{Node: name, Cred: c})
		}
	}

	return func(ctx context.Context) []plan.CredentialInUse { return w.CheckInUse(ctx, held, desired, false) }, nil
}
