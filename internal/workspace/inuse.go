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

		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := credential.Prove(pctx, credential.Registry{Endpoint: cfg.Endpoint, TrustedHosts: cfg.TrustedHosts}, creds[d], targets)
		cancel()

		u.State = judgeProof(err)
		if err != nil {
			u.Detail = err.Error()
		}

		out = append(out, *u)
	}

	return out
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
