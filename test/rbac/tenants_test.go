package rbac

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// A namespace relabelled from the cluster credential's consumers to a tenant's (whoever may
// label a namespace) moves no credential on the next unattended run: plan names it and leaves
// it alone, apply writes nothing there, and the apply identity's own write of the tenant's mark is
// refused by ghcrsync-secrets (the pin). The reviewed change — the roles rendered again and
// applied — is what moves it: plan then says so, and apply writes the tenant's credential.
func TestARelabelledTenantNamespaceMovesOnlyWithTheRoles(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	const moved = "team-move"

	pkg := registry.PrivateOrg + "/tenant-a:v1"
	if err := sb.Registry().Push(pkg); err != nil {
		t.Fatal(err)
	}

	tenant, file, err := sb.TenantSecret("tenant-a", "tenant-a-rbac")
	if err != nil {
		t.Fatal(err)
	}

	withTenant := func(cfg string) string {
		b, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}

		endpoint := regexp.MustCompile(`endpoint\s*=\s*"[^"]*"`).FindString(string(b))
		block := "\ncredential \"tenant-a\" {\n  registry = \"ghcr.io\"\n  " + endpoint + "\n  sops_file = \"" + sb.Path(file) + "\"\n" +
			"  prove = [\"" + pkg + "\"]\n  consumers {\n    selector = \"ghcrsync.dev/tenant=a\"\n    secret = \"" + sandbox.ConsumerSecret + "\"\n  }\n}\n"

		if err := os.WriteFile(cfg, append(b, block...), 0o600); err != nil {
			t.Fatal(err)
		}

		return cfg
	}

	create(t, kube, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: moved, Labels: map[string]string{sandbox.ConsumerLabel: "ghcr"}}})
	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), moved, metav1.DeleteOptions{}) })

	create(t, kube, manifests(t, "namespace.yaml")...)
	admin := withTenant(adminConfig(t, sb))
	install(t, sb, rendered(t, sb, admin)...)

	planner, applier := newIdentity(t, sb, "ghcrsync-plan"), newIdentity(t, sb, "ghcrsync-apply")
	planner.cfg, applier.cfg = withTenant(planner.cfg), withTenant(applier.cfg)
	ownWritesAdmitted(t, sb, planner.cfg)

	// The cluster credential's consumer: written, marked with it.
	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	before := secretIn(t, moved)
	if before.Annotations[object.CredentialAnnotation] != "ghcr" {
		t.Fatalf("%s/%s marks: %v, want the cluster credential's", moved, sandbox.ConsumerSecret, before.Annotations)
	}

	// Relabelled into tenant-a's selector.
	ns, err := kube.CoreV1().Namespaces().Get(ctx, moved, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	delete(ns.Labels, sandbox.ConsumerLabel)
	ns.Labels["ghcrsync.dev/tenant"] = "a"

	if _, err := kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	where := moved + "/" + sandbox.ConsumerSecret

	r := ghcrsync(t, sb, "plan", "--config", planner.cfg)
	if r.code != 0 || !strings.Contains(r.stdout, "Namespace moved between credentials: "+where+` holds the cluster credential`) ||
		!strings.Contains(r.stdout, where+" (consumer, credential tenant-a) will be left alone") {
		t.Fatalf("plan after the relabel: exit %d, want the move named and the secret left alone\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// apply writes nothing there; the verdict holds both credentials back.
	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 5 || !strings.Contains(r.stdout, where) {
		t.Fatalf("apply after the relabel: exit %d, want 5 naming %s\n%s\n%s", r.code, where, r.stdout, r.stderr)
	}

	if after := secretIn(t, moved); after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("%s was written after the relabel: %v", where, after.Annotations)
	}

	// The pin: the apply identity's own write of the tenant's mark there is refused.
	err = updateSecret(moved, sandbox.ConsumerSecret, func(s *corev1.Secret) {
		metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.CredentialAnnotation, "tenant-a")
	})(clientsOf(t, applier))
	if !refusedBy(err, permission.SecretsPolicy) {
		t.Fatalf("the apply identity's write of tenant-a's mark into %s: %v, want a refusal by %s", where, err, permission.SecretsPolicy)
	}

	// The reviewed change: the roles rendered again with the namespace under tenant-a, once the
	// API server has loaded them (the write the pin refused is admitted).
	install(t, sb, rendered(t, sb, admin)...)
	sandboxtest.Eventually(t, inForceTimeout, "the API server loads the new rendering", func() error {
		return updateSecret(moved, sandbox.ConsumerSecret, func(s *corev1.Secret) {
			metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.CredentialAnnotation, "tenant-a")
		})(clientsOf(t, applier))
	})

	r = ghcrsync(t, sb, "plan", "--config", planner.cfg)
	if r.code != 0 || !strings.Contains(r.stdout, `it moves from the cluster credential to credential "tenant-a"`) || strings.Contains(r.stdout, "Namespace moved between credentials") {
		t.Fatalf("plan with the roles rendered again: exit %d, want the move\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 0 {
		t.Fatalf("apply with the roles rendered again: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	after := secretIn(t, moved)
	if after.Annotations[object.CredentialAnnotation] != "tenant-a" || !strings.Contains(string(after.Data[corev1.DockerConfigJsonKey]), tenant.Username) {
		t.Fatalf("%s after the move: marks %v, want tenant-a's credential", where, after.Annotations)
	}
}

// secretIn is the pull secret of namespace ns, as the admin reads it.
func secretIn(t *testing.T, ns string) *corev1.Secret {
	t.Helper()

	s, err := sandboxtest.Get(t).Kube().CoreV1().Secrets(ns).Get(context.Background(), sandbox.ConsumerSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return s
}
