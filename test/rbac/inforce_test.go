package rbac

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
)

// install creates (or updates) objs and, when they hold admission policies, waits until the
// API server enforces them: it loads a policy a moment after it is written, and apply or
// release started before then rightly refuses to run (TestInClusterJob failed 3 times in 5 so).
func install(t *testing.T, sb *sandbox.Sandbox, objs ...runtime.Object) {
	t.Helper()

	create(t, sb.Kube(), objs...)

	if len(permissionPolicy(objs)) > 0 {
		policiesInForce(t, sb)
	}
}

// inForceTimeout bounds the wait for the API server to load a policy (seconds, as a rule).
const inForceTimeout = 60 * time.Second

// policiesInForce waits until the apply (with the template identity) and release identities pass their own containment
// preflight — every write each holds that a policy must refuse is tried as a dry run and
// refused by that policy — exactly what the commands check before they write.
func policiesInForce(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	for _, c := range []struct{ account, command string }{
		{"ghcrsync-apply", permission.CommandApply}, {"ghcrsync-release", permission.CommandRelease},
	} {
		id := newIdentity(t, sb, c.account)

		sandboxtest.Eventually(t, inForceTimeout, "the admission policies in force for "+c.account, func() error {
			return contained(id.cfg, c.command)
		})
	}
}

// ownWritesAdmitted waits until the plan identity's dry runs of apply's writes with cfg (a
// configuration of the plan identity) are all admitted: a rendering that changes a policy an
// earlier one installed (a new consumer namespace, a tenant's credential pin) is enforced a
// moment after install returns, and a write the old policy refuses would fail apply meanwhile.
func ownWritesAdmitted(t *testing.T, sb *sandbox.Sandbox, cfg string) {
	t.Helper()

	sandboxtest.Eventually(t, inForceTimeout, "the API server admits apply's writes (plan's dry runs)", func() error {
		r := ghcrsync(t, sb, "plan", "--json", "--config", cfg)
		if r.code != 0 && r.code != 2 {
			return fmt.Errorf("plan: exit %d: %s", r.code, r.stderr)
		}

		var p struct{ Warnings []string }
		if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
			return err
		}

		for _, w := range p.Warnings {
			if strings.Contains(w, "refused a dry run") {
				return errors.New(w)
			}
		}

		return nil
	})
}

// contained is the command's preflight as the identity of cfg: nil once its writes are bounded.
func contained(cfg, command string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	w, err := workspace.Open(workspace.Options{ConfigPath: cfg, Preflight: command, Context: ctx})
	if err != nil {
		return err
	}

	w.Close()

	return nil
}

// withholdKustomizationsPolicy deletes the binding of the Kustomizations policy, as the API
// server holds the policies in the moment before it loads that one, and waits until a write it
// refuses is admitted (the API server has dropped it). install(objs) puts it back.
func withholdKustomizationsPolicy(t *testing.T, sb *sandbox.Sandbox, as identity) {
	t.Helper()

	_ = sb.Kube().AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), permission.KustomizationsPolicy, metav1.DeleteOptions{})

	c := clientsOf(t, as)
	sandboxtest.Eventually(t, inForceTimeout, "the API server drops "+permission.KustomizationsPolicy, func() error {
		// A path no earlier write set: a patch that changes nothing would pass the policy too.
		path := fmt.Sprintf("./elsewhere-%d", time.Now().UnixNano())

		return mergePatch(cluster.Kustomizations, sandbox.RootNamespace, sandbox.Kustomization, spec(map[string]any{"path": path}))(c)
	})
}

// The wait's own negative control: with a policy withheld, policiesInForce's check does not
// pass — so a test that waits on it cannot start a command before the policies are in force.
func TestPoliciesInForceSeesAWithheldPolicy(t *testing.T) {
	sb := sandboxtest.Get(t)

	create(t, sb.Kube(), manifests(t, "namespace.yaml")...)
	objs := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, objs...)

	releaser := newIdentity(t, sb, "ghcrsync-release")
	withholdKustomizationsPolicy(t, sb, releaser)

	err := contained(releaser.cfg, permission.CommandRelease)
	if err == nil || !containsAll(err.Error(), "will not run as "+releaser.user, permission.KustomizationsPolicy) {
		t.Fatalf("the containment check with %s withheld: %v", permission.KustomizationsPolicy, err)
	}

	install(t, sb, objs...)

	if err := contained(releaser.cfg, permission.CommandRelease); err != nil {
		t.Fatalf("after install the policies are not in force: %v", err)
	}

	if b, err := sb.Kube().AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(context.Background(),
		permission.KustomizationsPolicy, metav1.GetOptions{}); err != nil || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Fatalf("the binding is not back: %v", err)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}

	return true
}

// Each bound has a canary in the containment preflight: a policy edited to admit what one rule
// refuses (that rule dropped, the rest in force) fails the preflight of apply or release, naming
// the policy and the write it admitted. The control: the policies as rendered pass it.
func TestEachWeakenedRuleFailsThePreflight(t *testing.T) {
	sb := sandboxtest.Get(t)

	create(t, sb.Kube(), manifests(t, "namespace.yaml")...)
	objs := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, objs...)
	markPullSecret(t, sb.Kube())

	ids := map[string]identity{permission.CommandApply: newIdentity(t, sb, "ghcrsync-apply"), permission.CommandRelease: newIdentity(t, sb, "ghcrsync-release")}

	for _, c := range []struct {
		name, policy, rule, command string
		escape                      cluster.EscapeKind
	}{
		{"secret_names", permission.SecretsPolicy, "Secrets this configuration names", permission.CommandApply, cluster.EscapeOpaqueSecret},
		{"pull_secret_key", permission.SecretsPolicy, "the one key .dockerconfigjson, and change no other", permission.CommandApply, cluster.EscapeSecretKey},
		{"credential_pin", permission.SecretsPolicy, "the credential rendered for its namespace", permission.CommandApply, cluster.EscapeCredentialMark},
		// apply's preflight tries it with the template identity's connection, and names that identity.
		{"template_key", permission.SecretsPolicy, "only the configured key of a node template", permission.CommandApply, cluster.EscapeTemplateKey},
		{"events_apply", permission.EventsPolicy, "ghcrsync's identities record", permission.CommandApply, cluster.EscapeForgedEvent},
		{"events_release", permission.EventsPolicy, "ghcrsync's identities record", permission.CommandRelease, cluster.EscapeForgedEvent},
		{"noexecute_release", permission.NodesPolicy, "never NoExecute", permission.CommandRelease, cluster.EscapeNoExecuteTaint},
		{"foreign_lease", permission.LeasesPolicy, "only the run Lease", permission.CommandApply, cluster.EscapeForeignLease},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := ids[c.command]
			user := id.user

			if c.escape == cluster.EscapeTemplateKey {
				user = id.templateUser
			}
			weakened := weaken(t, objs, c.policy, c.rule)
			create(t, sb.Kube(), weakened)
			t.Cleanup(func() { install(t, sb, objs...) })

			sandboxtest.Eventually(t, inForceTimeout, c.command+"'s preflight refuses "+c.policy+" without its rule", func() error {
				err := contained(id.cfg, c.command)
				if err != nil && containsAll(err.Error(), "will not run as "+user, c.policy, string(c.escape)) {
					return nil
				}

				return fmt.Errorf("preflight: %v", err)
			})

			install(t, sb, objs...)

			if err := contained(id.cfg, c.command); err != nil {
				t.Fatalf("control: with the policies as rendered, the preflight fails: %v", err)
			}
		})
	}
}

// weaken is the rendered policy named policy without its validations whose message holds rule.
func weaken(t *testing.T, objs []runtime.Object, policy, rule string) runtime.Object {
	t.Helper()

	for _, o := range objs {
		p, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy)
		if !ok || p.Name != policy {
			continue
		}

		// Each such rule admits everything (the policy stays valid with its other rules).
		w, dropped := p.DeepCopy(), 0

		for i, v := range w.Spec.Validations {
			if strings.Contains(v.Message, rule) {
				w.Spec.Validations[i].Expression, dropped = "true", dropped+1
			}
		}

		if dropped == 0 {
			t.Fatalf("policy %s has no rule %q", policy, rule)
		}

		return w
	}

	t.Fatalf("no policy %s rendered", policy)

	return nil
}
