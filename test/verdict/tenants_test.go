package verdict

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The tenants' packages on the sandbox's registry, one each (private: under its private org).
const (
	repoA    = registry.PrivateOrg + "/tenant-a"
	repoB    = registry.PrivateOrg + "/tenant-b"
	packageA = repoA + ":v1"
	packageB = repoB + ":v1"
)

// tenants is a configuration with the sandbox's cluster credential and two tenant credentials:
// tenant-a's consumers by namespace label, tenant-b's by name; each denies the other's package.
func tenants(t *testing.T, sb *sandbox.Sandbox, fileA, fileB string) string {
	t.Helper()

	return config(t, sb, func(s string) string {
		endpoint := regexp.MustCompile(`endpoint\s*=\s*"[^"]*"`).FindString(s)
		block := func(name, file, prove, deny, consumers string) string {
			return "\ncredential \"" + name + "\" {\n  registry = \"ghcr.io\"\n  " + endpoint + "\n  sops_file = \"" + sb.Path(file) + "\"\n" +
				"  prove = [\"" + prove + "\"]\n  deny = [\"" + deny + "\"]\n  retry_window = \"20s\"\n  denied_window = \"3s\"\n" + consumers + "}\n"
		}

		return s + block("tenant-a", fileA, packageA, packageB, "  consumers {\n    selector = \"ghcrsync.dev/tenant=a\"\n    secret = \"ghcr-pull\"\n  }\n") +
			block("tenant-b", fileB, packageB, packageA, "  consumer \"b1\" {\n    namespace = \"tenant-b1\"\n    secret = \"ghcr-pull\"\n  }\n")
	})
}

// One configuration, three credentials: the cluster's (nodes, template, root, its consumers) and
// two tenants', each reaching its own namespaces. A tenant credential that can pull the other
// tenant's package fails plan (exit 3, naming it) before anything is saved; isolated, one plan
// lists the three rotations and one apply carries them out, with a verdict per credential. After
// exit 0 every old credential is revoked in the registry, and every consumer still pulls what it
// needs — and a tenant's secret still cannot pull the other tenant's package.
func TestSeveralCredentialsInOneRun(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	kube := sb.Kube()
	reg := sb.Registry()

	if err := reg.Push(packageA, packageB); err != nil {
		t.Fatal(err)
	}

	// The tenants' namespaces, with the pull secrets they had before: each tenant's old credential.
	oldA, _, err := sb.TenantSecret("tenant-a", "tenant-a-old")
	if err != nil {
		t.Fatal(err)
	}

	oldB, _, err := sb.TenantSecret("tenant-b", "tenant-b-old")
	if err != nil {
		t.Fatal(err)
	}

	held := map[string]sandbox.Credential{"tenant-a1": oldA, "tenant-a2": oldA, "tenant-b1": oldB}
	for ns, c := range held {
		labels := map[string]string{}
		if strings.HasPrefix(ns, "tenant-a") {
			labels["ghcrsync.dev/tenant"] = "a"
		}

		tenantNamespace(t, kube, ns, labels, c)
	}

	// What the cluster may hold now: the fleet's first credential, or the one its SOPS file holds.
	oldCluster := []sandbox.Credential{sb.OldCredential(), sb.NewCredential()}
	rotate(t, sb, "tenants-cluster")

	newA, fileA, err := sb.TenantSecret("tenant-a", "tenant-a-new")
	if err != nil {
		t.Fatal(err)
	}

	newB, fileB, err := sb.TenantSecret("tenant-b", "tenant-b-new")
	if err != nil {
		t.Fatal(err)
	}

	cfg := tenants(t, sb, fileA, fileB)
	out := filepath.Join(t.TempDir(), "plan.out")

	// Not isolated: the registry grants every tenant every package until told otherwise.
	if r := ghcrsync(t, sb, "plan", "--config", cfg, "--out", out); r.code != 3 || !strings.Contains(r.stderr, `"tenant-a"`) || !strings.Contains(r.stderr, packageB) {
		t.Fatalf("plan with tenant-a granted %s: exit %d, want 3 naming the package\n%s\n%s", packageB, r.code, r.stdout, r.stderr)
	}

	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a plan was saved for a tenant credential that is not isolated (%v)", err)
	}

	// The control: each tenant's machine account refused the other's package, as GHCR grants them.
	for user, repo := range map[string]string{"tenant-a-old": repoB, "tenant-a-new": repoB, "tenant-b-old": repoA, "tenant-b-new": repoA} {
		reg.DenyRepository(user, repo)
	}

	// tenant-b's old machine account was revoked already: its pods cannot pull new images. The
	// plan is an emergency naming that tenant's credential, judged against its own package
	// (tenant-a's old one, which pulls tenant-a's, is not).
	reg.RevokeCredential(oldB.Username)

	r := ghcrsync(t, sb, "plan", "--config", cfg, "--out", out)
	if !strings.Contains(r.stdout, "EMERGENCY ROTATION") || !strings.Contains(r.stdout, "the tenant-b credential") || strings.Contains(r.stdout, "the tenant-a credential") {
		t.Fatalf("plan with tenant-b's old credential revoked: want an emergency naming tenant-b's only\n%s\n%s", r.stdout, r.stderr)
	}

	for _, want := range []string{"Credentials: 3 in this plan", "ghcr: revision", "tenant-a: revision", "2 consumer pull secrets (2 to write) only; isolated: the registry refuses it " + packageB,
		"tenant-b: revision", "tenant-a1/ghcr-pull (consumer, credential tenant-a) will be updated", "tenant-b1/ghcr-pull (consumer, credential tenant-b) will be updated"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("plan of three credentials: exit %d, want 0 and %q\n%s\n%s", r.code, want, r.stdout, r.stderr)
		}
	}

	r = ghcrsync(t, sb, "apply", "--config", cfg, out)
	for _, want := range []string{"Verdict, by credential:", "ghcr: The old credential is no longer used", "tenant-a: safe to revoke its old credential: all 2",
		"tenant-b: safe to revoke its old credential: all 1"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("apply of three credentials: exit %d, want 0 and %q\n%s\n%s", r.code, want, r.stdout, r.stderr)
		}
	}

	// Each secret holds its own credential, marked with it and the configuration.
	for _, x := range []struct {
		ns, credential string
		want           sandbox.Credential
	}{{"tenant-a1", "tenant-a", newA}, {"tenant-a2", "tenant-a", newA}, {"tenant-b1", "tenant-b", newB}} {
		s := secretOf(t, kube, x.ns)
		if got := credentialIn(t, s); got != x.want {
			t.Errorf("%s/ghcr-pull holds %s's credential, want %s's", x.ns, got.Username, x.want.Username)
		}

		if s.Annotations[object.CredentialAnnotation] != x.credential || s.Annotations[object.ConfigurationAnnotation] != "flux-system/ghcr-auth-refresh" {
			t.Errorf("%s/ghcr-pull's marks: %v, want credential %s and the configuration's Lease", x.ns, s.Annotations, x.credential)
		}
	}

	// Revoke every old credential: nothing may break.
	for _, c := range append(oldCluster, oldA, oldB) {
		reg.RevokeCredential(c.Username)
	}

	for ns, pkg := range map[string]string{"tenant-a1": packageA, "tenant-a2": packageA, "tenant-b1": packageB} {
		c := credentialIn(t, secretOf(t, kube, ns))
		if _, err := reg.Pull(ctx, registry.RegistryHost+"/"+pkg, c.Username, c.Password); err != nil {
			t.Errorf("%s/ghcr-pull cannot pull %s after the old credentials were revoked: %v", ns, pkg, err)
		}

		other := packageA
		if pkg == packageA {
			other = packageB
		}

		if _, err := reg.Pull(ctx, registry.RegistryHost+"/"+other, c.Username, c.Password); err == nil {
			t.Errorf("%s/ghcr-pull pulls the other tenant's %s: not isolated", ns, other)
		}
	}

	for _, ns := range consumerNamespaces(t, kube) {
		c := credentialIn(t, secretOf(t, kube, ns))
		if _, err := reg.Pull(ctx, registry.RegistryHost+"/ghcrsync/private-probe:v1", c.Username, c.Password); err != nil {
			t.Errorf("the cluster credential's consumer %s/ghcr-pull cannot pull after the old credentials were revoked: %v", ns, err)
		}
	}

	// An external writer puts tenant-b's old credential back while apply runs: named in
	// tenant-b's verdict, exit 5; tenant-a's verdict stays safe. The control: the writer gone,
	// the next run ends clean.
	newB2, fileB2, err := sb.TenantSecret("tenant-b", "tenant-b-new2")
	if err != nil {
		t.Fatal(err)
	}

	reg.DenyRepository(newB2.Username, repoA)

	cfg = tenants(t, sb, fileA, fileB2)
	stop := putBack(t, kube, "tenant-b1", newB)

	r = apply(t, sb, cfg)
	stop()

	if r.code != 5 || !strings.Contains(r.stdout, "tenant-b: do not revoke its old credential yet") || !strings.Contains(r.stdout, "ksail wrote it") ||
		!strings.Contains(r.stdout, "tenant-a: safe to revoke its old credential") {
		t.Fatalf("apply with ksail putting tenant-b's old credential back: exit %d, want 5 naming ksail in tenant-b's verdict\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if r := apply(t, sb, cfg); r.code != 0 || !strings.Contains(r.stdout, "tenant-b: safe to revoke its old credential") {
		t.Fatalf("apply once the writer stopped: exit %d, want 0\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if got := credentialIn(t, secretOf(t, kube, "tenant-b1")); got != newB2 {
		t.Fatalf("tenant-b1/ghcr-pull holds %s's credential, want %s's", got.Username, newB2.Username)
	}

	// Nothing left to do for any credential: no changes, and every verdict clean (exit 0).
	if r := ghcrsync(t, sb, "plan", "--config", cfg, "--detailed-exitcode"); r.code != 0 || !strings.Contains(r.stdout, "No changes.") {
		t.Fatalf("plan with every credential in sync: exit %d, want 0 and no changes\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// tenantNamespace creates a tenant namespace holding a pull secret with c (removed at the end).
func tenantNamespace(t *testing.T, kube kubernetes.Interface, ns string, labels map[string]string, c sandbox.Credential) {
	t.Helper()

	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sandbox.ConsumerSecret}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: sandbox.DockerConfigJSON(c)}}, metav1.CreateOptions{FieldManager: "tenant-onboarding"})
	if err != nil {
		t.Fatal(err)
	}
}

func secretOf(t *testing.T, kube kubernetes.Interface, ns string) *corev1.Secret {
	t.Helper()

	s, err := kube.CoreV1().Secrets(ns).Get(context.Background(), sandbox.ConsumerSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return s
}

// credentialIn is the registry credential a pull secret holds.
func credentialIn(t *testing.T, s *corev1.Secret) sandbox.Credential {
	t.Helper()

	c, err := held(s)
	if err != nil {
		t.Fatalf("%s/%s: %v", s.Namespace, s.Name, err)
	}

	return c
}

func held(s *corev1.Secret) (sandbox.Credential, error) {
	var cfg struct {
		Auths map[string]struct{ Username, Password string } `json:"auths"`
	}

	err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &cfg)
	a := cfg.Auths[registry.RegistryHost]

	return sandbox.Credential{Username: a.Username, Password: a.Password}, err
}

// consumerNamespaces are the namespaces of the cluster credential's consumers (the sandbox's label).
func consumerNamespaces(t *testing.T, kube kubernetes.Interface) []string {
	t.Helper()

	nss, err := kube.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: sandbox.ConsumerLabel + "=ghcr"})
	if err != nil || len(nss.Items) == 0 {
		t.Fatalf("the sandbox's consumer namespaces: %v (%d)", err, len(nss.Items))
	}

	var out []string
	for _, ns := range nss.Items {
		out = append(out, ns.Name)
	}

	return out
}

// putBack watches ns's pull secret and, the first time another credential than old is written
// to it, writes old back as the field manager "ksail" (a platform tool re-applying its own copy).
// stop ends the watch; the write lands at most once.
func putBack(t *testing.T, kube kubernetes.Interface, ns string, old sandbox.Credential) (stop func()) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	w, err := kube.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", sandbox.ConsumerSecret).String()})
	if err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})

	go func() {
		defer close(done)

		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok || ev.Type != watch.Modified {
				continue
			}

			if c, err := held(s); err != nil || c == old {
				continue
			}

			for range 10 { // a conflict with ghcrsync's own read-back or service-account write: read again
				cur, err := kube.CoreV1().Secrets(ns).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
				if err != nil {
					return
				}

				cur.Data[corev1.DockerConfigJsonKey] = sandbox.DockerConfigJSON(old)
				if _, err = kube.CoreV1().Secrets(ns).Update(ctx, cur, metav1.UpdateOptions{FieldManager: "ksail"}); !apierrors.IsConflict(err) {
					return
				}

				time.Sleep(50 * time.Millisecond)
			}

			return
		}
	}()

	return func() {
		cancel()
		w.Stop()
		<-done
	}
}
