// Package rbac tests ghcrsync's RBAC — what `ghcrsync rbac` renders from a configuration, and
// its admission policy — on the sandbox with RBAC and the API server's admission plugins on:
// each command class runs as a service account bound to exactly its rendered roles; every rule
// is needed (with any one removed, the command fails early, names the missing permission, and
// writes nothing); and the apply identity cannot reach another identity's token.
package rbac

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 2, Autoscaled: 0, Seed: 11})
}

const ns = "ghcrsync-system"

// manifests reads deploy/rbac/FILE into typed objects.
func manifests(t *testing.T, file string) []runtime.Object {
	t.Helper()

	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}

	return decode(t, file, data)
}

// rendered is what `ghcrsync rbac` prints for cfg, run as the sandbox's admin (it lists the
// consumer namespaces), as typed objects.
func rendered(t *testing.T, sb *sandbox.Sandbox, cfg string) []runtime.Object {
	t.Helper()

	r := ghcrsync(t, sb, "rbac", "--config", cfg, "--kubeconfig", sb.Path(sandbox.KubeconfigFile))
	if r.code != 0 {
		t.Fatalf("ghcrsync rbac: exit %d\n%s", r.code, r.stderr)
	}

	return decode(t, "ghcrsync rbac", []byte(r.stdout))
}

// ofClass are the roles (ClusterRole, Role) rendered for a command class.
func ofClass(objs []runtime.Object, class string) []runtime.Object {
	var out []runtime.Object

	for _, o := range objs {
		switch r := o.(type) {
		case *rbacv1.ClusterRole:
			if r.Labels["app.kubernetes.io/component"] == class {
				out = append(out, o)
			}
		case *rbacv1.Role:
			if r.Labels["app.kubernetes.io/component"] == class {
				out = append(out, o)
			}
		}
	}

	return out
}

func decode(t *testing.T, file string, data []byte) []runtime.Object {
	t.Helper()

	var out []runtime.Object

	dec := utilyaml.NewYAMLReader(bufioReader(data))

	for {
		doc, err := dec.Read()
		if err != nil {
			break
		}

		if onlyComments(doc) {
			continue
		}

		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}

		out = append(out, obj)
	}

	return out
}

// create makes every object, or updates one an earlier test left in place. An update, not a
// delete and a create: the API server keeps enforcing a policy (and authorizing a role) it
// already holds while it loads the new version, where a deleted one is gone until the new one
// loads — the window apply's containment preflight rightly refuses in (install waits it out).
func create(t *testing.T, kube kubernetes.Interface, objs ...runtime.Object) {
	t.Helper()

	ctx := context.Background()
	opts := metav1.CreateOptions{}

	for _, o := range objs {
		var err error

		switch x := o.(type) {
		case *corev1.Namespace:
			_, err = kube.CoreV1().Namespaces().Create(ctx, x, opts)
		case *corev1.ServiceAccount:
			_, err = kube.CoreV1().ServiceAccounts(x.Namespace).Create(ctx, x, opts)
		case *rbacv1.ClusterRole:
			c := kube.RbacV1().ClusterRoles()
			err = upsert(ctx, x, c.Create, c.Get, c.Update)
		case *rbacv1.Role:
			c := kube.RbacV1().Roles(x.Namespace)
			err = upsert(ctx, x, c.Create, c.Get, c.Update)
		case *rbacv1.ClusterRoleBinding:
			c := kube.RbacV1().ClusterRoleBindings()
			err = replaceBinding(ctx, x, x.RoleRef, c.Create, c.Get, c.Update, c.Delete, func(b *rbacv1.ClusterRoleBinding) rbacv1.RoleRef { return b.RoleRef })
		case *rbacv1.RoleBinding:
			c := kube.RbacV1().RoleBindings(x.Namespace)
			err = replaceBinding(ctx, x, x.RoleRef, c.Create, c.Get, c.Update, c.Delete, func(b *rbacv1.RoleBinding) rbacv1.RoleRef { return b.RoleRef })
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			c := kube.AdmissionregistrationV1().ValidatingAdmissionPolicies()
			err = upsert(ctx, x, c.Create, c.Get, c.Update)
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			c := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
			err = upsert(ctx, x, c.Create, c.Get, c.Update)
		default:
			t.Fatalf("unexpected object %T", o)
		}

		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T: %v", o, err)
		}
	}
}

// upsert creates obj, or updates the object of its name in place.
func upsert[T interface {
	metav1.Object
	runtime.Object
}](ctx context.Context, obj T, create func(context.Context, T, metav1.CreateOptions) (T, error),
	get func(context.Context, string, metav1.GetOptions) (T, error), update func(context.Context, T, metav1.UpdateOptions) (T, error),
) error {
	_, err := create(ctx, obj, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}

	cur, err := get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}

	next := obj.DeepCopyObject().(T)
	next.SetResourceVersion(cur.GetResourceVersion())
	_, err = update(ctx, next, metav1.UpdateOptions{})

	return err
}

// replaceBinding is upsert for a role binding, whose roleRef cannot change: one bound to
// another role is deleted and created again.
func replaceBinding[T interface {
	metav1.Object
	runtime.Object
}](ctx context.Context, obj T, ref rbacv1.RoleRef, create func(context.Context, T, metav1.CreateOptions) (T, error),
	get func(context.Context, string, metav1.GetOptions) (T, error), update func(context.Context, T, metav1.UpdateOptions) (T, error),
	del func(context.Context, string, metav1.DeleteOptions) error, refOf func(T) rbacv1.RoleRef,
) error {
	if cur, err := get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil && refOf(cur) != ref {
		_ = del(ctx, obj.GetName(), metav1.DeleteOptions{})
	}

	return upsert(ctx, obj, create, get, update)
}

// identity is a service account's configuration: a kubeconfig with its token, and the
// sandbox's ghcrsync.hcl pointed at it (state in a Kubernetes Secret, so the state rules are
// exercised too).
type identity struct {
	sa, user, cfg string
	// templateUser is the template identity's user, when the configuration names one.
	templateUser string
}

// newIdentity is the service account sa's configuration. The apply identity's names the
// template identity's kubeconfig too (cluster.template_kubeconfig): it writes no node template.
func newIdentity(t *testing.T, sb *sandbox.Sandbox, sa string) identity {
	t.Helper()

	id := identity{sa: sa, user: userOf(sa), cfg: identityConfig(t, sb, tokenKubeconfig(t, sb, sa))}
	if sa == permission.AccountFor(permission.CommandApply) {
		id = withTemplates(t, sb, id, permission.AccountFor(permission.CommandTemplate))
	}

	return id
}

// userOf is the service account sa's user name.
func userOf(sa string) string { return "system:serviceaccount:" + ns + ":" + sa }

// tokenKubeconfig is a kubeconfig holding a fresh token of the service account sa.
func tokenKubeconfig(t *testing.T, sb *sandbox.Sandbox, sa string) string {
	t.Helper()

	tok, err := sb.Kube().CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", sa, err)
	}

	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := sb.WriteTokenKubeconfig(kc, tok.Status.Token); err != nil {
		t.Fatal(err)
	}

	return kc
}

// withTemplates is id with the service account templateSA as its template identity
// (cluster.template_kubeconfig), and templateUser set to it.
func withTemplates(t *testing.T, sb *sandbox.Sandbox, id identity, templateSA string) identity {
	t.Helper()

	// Beside the configuration it is made from: a relative path in it means the same file.
	cfg := filepath.Join(filepath.Dir(id.cfg), "ghcrsync-templates.hcl")

	text, err := os.ReadFile(id.cfg)
	if err != nil {
		t.Fatal(err)
	}

	re := regexp.MustCompile(`(?m)^(\s*)kubeconfig\s*=.*$`)
	if !re.Match(text) {
		t.Fatalf("%s has no cluster.kubeconfig to set the template identity's beside", id.cfg)
	}

	line := "${0}\n${1}template_kubeconfig = " + strconv.Quote(tokenKubeconfig(t, sb, templateSA))
	if err := os.WriteFile(cfg, re.ReplaceAll(text, []byte(line)), 0o600); err != nil {
		t.Fatal(err)
	}

	id.cfg, id.templateUser = cfg, userOf(templateSA)

	return id
}

// identityConfig is the sandbox's ghcrsync.hcl pointed at kubeconfig, with the state in a
// Kubernetes Secret (so the state rules are exercised too).
func identityConfig(t *testing.T, sb *sandbox.Sandbox, kubeconfig string) string {
	t.Helper()

	dir := filepath.Dir(kubeconfig)
	if kubeconfig == sb.Path(sandbox.KubeconfigFile) {
		dir = t.TempDir()
	}

	cfg := sandboxtest.CopyConfig(t, sb, dir, func(text string) string {
		text = strings.Replace(text, `"`+sb.Path(sandbox.KubeconfigFile)+`"`, `"`+kubeconfig+`"`, 1)

		return strings.Replace(text, "state {\n  backend = \"local\"\n  path    = \""+filepath.Join(dir, "ghcrsync.state.json")+"\"\n}",
			"state {\n  backend   = \"kubernetes\"\n  namespace = \"flux-system\"\n  secret    = \"ghcrsync-state\"\n}", 1)
	})

	if b, _ := os.ReadFile(cfg); !strings.Contains(string(b), `backend   = "kubernetes"`) {
		t.Fatalf("the identity's configuration keeps the local state:\n%s", b)
	}

	return cfg
}

// adminConfig is identityConfig as the sandbox's admin (to render the RBAC with).
func adminConfig(t *testing.T, sb *sandbox.Sandbox) string {
	return identityConfig(t, sb, sb.Path(sandbox.KubeconfigFile))
}

type result struct {
	code           int
	stdout, stderr string
}

func ghcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) result {
	t.Helper()

	var r result
	r.code, r.stdout, r.stderr = sandboxtest.Run(t, sb, args...)

	return r
}

// writes lists the writes user made (permission checks persist nothing and are left out).
func writes(t *testing.T, sb *sandbox.Sandbox, user string) []string {
	t.Helper()

	return sandboxtest.Mutations(t, sb, user)
}

// Each command class runs with exactly its rendered roles; the plan identity cannot apply or
// release (the negative control), and release undoes a killed apply's fence with its own.
func TestRenderedRBAC(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)

	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	planner, applier, releaser := newIdentity(t, sb, "ghcrsync-plan"), newIdentity(t, sb, "ghcrsync-apply"), newIdentity(t, sb, "ghcrsync-release")

	if r := ghcrsync(t, sb, "plan", "--config", planner.cfg); r.code != 0 {
		t.Fatalf("plan as %s: exit %d\n%s", planner.sa, r.code, r.stderr)
	}

	if r := ghcrsync(t, sb, "fences", "--config", planner.cfg); r.code != 0 {
		t.Fatalf("fences as %s: exit %d\n%s", planner.sa, r.code, r.stderr)
	}

	if w := writes(t, sb, planner.user); len(w) != 0 {
		t.Fatalf("plan and fences wrote: %v", w)
	}

	// The plan identity is refused apply, early and by name.
	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", planner.cfg); r.code != 1 ||
		!strings.Contains(r.stderr, "ghcrsync apply cannot run as "+planner.user+": the cluster denies patch nodes") ||
		!strings.Contains(r.stderr, "ghcrsync rbac --config") {
		t.Fatalf("apply as the plan identity: exit %d\n%s", r.code, r.stderr)
	}

	if w := writes(t, sb, planner.user); len(w) != 0 {
		t.Fatalf("a refused apply wrote: %v", w)
	}

	// A credential of its own (an earlier test of the package may have rotated the last one
	// everywhere): the rotation below writes the node template.
	if _, err := sb.RotateSecret("rbac-first"); err != nil {
		t.Fatal(err)
	}

	// The apply identity alone writes no node template: without the template identity's
	// kubeconfig, apply is refused early, naming the right and the setting, and writes nothing.
	alone := identityConfig(t, sb, filepath.Join(filepath.Dir(applier.cfg), "kubeconfig"))
	before := len(writes(t, sb, applier.user))

	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", alone); r.code != 1 ||
		!strings.Contains(r.stderr, "the cluster denies update secrets "+sandbox.TemplateSecret+" in "+sandbox.TemplateNamespace) ||
		!strings.Contains(r.stderr, "--template-kubeconfig") {
		t.Fatalf("apply as %s without the template identity: exit %d\n%s", applier.sa, r.code, r.stderr)
	}

	if w := writes(t, sb, applier.user); len(w) != before {
		t.Fatalf("apply refused for the template identity wrote: %v", w[before:])
	}

	// A full rotation as the apply identity, the node templates written with the template
	// identity alone: the template holds the new credential and the autoscaler restarted.
	before, beforeTemplate := len(writes(t, sb, applier.user)), len(writes(t, sb, applier.templateUser))

	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 0 || !strings.Contains(r.stdout, "0 failed") {
		t.Fatalf("apply as %s: exit %d\n%s\n%s", applier.sa, r.code, r.stdout, r.stderr)
	}

	templateWrites(t, sb, applier, before, beforeTemplate)

	// A second rotation killed at its first reboot leaves a fence the release identity undoes.
	if _, err := sb.RotateSecret("rbac-second"); err != nil {
		t.Fatal(err)
	}

	killedAtReboot(t, sb, applier)

	if r := ghcrsync(t, sb, "release", "--config", planner.cfg); r.code != 1 || !strings.Contains(r.stderr, "the cluster denies patch nodes") {
		t.Fatalf("release as the plan identity: exit %d\n%s", r.code, r.stderr)
	}

	if r := ghcrsync(t, sb, "release", "--config", releaser.cfg); r.code != 0 || !strings.Contains(r.stdout, "Release complete") ||
		!strings.Contains(r.stdout, "LEFT CORDONED (an unproven hold)") {
		t.Fatalf("release as %s: exit %d\n%s\n%s", releaser.sa, r.code, r.stdout, r.stderr)
	}

	// The node killed at its reboot had its Talos config written and never proved: it stays out
	// of service, listed, until a proof — or a person's --uncordon-unproven — returns it.
	if r := ghcrsync(t, sb, "fences", "--config", planner.cfg); r.code != 0 || !strings.Contains(r.stdout, "unproven") {
		t.Fatalf("fences after release: %s", r.stdout)
	}

	if r := ghcrsync(t, sb, "release", "--uncordon-unproven", "--config", releaser.cfg); r.code != 0 || !strings.Contains(r.stdout, "WITHOUT a proof") {
		t.Fatalf("release --uncordon-unproven as %s: exit %d\n%s\n%s", releaser.sa, r.code, r.stdout, r.stderr)
	}

	if r := ghcrsync(t, sb, "fences", "--config", planner.cfg); r.code != 0 || !strings.Contains(r.stdout, "No fence is held") {
		t.Fatalf("fences after release --uncordon-unproven: %s", r.stdout)
	}
}

// templateWrites checks a rotation by id (its identities' writes from the counts given): the
// node template and the autoscaler's restart were written by id's template identity, and
// nothing of either by the apply identity.
func templateWrites(t *testing.T, sb *sandbox.Sandbox, id identity, before, beforeTemplate int) {
	t.Helper()

	tmpl := "/api/v1/namespaces/" + sandbox.TemplateNamespace + "/secrets/" + sandbox.TemplateSecret
	dep := "/apis/apps/v1/namespaces/kube-system/deployments/" + sandbox.AutoscalerDeployment

	for _, w := range writes(t, sb, id.user)[before:] {
		if strings.Contains(w, tmpl) || strings.Contains(w, dep) {
			t.Errorf("the apply identity wrote %s", w)
		}
	}

	var wroteTemplate, restarted bool

	for _, w := range writes(t, sb, id.templateUser)[beforeTemplate:] {
		wroteTemplate = wroteTemplate || strings.HasPrefix(w, "update "+tmpl) && strings.HasSuffix(w, " 200")
		restarted = restarted || strings.HasPrefix(w, "patch "+dep) && strings.HasSuffix(w, " 200")
	}

	if !wroteTemplate || !restarted {
		t.Fatalf("the template identity wrote the template: %v, restarted the autoscaler: %v (its writes: %v)", wroteTemplate, restarted, writes(t, sb, id.templateUser))
	}

	s, err := sb.Kube().CoreV1().Secrets(sandbox.TemplateNamespace).Get(context.Background(), sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	pools, err := nodetemplate.Read(nodetemplate.FormatHcloud, s.Data[sandbox.TemplateKey], []string{sandbox.TemplatePool}, sandbox.RegistryHost)
	if err != nil {
		t.Fatal(err)
	}

	want := authdigest.Of(sb.NewCredential().Username, sb.NewCredential().Password)
	if len(pools) != 1 || pools[0].Digest != want {
		t.Fatalf("node template %s/%s does not hold the new credential after the rotation: %+v", sandbox.TemplateNamespace, sandbox.TemplateSecret, pools)
	}
}

// ghcrsync as a Job in the cluster: in-cluster config from the service-account mount a pod
// gets (a real TokenRequest token, the cluster CA, KUBERNETES_SERVICE_*), exactly the shipped
// apply roles, the Kubernetes state backend, and its own node (GHCRSYNC_NODE_NAME, from the
// downward API) left alone rather than drained from under it.
func TestInClusterJob(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)
	objs := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, objs...)

	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), "ghcrsync-apply",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	saDir := t.TempDir()

	podEnv, err := sb.WriteServiceAccountDir(saDir, ns, tok.Status.Token)
	if err != nil {
		t.Fatal(err)
	}

	base := newIdentity(t, sb, "ghcrsync-apply") // its config, with the kubeconfig line replaced below
	text, err := os.ReadFile(base.cfg)
	if err != nil {
		t.Fatal(err)
	}

	cfg := filepath.Join(t.TempDir(), "ghcrsync.hcl")
	lines := strings.Split(string(text), "\n")

	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "kubeconfig") {
			lines[i] = "  in_cluster          = true\n  service_account_dir = \"" + saDir + "\""
		}
	}

	if err := os.WriteFile(cfg, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}

	if _, err := sb.RotateSecret("in-cluster"); err != nil {
		t.Fatal(err)
	}

	job := func() (int, string, string) {
		cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", cfg)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile),
			"GHCRSYNC_NODE_NAME=prod-worker-1"}, podEnv...)

		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()

		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}

	// The negative control: started while a policy is not yet in force (its binding withheld, as
	// in the moment before the API server loads it), the Job refuses to run and writes nothing.
	before := len(writes(t, sb, base.user))

	withholdKustomizationsPolicy(t, sb, newIdentity(t, sb, "ghcrsync-release"))

	if code, stdout, stderr := job(); code != 1 || !strings.Contains(stderr, "will not run as "+base.user) || !strings.Contains(stderr, permission.KustomizationsPolicy) {
		t.Fatalf("apply in the cluster before its policies are in force: exit %d, want 1 naming %s\n%s\n%s", code, permission.KustomizationsPolicy, stdout, stderr)
	}

	if w := writes(t, sb, base.user); len(w) != before {
		t.Fatalf("apply in the cluster wrote before its policies were in force: %v", w[before:])
	}

	install(t, sb, permissionPolicy(objs)...)

	code, stdout, stderr := job()

	// Its own node stays on the old credential, so the run is not done: exit 5, the verdict
	// naming it and what to do.
	if code != 5 || !strings.Contains(stdout, "0 failed") ||
		!strings.Contains(stdout, "ghcrsync itself runs on it") ||
		!strings.Contains(stdout, "it is still used by 1 node (prod-worker-1)") || !strings.Contains(stdout, "run ghcrsync from another node") {
		t.Fatalf("apply in the cluster: exit %d\n%s\n%s", code, stdout, stderr)
	}

	all := writes(t, sb, base.user)
	if len(all) == before {
		t.Fatal("the run wrote nothing as the service account: did it use the in-cluster identity?")
	}

	for _, w := range all[before:] {
		if strings.Contains(w, "/nodes/prod-worker-1") {
			t.Errorf("ghcrsync touched the node it runs on: %s", w)
		}
	}
}

// killedAtReboot runs apply as id and kills it once a node is rebooting.
func killedAtReboot(t *testing.T, sb *sandbox.Sandbox, id identity) {
	t.Helper()

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", id.cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
	sandboxtest.KillWhen(t, cmd, "rebooting: node=")
}

// Every rule of the rendered roles is needed: with any one removed, the command it serves fails
// before any write and names the permission.
func TestEveryRuleIsNeeded(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)

	// Everything rendered (the policies, and the identities a copy is not made of: the template
	// identity apply's copies write templates with, the apply identity the template's copies
	// serve).
	all := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, all...)

	// Which command each class's roles serve.
	classes := []struct {
		class   string
		command []string
	}{
		{"plan", []string{"plan"}},
		{"apply", []string{"apply", "--auto-approve"}},
		{"release", []string{"release"}},
		{"template", []string{"apply", "--auto-approve"}},
	}

	n := 0

	for _, c := range classes {
		roles := ofClass(all, c.class)

		for ri, role := range roles {
			for i, rule := range rulesOf(role) {
				n++
				id := fmt.Sprintf("minus-%d", n)
				name := fmt.Sprintf("%s/%s[%d] %s %s", c.class, nameOf(role), i, rule.Verbs[0], rule.Resources[0])

				t.Run(strings.NewReplacer("/", "_", " ", "_", "[", "_", "]", "").Replace(name), func(t *testing.T) {
					var held []runtime.Object

					for rj, r := range roles {
						if rj == ri {
							r = withoutRule(r, i)
						}

						held = append(held, r)
					}

					who := bindCopies(t, sb, id, held)
					cfg, by := who.cfg, ""

					switch c.class {
					case "apply": // it writes the templates with the template identity
						cfg = withTemplates(t, sb, who, permission.AccountFor(permission.CommandTemplate)).cfg
					case "template": // the copy writes the apply identity's templates
						applier := identity{sa: "ghcrsync-apply", user: userOf("ghcrsync-apply"), cfg: identityConfig(t, sb, tokenKubeconfig(t, sb, "ghcrsync-apply"))}
						cfg, by = withTemplates(t, sb, applier, who.sa).cfg, applier.user
					}

					before := 0
					if by != "" {
						before = len(writes(t, sb, by))
					}

					args := append(append([]string{}, c.command...), "--config", cfg)
					r := ghcrsync(t, sb, args...)

					// The refusal names what the rule grants: one of its verbs on its resource (the
					// first the command checks).
					var want []string

					named := false

					for _, verb := range rule.Verbs {
						w := verb + " " + rule.Resources[0]
						if g := rule.APIGroups[0]; g != "" {
							w += "." + g
						}

						want = append(want, w)
						named = named || strings.Contains(r.stderr, "denies "+w) || strings.Contains(r.stderr, "; "+w)
					}

					if r.code != 1 || !strings.Contains(r.stderr, "cannot run as "+who.user) || !strings.Contains(r.stderr, "the cluster denies") || !named {
						t.Fatalf("without %s: exit %d, want 1 naming one of %q\n%s", name, r.code, want, r.stderr)
					}

					if w := writes(t, sb, who.user); len(w) != 0 {
						t.Fatalf("without %s the command wrote: %v", name, w)
					}

					if by != "" {
						if w := writes(t, sb, by); len(w) != before {
							t.Fatalf("without %s the apply identity wrote: %v", name, w[before:])
						}
					}
				})
			}
		}
	}

	if n < 30 {
		t.Fatalf("only %d rules rendered", n)
	}
}

// permissionPolicy is the admission policy in a rendering.
func permissionPolicy(objs []runtime.Object) []runtime.Object {
	var out []runtime.Object

	for _, o := range objs {
		switch o.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			out = append(out, o)
		}
	}

	return out
}

func rulesOf(o runtime.Object) []rbacv1.PolicyRule {
	switch r := o.(type) {
	case *rbacv1.ClusterRole:
		return r.Rules
	case *rbacv1.Role:
		return r.Rules
	}

	return nil
}

func nameOf(o runtime.Object) string {
	switch r := o.(type) {
	case *rbacv1.ClusterRole:
		return r.Name
	case *rbacv1.Role:
		return r.Name
	}

	return ""
}

func withoutRule(o runtime.Object, i int) runtime.Object {
	switch r := o.(type) {
	case *rbacv1.ClusterRole:
		c := r.DeepCopy()
		c.Rules = append(c.Rules[:i:i], c.Rules[i+1:]...)

		return c
	case *rbacv1.Role:
		c := r.DeepCopy()
		c.Rules = append(c.Rules[:i:i], c.Rules[i+1:]...)

		return c
	}

	return o
}

// bindCopies creates a service account named for id, copies of the roles (renamed for id) and
// bindings of them to it.
func bindCopies(t *testing.T, sb *sandbox.Sandbox, id string, roles []runtime.Object) identity {
	t.Helper()

	sa := "rbac-" + id
	objs := []runtime.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}}}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}

	for _, o := range roles {
		switch r := o.(type) {
		case *rbacv1.ClusterRole:
			c := r.DeepCopy()
			c.Name += "-" + id
			objs = append(objs, c, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: c.Name},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: c.Name}, Subjects: subject})
		case *rbacv1.Role:
			c := r.DeepCopy()
			c.Name += "-" + id
			objs = append(objs, c, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: c.Name}, Subjects: subject})
		}
	}

	create(t, sb.Kube(), objs...)

	return newIdentity(t, sb, sa)
}

// onlyComments: a YAML document with nothing but comments and blank lines (kubectl skips it).
func onlyComments(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return false
		}
	}

	return true
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// The escalation the old roles allowed — a cluster-wide create right on Secrets plus a get right
// on a managed name: create a service-account token Secret under that name for a cluster-admin
// service account, and read the token back — is refused to the apply identity everywhere: by
// RBAC outside the consumer namespaces, by the admission policy inside one. Negative controls:
// the same Secret made by an admin is filled with a working cluster-admin token (the attempt is
// real), and without the admission policy the apply identity could make it in a consumer
// namespace (the policy is what refuses it there).
func TestApplyIdentityCannotMintAToken(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	const target, privileged = "team-escalate", "admin-sa"

	create(t, kube, manifests(t, "namespace.yaml")...)
	create(t, kube,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: target, Labels: map[string]string{sandbox.ConsumerLabel: "ghcr"}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: privileged, Namespace: target}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "escalate-" + privileged},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: privileged, Namespace: target}}})

	t.Cleanup(func() {
		_ = kube.RbacV1().ClusterRoleBindings().Delete(ctx, "escalate-"+privileged, metav1.DeleteOptions{})
		// No longer a consumer namespace (a terminating one would still match the selector).
		if n, err := kube.CoreV1().Namespaces().Get(ctx, target, metav1.GetOptions{}); err == nil {
			delete(n.Labels, sandbox.ConsumerLabel)
			_, _ = kube.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{})
		}

		_ = kube.CoreV1().Namespaces().Delete(ctx, target, metav1.DeleteOptions{})
	})

	objs := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, objs...)

	if !slices.ContainsFunc(ofClass(objs, "apply"), func(o runtime.Object) bool { r, ok := o.(*rbacv1.Role); return ok && r.Namespace == target }) {
		t.Fatalf("the rendering has no apply Role in the consumer namespace %s", target)
	}

	applier := newIdentity(t, sb, "ghcrsync-apply")
	as := sandboxtest.KubeFrom(t, filepath.Join(filepath.Dir(applier.cfg), "kubeconfig"))

	token := func(ns, name string, typ corev1.SecretType) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{corev1.ServiceAccountNameKey: privileged}}, Type: typ}
	}

	// The policy is enforced once the API server has loaded it.
	sandboxtest.Eventually(t, 30*time.Second, "the admission policy refuses the token Secret", func() error {
		_, err := as.CoreV1().Secrets(target).Create(ctx, token(target, sandbox.ConsumerSecret, corev1.SecretTypeServiceAccountToken), metav1.CreateOptions{})
		if err == nil {
			_ = kube.CoreV1().Secrets(target).Delete(ctx, sandbox.ConsumerSecret, metav1.DeleteOptions{})

			return errors.New("created")
		}

		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ghcrsync-secrets") {
			return fmt.Errorf("refused, but not by the policy: %v", err)
		}

		return nil
	})

	for _, tc := range []struct {
		name   string
		secret *corev1.Secret
		by     string // what refuses it
	}{
		{"token_in_a_namespace_with_no_role", token("kube-system", sandbox.ConsumerSecret, corev1.SecretTypeServiceAccountToken), "cannot create resource"},
		{"token_in_default", token("default", sandbox.ConsumerSecret, corev1.SecretTypeServiceAccountToken), "cannot create resource"},
		{"opaque_with_a_service_account_annotation", token(target, sandbox.ConsumerSecret, corev1.SecretTypeOpaque), "never write a service-account annotation"},
		{"bootstrap_token", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sandbox.ConsumerSecret, Namespace: target}, Type: corev1.SecretTypeBootstrapToken}, "write only pull secrets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := as.CoreV1().Secrets(tc.secret.Namespace).Create(ctx, tc.secret, metav1.CreateOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.by) {
				t.Fatalf("want a refusal (%s), got %v", tc.by, err)
			}
		})
	}

	// Nothing beyond the command's needs: rights the old roles gave, each refused.
	for _, a := range []authorizationv1.ResourceAttributes{
		{Verb: "create", Resource: "secrets", Namespace: "kube-system"},
		{Verb: "get", Resource: "secrets", Namespace: "kube-system", Name: sandbox.ConsumerSecret},
		{Verb: "patch", Resource: "serviceaccounts", Namespace: "kube-system", Name: "default"},
		{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: target, Name: privileged},
		{Verb: "create", Resource: "pods", Namespace: "default"},
		{Verb: "create", Resource: "events", Namespace: "kube-public"},
		{Verb: "get", Resource: "secrets", Namespace: target, Name: "other"},
	} {
		r, err := as.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}

		if r.Status.Allowed {
			t.Errorf("the apply identity may %s %s/%s %s/%s", a.Verb, a.Resource, a.Subresource, a.Namespace, a.Name)
		}
	}

	// The control: an admin's token Secret for that account is filled with a cluster-admin token.
	if _, err := kube.CoreV1().Secrets(target).Create(ctx, token(target, "control-token", corev1.SecretTypeServiceAccountToken), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	assertClusterAdminToken(t, sb, target, "control-token")

	// The control: without the policy, the apply identity's create in the consumer namespace
	// lands, and its get-by-name right reads the token back — the escalation, reproduced.
	_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "ghcrsync-secrets", metav1.DeleteOptions{})
	t.Cleanup(func() { install(t, sb, permissionPolicy(objs)...) })

	sandboxtest.Eventually(t, 30*time.Second, "without the policy, the apply identity makes the token Secret", func() error {
		_, err := as.CoreV1().Secrets(target).Create(ctx, token(target, sandbox.ConsumerSecret, corev1.SecretTypeServiceAccountToken), metav1.CreateOptions{})

		return err
	})

	sandboxtest.Eventually(t, 30*time.Second, "the apply identity reads the token back", func() error {
		s, err := as.CoreV1().Secrets(target).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if len(s.Data[corev1.ServiceAccountTokenKey]) == 0 {
			return errors.New("no token yet")
		}

		return nil
	})
}

// assertClusterAdminToken: the token in ns/name authenticates as an identity that may do
// anything.
func assertClusterAdminToken(t *testing.T, sb *sandbox.Sandbox, ns, name string) {
	t.Helper()

	var tok []byte

	sandboxtest.Eventually(t, 30*time.Second, "the token controller fills "+ns+"/"+name, func() error {
		s, err := sb.Kube().CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if tok = s.Data[corev1.ServiceAccountTokenKey]; len(tok) == 0 {
			return errors.New("no token yet")
		}

		return nil
	})

	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := sb.WriteTokenKubeconfig(kc, string(tok)); err != nil {
		t.Fatal(err)
	}

	r, err := sandboxtest.KubeFrom(t, kc).AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "*", Group: "*", Resource: "*"}}}, metav1.CreateOptions{})
	if err != nil || !r.Status.Allowed {
		t.Fatalf("the control token is not cluster-admin: %v %+v", err, r)
	}
}

// The plan identity's write rights on Secrets exist for plan's server-side dry runs of the
// fan-out (fanout.DryRun): the admission policy lets them be dry runs only, so the escalation
// apply is refused (a token Secret under a managed name, read back) is refused to plan too.
// Negative control: its dry run of the pull secret it would create is admitted.
func TestPlanIdentityWritesOnlyDryRuns(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	ns := sandbox.ConsumerNamespaces[1]

	_ = kube.CoreV1().Secrets(ns).Delete(ctx, sandbox.ConsumerSecret, metav1.DeleteOptions{}) // as if apply had never run

	create(t, kube, manifests(t, "namespace.yaml")...)
	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	planner := newIdentity(t, sb, "ghcrsync-plan")
	as := sandboxtest.KubeFrom(t, filepath.Join(filepath.Dir(planner.cfg), "kubeconfig"))

	token := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sandbox.ConsumerSecret, Namespace: ns,
		Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}}, Type: corev1.SecretTypeServiceAccountToken}

	sandboxtest.Eventually(t, 30*time.Second, "the admission policy refuses the plan identity's real write", func() error {
		_, err := as.CoreV1().Secrets(ns).Create(ctx, token, metav1.CreateOptions{})
		if err == nil {
			_ = kube.CoreV1().Secrets(ns).Delete(ctx, sandbox.ConsumerSecret, metav1.DeleteOptions{})

			return errors.New("created")
		}

		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ghcrsync-") || strings.Contains(err.Error(), "cannot create resource") {
			return fmt.Errorf("refused, but not by an admission policy: %v", err)
		}

		return nil
	})

	// As the fan-out creates it: its label, and its marks (the credential the rendering pins).
	pull := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sandbox.ConsumerSecret, Namespace: ns,
		Labels:      map[string]string{"app.kubernetes.io/managed-by": "ghcrsync"},
		Annotations: map[string]string{object.ConfigurationAnnotation: sandbox.LeaseNamespace + "/ghcr-auth-refresh", object.CredentialAnnotation: "ghcr"}},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}

	if _, err := as.CoreV1().Secrets(ns).Create(ctx, pull, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the plan identity's dry run of the pull secret it would create: %v", err)
	}

	if _, err := kube.CoreV1().Secrets(ns).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a dry run stored the Secret: %v", err)
	}
}
