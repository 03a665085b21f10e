package apply

import (
	"errors"
	"fmt"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// StaleError is a saved plan that no longer matches the world.
type StaleError struct{ Why, PlanPath string }

func (e *StaleError) Error() string {
	return fmt.Sprintf("Saved plan is stale — %s. Run `ghcrsync plan --out %s` again, review it, and apply the new plan. Nothing was changed.", e.Why, e.PlanPath)
}

// IsStale reports whether err is a stale plan.
func IsStale(err error) bool {
	var s *StaleError

	return errors.As(err, &s)
}

// IsRefused reports whether err is apply refusing the saved plan before any write: stale,
// not authentic, damaged or of another format.
func IsRefused(err error) bool {
	var na *NotAuthenticError

	return IsStale(err) || errors.As(err, &na) || plan.IsRefused(err)
}

// clusterRef is the cluster apply is talking to.
type clusterRef struct{ uid, server string }

func checkStale(p *plan.Plan, path string, cfg *config.Config, cred *credential.Credential, st *state.State, cl clusterRef, now time.Time) error {
	if path == "" {
		path = "PLANFILE"
	}

	stale := func(why string, args ...any) error {
		return &StaleError{Why: fmt.Sprintf(why, args...), PlanPath: path}
	}

	switch {
	case p.ClusterUID != cl.uid:
		return stale("it was made for another cluster (kube-system namespace uid %s), and %s is cluster %s: check the kubeconfig and context", human.ShortOrNone(p.ClusterUID), cl.server, human.ShortOrNone(cl.uid))
	case now.After(p.ExpiresAt):
		return stale("it expired at %s", p.ExpiresAt.Format(time.RFC3339))
	case p.ConfigDigest != cfg.Digest:
		return stale("it was made from another configuration (%s changed since)", cfg.Path)
	case p.CredentialRevision != cred.Revision():
		return stale("it was made for another credential revision (%s now holds %s, the plan %s)", cfg.Credential.SopsFile,
			human.Short(cred.Revision()), human.Short(p.CredentialRevision))
	case p.State.Lineage != "" && p.State.Lineage != st.Lineage:
		return stale("it was made against another state (lineage %q, now %q)", p.State.Lineage, st.Lineage)
	case p.State.Serial != st.Serial || p.State.Lineage != st.Lineage:
		return stale("the state was changed by another operation after the plan was created (serial %d, now %d)", p.State.Serial, st.Serial)
	case p.RetiredSeal():
		return &NotAuthenticError{PlanPath: path, Retired: true}
	}

	key, err := cred.PlanKey()
	if err != nil {
		return err
	}

	if !p.Authentic(key) {
		return &NotAuthenticError{PlanPath: path}
	}

	return nil
}

// checkTenants refuses a plan whose tenant credentials are not the ones this run decrypted: a
// tenant's SOPS file changed since the plan (its pull secrets would get another credential than
// the one proved), or the plan names a tenant the run was not given.
func checkTenants(p *plan.Plan, path string, cfg *config.Config, tenants map[string]*credential.Credential) error {
	if path == "" {
		path = "PLANFILE"
	}

	for _, t := range p.Tenants {
		c, ok := tenants[t.Name]
		switch {
		case !ok:
			return &StaleError{PlanPath: path, Why: fmt.Sprintf("it rotates credential %q, which this configuration does not name", t.Name)}
		case c.PullSecretRevision() != t.Revision:
			file := ""
			if tc := cfg.Tenant(t.Name); tc != nil {
				file = tc.Credential.SopsFile
			}

			return &StaleError{PlanPath: path, Why: fmt.Sprintf("it was made for another revision of credential %q (%s now holds %s, the plan %s)", t.Name, file,
				human.Short(c.PullSecretRevision()), human.Short(t.Revision))}
		}
	}

	if len(p.Tenants) != len(tenants) {
		return &StaleError{PlanPath: path, Why: fmt.Sprintf("it rotates %d tenant credential(s) and the configuration names %d", len(p.Tenants), len(tenants))}
	}

	return nil
}

// NotAuthenticError is a saved plan whose authentication code does not verify, or was made by
// an older ghcrsync with a retired scheme (Retired).
type NotAuthenticError struct {
	PlanPath string
	Retired  bool
}

func (e *NotAuthenticError) Error() string {
	if e.Retired {
		return fmt.Sprintf("Saved plan %s was sealed by an older ghcrsync, whose plan authentication is retired (its key could be "+
			"computed from public digests, or from the token alone): this version does not trust it. Run `ghcrsync plan --out %s` again, review it, and "+
			"apply the new plan. Nothing was changed.", e.PlanPath, e.PlanPath)
	}

	return fmt.Sprintf("Saved plan %s is not authentic — its authentication code (an HMAC under a key only the SOPS file's age key and the credential together give) "+
		"does not verify: it was changed after `ghcrsync plan` made it. Run `ghcrsync plan --out %s` again, review it, and apply "+
		"the new plan. Nothing was changed.", e.PlanPath, e.PlanPath)
}
