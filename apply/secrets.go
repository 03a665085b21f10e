package apply

import (
	"context"
	"fmt"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// fanoutOptions are the fan-out's inputs: what it writes, and the state write before each write.
func (r *run) fanoutOptions() secretwrite.Options {
	root, proof := "", time.Duration(0)
	if fr := r.in.Config.FluxRoot; fr != nil {
		root = fr.OCIRepository
		if fr.Prove {
			proof = fr.ProofTimeout
		}
	}

	st, store := r.in.State, r.in.Store

	return secretwrite.Options{
		Data: r.cred.PullSecretJSON(), Tenants: credential.PullSecretJSONs(r.in.Tenants), OCIRepository: root, RootProof: proof, Assert: r.lease.Verify, Hooks: r.o.SecretHooks, Log: r.log,
		Configuration: r.in.Config.Identity(), Credential: r.in.Config.Credential.Name, Clock: r.in.Clock,
		Registry: r.in.Config.Credential.Registry, Username: r.cred.Username, Password: r.cred.Password(), Templates: r.in.Config.NodeTemplates,
		Record: func(ns, name, role, outcome string) error {
			cred, revision := r.desired(ns, name)
			st.PutSecret(state.SecretRecord{Namespace: ns, Name: name, Role: role, Credential: cred, DesiredRevision: revision, Outcome: outcome, Updated: r.in.Clock.Now().UTC()})

			return store.Write(st)
		},
	}
}

// desired is the credential a pull secret of the plan receives ("": the cluster's) and its
// revision: the cluster credential's revision, or the tenant's.
func (r *run) desired(namespace, name string) (credential, revision string) {
	for _, sp := range r.p.Secrets {
		if sp.Namespace == namespace && sp.Secret == name && sp.Credential != "" {
			t, _ := r.p.Tenant(sp.Credential)

			return sp.Credential, t.Revision
		}
	}

	return "", r.p.CredentialRevision
}

// templates writes the node templates before any node is fenced: a machine the autoscaler
// creates while the run goes on boots with the new credential.
func (r *run) templates(ctx context.Context) {
	for _, s := range r.in.PullSecrets.Templates(ctx, r.p, r.fanoutOptions()) {
		r.keptSecret(s)
		r.templateOutcome(ctx, s)
	}
}

// consumers writes the consumer pull secrets.
func (r *run) consumers(ctx context.Context) {
	ctx = requests.WithStep(ctx, "run: secrets")

	for _, s := range r.in.PullSecrets.Consumers(ctx, r.p, r.fanoutOptions()) {
		r.keptSecret(s)
		r.secretOutcome(ctx, s)
	}
}

// root judges the cluster as it is — every node, consumer and template read again — and writes
// the root Flux secret only when nothing but the root itself still uses the old credential.
func (r *run) root(ctx context.Context) {
	ctx = requests.WithStep(ctx, "run: root")

	if h := r.o.Hooks.BeforeRoot; h != nil {
		h()
	}

	held := ""

	keepErr := r.held(ctx, "the root")

	switch v, err := r.rootInventory(ctx); {
	case keepErr != nil:
		held = "the Flux suspension was not kept (" + keepErr.Error() + "): kustomize-controller may put Git's copy back"
	case r.res.Failed() > 0:
		held = fmt.Sprintf("%d part(s) of this run failed", r.res.Failed())
	case err != nil:
		held = "the cluster could not be read again to verify nothing else uses the old credential (" + redact.Logged(r.log, err) + ")"
	case !v.Except(plan.UseRoot).SafeToRevoke:
		held = "the old credential is still used by " + v.Except(plan.UseRoot).StillUsedBy()
	}

	for _, s := range r.in.PullSecrets.Root(ctx, r.p, r.fanoutOptions(), held) {
		r.res.Secrets = append(r.res.Secrets, s)
		r.secretOutcome(ctx, s)
	}
}

// secretOutcome logs a pull secret's outcome and records it as an Event on the Secret.
func (r *run) secretOutcome(ctx context.Context, s secretwrite.Result) {
	r.log.Info("pull secret", "secret", s.Namespace+"/"+s.Secret, "role", s.Role, "outcome", s.Outcome, "detail", s.Message)

	switch s.Outcome {
	case secretwrite.Written:
		what := "credential revision " + human.Short(r.p.CredentialRevision) + " (" + r.in.Config.Credential.Registry + " entry only)"
		if cred, revision := r.desired(s.Namespace, s.Secret); cred != "" {
			what = "credential " + cred + " at revision " + human.Short(revision)
		}

		r.event(ctx, object.SecretRef(s.Namespace, s.Secret), "GhcrsyncPullSecretWritten", "run "+r.res.Holder+" wrote "+what, false)
	case secretwrite.Failed:
		r.event(ctx, object.SecretRef(s.Namespace, s.Secret), "GhcrsyncPullSecretFailed", "run "+r.res.Holder+": "+s.Message, true)
	}
}

// templateOutcome logs a node template's outcome and records it as an Event on its Secret.
func (r *run) templateOutcome(ctx context.Context, s secretwrite.Result) {
	r.log.Info("node template", "secret", s.Namespace+"/"+s.Secret, "key", s.Key, "outcome", s.Outcome, "detail", s.Message)

	switch s.Outcome {
	case secretwrite.Written:
		r.event(ctx, object.SecretRef(s.Namespace, s.Secret), "GhcrsyncNodeTemplateWritten",
			"run "+r.res.Holder+" wrote credential revision "+human.Short(r.p.CredentialRevision)+" into node template key "+s.Key, false)
	case secretwrite.Failed:
		r.event(ctx, object.SecretRef(s.Namespace, s.Secret), "GhcrsyncNodeTemplateFailed", "run "+r.res.Holder+": "+s.Message, true)
	}
}

// settleSecrets closes the records of pull secrets and node templates an earlier run was killed
// while writing (state.SecretWriting), or saw fail, that this run found already in sync: whatever
// that write became, nothing is in flight and the target holds the credential. One state write
// for all of them.
func (r *run) settleSecrets() {
	st, settled := r.in.State, 0

	for _, res := range r.res.Secrets {
		if res.Outcome != secretwrite.Unchanged {
			continue
		}

		for _, rec := range st.Secrets {
			unsettled := rec.Outcome == state.SecretWriting || rec.Outcome == string(secretwrite.Failed)
			if rec.Namespace == res.Namespace && rec.Name == res.RecordName() && unsettled {
				_, revision := r.desired(rec.Namespace, rec.Name)
				rec.Outcome, rec.DesiredRevision, rec.Updated = string(secretwrite.Unchanged), revision, r.in.Clock.Now().UTC()
				st.PutSecret(rec)
				settled++
			}
		}
	}

	if settled == 0 {
		return
	}

	if err := r.in.Store.Write(st); err != nil {
		r.log.Warn("could not record that in-flight pull secret writes are settled", "error", err)
	}
}
