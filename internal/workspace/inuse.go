package workspace

import (
	"context"
	"errors"
	"net/http"

	"github.com/ghcrsync/ghcrsync/internal/config"
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

	type key struct{ credential, digest string }

	uses := map[key]*plan.CredentialInUse{}
	creds := map[key]*credential.Credential{}

	var order []key

	for _, h := range held {
		k := key{h.Credential, h.Cred.AuthDigest()}

		u, ok := uses[k]
		if !ok {
			u = &plan.CredentialInUse{Digest: k.digest, Credential: h.Credential}
			uses[k], creds[k] = u, h.Cred
			order = append(order, k)
		}

		if h.Node != "" {
			u.Nodes = append(u.Nodes, h.Node)
		} else {
			u.Secrets = append(u.Secrets, h.Secret)
		}
	}

	out := make([]plan.CredentialInUse, 0, len(order))

	for _, k := range order {
		u := uses[k]

		// Each credential in use is judged against the packages of the credential it stands for:
		// the cluster's (its prove targets and the probe's), or its tenant's.
		of, want, targets, ok := w.judgedAs(k.credential)
		if !ok {
			continue
		}

		to := desired
		if k.credential != "" && want != nil {
			to = want.AuthDigest()
		}

		if u.Desired = k.digest == to; u.Desired {
			u.State, u.Detail = plan.CredentialValid, "the credential this plan rotates to, proved above"
			out = append(out, *u)

			continue
		}

		u.State, u.Detail, u.Denied = w.judgeTargets(ctx, of, creds[k], want, targets)

		out = append(out, *u)
	}

	return out
}

// judgedAs is what a credential in use of the named credential ("": the cluster's) is judged
// against: that credential's configuration, its desired (decrypted already: the plan proved it)
// and its packages.
func (w *Workspace) judgedAs(name string) (cfg config.Credential, desired *credential.Credential, targets []string, ok bool) {
	if name == "" {
		targets, _ = w.proveTargets()
		desired, _ = w.Credential()

		return w.Config.Credential, desired, targets, true
	}

	t := w.Config.Tenant(name)
	if t == nil {
		return config.Credential{}, nil, nil, false
	}

	desired, _ = w.TenantCredential(name)

	return t.Credential, desired, t.Credential.Prove, true
}

// judgeTargets asks the registry about a credential in use, package by package, waiting out
// the registry's passing trouble (Retry): refused when the registry refuses the credential
// itself (at the token step) or every package; partial when it pulls some packages and is
// denied others (a package the old token was never granted: a warning naming it, no
// emergency); else as the proof of each package says. A denial is checked against a control,
// the desired credential asked for the same package at that moment: accepted, the denial is
// this credential's (refused at once); denied too, the registry is refusing everyone for now,
// and the denial is waited out like a transient answer.
func (w *Workspace) judgeTargets(ctx context.Context, of config.Credential, c, desired *credential.Credential, targets []string) (state, detail string, denied []string) {
	var firstErr error

	pulled := 0

	for _, t := range targets {
		var control func(context.Context) error

		if desired != nil {
			control = func(ctx context.Context) error {
				_, err := credential.ProveWithin(ctx, w.registryOf(of), desired, []string{t}, proofTimeout)

				return err
			}
		}

		_, tried, err := w.retryOf(of).Prove(ctx, w.registryOf(of), c, []string{t}, proofTimeout, control)

		var pe *credential.ProofError

		switch {
		case err == nil:
			pulled++

			if s := tried.String(); s != "" && detail == "" {
				detail = "valid, once the registry answered (" + s + ")"
			}

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
		return plan.CredentialValid, detail, nil
	case pulled == 0:
		return plan.CredentialRefused, firstErr.Error(), nil
	}

	return plan.CredentialPartial, firstErr.Error(), denied
}

// judgeProof is what a proof's outcome says of a credential in use: refused only by the
// registry's own refusal (401, 403) — stable, where it was asked again.
func judgeProof(err error) string {
	var (
		pe      *credential.ProofError
		retried *credential.Error
	)

	switch {
	case err == nil:
		return plan.CredentialValid
	case errors.As(err, &retried):
		if retried.Stable {
			return plan.CredentialRefused
		}
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

	for name, read := range tc.FillFacts(ctx, nodes, w.Config.Credential.Registry, w.Config.Talos.Concurrency) {
		if read.Credential != nil {
			held = append(held, Held{Node: name, Cred: read.Credential})
		}
	}

	return func(ctx context.Context) []plan.CredentialInUse { return w.CheckInUse(ctx, held, desired, false) }, nil
}
