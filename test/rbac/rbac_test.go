// Package rbac tests the shipped RBAC (deploy/rbac) on the sandbox with RBAC on: each command
// class runs as a service account bound to exactly its roles, and every rule is needed — with
// any one removed, the command fails early, names the missing permission, and writes nothing.
package rbac

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 2, Autoscaled: 0, Seed: 11})
}

const ns = "ghcrsync-system"

// manifests reads deploy/rbac/*.yaml into typed objects.
func manifests(t *testing.T, file string) []runtime.Object {
	t.Helper()

	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}

	var out []runtime.Object

	dec := utilyaml.NewYAMLReader(bufioReader(data))

	for {
		doc, err := dec.Read()
		if err != nil {
			break
		}

		if len(bytes.TrimSpace(doc)) == 0 {
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

// create makes every object (replacing one left by an earlier test).
func create(t *testing.T, kube kubernetes.Interface, objs ...runtime.Object) {
	t.Helper()

	ctx := context.Background()

	for _, o := range objs {
		var err error

		switch x := o.(type) {
		case *corev1.Namespace:
			_, err = kube.CoreV1().Namespaces().Create(ctx, x, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = kube.CoreV1().ServiceAccounts(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_ = kube.RbacV1().ClusterRoles().Delete(ctx, x.Name, metav1.DeleteOptions{})
			_, err = kube.RbacV1().ClusterRoles().Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.Role:
			_ = kube.RbacV1().Roles(x.Namespace).Delete(ctx, x.Name, metav1.DeleteOptions{})
			_, err = kube.RbacV1().Roles(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_ = kube.RbacV1().ClusterRoleBindings().Delete(ctx, x.Name, metav1.DeleteOptions{})
			_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_ = kube.RbacV1().RoleBindings(x.Namespace).Delete(ctx, x.Name, metav1.DeleteOptions{})
			_, err = kube.RbacV1().RoleBindings(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected object %T in deploy/rbac", o)
		}

		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T: %v", o, err)
		}
	}
}

// identity is a service account's configuration: a kubeconfig with its token, and the
// sandbox's ghcrsync.hcl pointed at it (state in a Kubernetes Secret, so the state rules are
// exercised too).
type identity struct {
	sa, user, cfg string
}

func newIdentity(t *testing.T, sb *sandbox.Sandbox, sa string) identity {
	t.Helper()

	kube := sb.Kube()
	dir := t.TempDir()

	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", sa, err)
	}

	kc := filepath.Join(dir, "kubeconfig")
	if err := sb.WriteTokenKubeconfig(kc, tok.Status.Token); err != nil {
		t.Fatal(err)
	}

	cfg := sandboxtest.CopyConfig(t, sb, dir, func(text string) string {
		text = strings.Replace(text, `"`+sb.Path(sandbox.KubeconfigFile)+`"`, `"`+kc+`"`, 1)

		return strings.Replace(text, "state {\n  backend = \"local\"\n  path    = \""+filepath.Join(dir, "ghcrsync.state.json")+"\"\n}",
			"state {\n  backend   = \"kubernetes\"\n  namespace = \"flux-system\"\n  secret    = \"ghcrsync-state\"\n}", 1)
	})

	if b, _ := os.ReadFile(cfg); !strings.Contains(string(b), `backend   = "kubernetes"`) || strings.Contains(string(b), `"`+sb.Path(sandbox.KubeconfigFile)+`"`) {
		t.Fatalf("the identity's configuration keeps the sandbox's kubeconfig or local state:\n%s", b)
	}

	return identity{sa: sa, user: "system:serviceaccount:" + ns + ":" + sa, cfg: cfg}
}

type result struct {
	code           int
	stdout, stderr string
}

func ghcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) result {
	t.Helper()

	cmd := exec.Command(sandboxtest.Binary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}

	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()

	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

// writes lists the writes user made (permission checks persist nothing and are left out).
func writes(t *testing.T, sb *sandbox.Sandbox, user string) []string {
	t.Helper()

	evs, err := sb.AuditedWrites(user)
	if err != nil {
		t.Fatal(err)
	}

	var out []string

	for _, ev := range evs {
		switch ev.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
			out = append(out, fmt.Sprintf("%s %s %d", ev.Verb, ev.RequestURI, ev.ResponseStatus.Code))
		}
	}

	return out
}

// Each command class runs with exactly its shipped roles; the plan identity cannot apply or
// release (the negative control), and release undoes a killed apply's fence with its own.
func TestShippedRBAC(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	for _, f := range []string{"namespace.yaml", "read.yaml", "apply.yaml", "release.yaml"} {
		create(t, kube, manifests(t, f)...)
	}

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
		!strings.Contains(r.stderr, "ghcrsync apply cannot run as "+planner.user+": the cluster denies patch nodes") {
		t.Fatalf("apply as the plan identity: exit %d\n%s", r.code, r.stderr)
	}

	if w := writes(t, sb, planner.user); len(w) != 0 {
		t.Fatalf("a refused apply wrote: %v", w)
	}

	// A full rotation as the apply identity.
	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 0 || !strings.Contains(r.stdout, "0 failed") {
		t.Fatalf("apply as %s: exit %d\n%s\n%s", applier.sa, r.code, r.stdout, r.stderr)
	}

	// A second rotation killed at its first reboot leaves a fence the release identity undoes.
	if _, err := sb.RotateSecret("rbac-second"); err != nil {
		t.Fatal(err)
	}

	killedAtReboot(t, sb, applier)

	if r := ghcrsync(t, sb, "release", "--config", planner.cfg); r.code != 1 || !strings.Contains(r.stderr, "the cluster denies patch nodes") {
		t.Fatalf("release as the plan identity: exit %d\n%s", r.code, r.stderr)
	}

	if r := ghcrsync(t, sb, "release", "--config", releaser.cfg); r.code != 0 || !strings.Contains(r.stdout, "Release complete") {
		t.Fatalf("release as %s: exit %d\n%s\n%s", releaser.sa, r.code, r.stdout, r.stderr)
	}

	if r := ghcrsync(t, sb, "fences", "--config", planner.cfg); r.code != 0 || !strings.Contains(r.stdout, "No fence is held") {
		t.Fatalf("fences after release: %s", r.stdout)
	}
}

// ghcrsync as a Job in the cluster: in-cluster config from the service-account mount a pod
// gets (a real TokenRequest token, the cluster CA, KUBERNETES_SERVICE_*), exactly the shipped
// apply roles, the Kubernetes state backend, and its own node (GHCRSYNC_NODE_NAME, from the
// downward API) left alone rather than drained from under it.
func TestInClusterJob(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	for _, f := range []string{"namespace.yaml", "read.yaml", "apply.yaml"} {
		create(t, kube, manifests(t, f)...)
	}

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

	before := len(writes(t, sb, base.user))

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", cfg)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile),
		"GHCRSYNC_NODE_NAME=prod-worker-1"}, podEnv...)

	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()

	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(out.String(), "0 failed") ||
		!strings.Contains(out.String(), "ghcrsync itself runs on it") {
		t.Fatalf("apply in the cluster: exit %d\n%s\n%s", code, out.String(), errb.String())
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

// Every rule of the shipped roles is needed: with any one removed, the command it serves fails
// before any write and names the permission.
func TestEveryRuleIsNeeded(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)

	roles := map[string][]runtime.Object{}
	for _, f := range []string{"read.yaml", "apply.yaml", "release.yaml"} {
		for _, o := range manifests(t, f) {
			switch o.(type) {
			case *rbacv1.ClusterRole, *rbacv1.Role:
				roles[f] = append(roles[f], o)
			}
		}
	}

	// Which command each manifest's rules serve, and the roles that command's identity holds.
	classes := []struct {
		file    string
		command []string
		with    []string // the other manifests whose roles it holds
	}{
		{"read.yaml", []string{"plan"}, nil},
		{"apply.yaml", []string{"apply", "--auto-approve"}, []string{"read.yaml"}},
		{"release.yaml", []string{"release"}, []string{"read.yaml"}},
	}

	n := 0

	for _, c := range classes {
		for ri, role := range roles[c.file] {
			for i, rule := range rulesOf(role) {
				n++
				id := fmt.Sprintf("minus-%d", n)
				name := fmt.Sprintf("%s/%s[%d] %s %s", c.file, nameOf(role), i, rule.Verbs[0], rule.Resources[0])

				t.Run(strings.NewReplacer("/", "_", " ", "_", "[", "_", "]", "").Replace(name), func(t *testing.T) {
					var held []runtime.Object
					for _, other := range c.with {
						held = append(held, roles[other]...)
					}

					for rj, r := range roles[c.file] {
						if rj == ri {
							r = withoutRule(r, i)
						}

						held = append(held, r)
					}

					who := bindCopies(t, sb, id, held)

					args := append(append([]string{}, c.command...), "--config", who.cfg)
					r := ghcrsync(t, sb, args...)

					want := rule.Verbs[0] + " " + rule.Resources[0]
					if g := rule.APIGroups[0]; g != "" {
						want += "." + g
					}

					if r.code != 1 || !strings.Contains(r.stderr, "cannot run as "+who.user) || !strings.Contains(r.stderr, "the cluster denies") ||
						!strings.Contains(r.stderr, want) {
						t.Fatalf("without %s: exit %d, want 1 naming %q\n%s", name, r.code, want, r.stderr)
					}

					if w := writes(t, sb, who.user); len(w) != 0 {
						t.Fatalf("without %s the command wrote: %v", name, w)
					}
				})
			}
		}
	}

	if n < 15 {
		t.Fatalf("only %d rules found in deploy/rbac", n)
	}
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

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
