package permission

import (
	"bytes"
	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
)

// fixture is a configuration with every kind of target: the Kubernetes state, a consumer
// selector and an explicit consumer, the root with its OCIRepository, a node template with a
// rollout restart.
func fixture() (*config.Config, []cluster.SecretTarget) {
	cfg := &config.Config{
		Lease:            config.Lease{Namespace: "flux-system", Name: "ghcr-auth-refresh"},
		State:            config.State{Backend: "kubernetes", Namespace: "flux-system", Secret: "ghcrsync-state"},
		ConsumerSelector: &config.ConsumerSelector{Selector: "ghcrsync.dev/pull-secret=ghcr", Secret: "ghcr-pull", ServiceAccounts: []string{"default"}},
		FluxRoot:         &config.FluxRoot{Namespace: "flux-system", Secret: "ghcr-auth", OCIRepository: "flux-system"},
		NodeTemplates: []config.NodeTemplate{{Name: "hcloud", Namespace: "kube-system", Secret: "hcloud-cluster-config", Key: "HCLOUD_CLUSTER_CONFIG",
			RestartDeployment: "kube-system/cluster-autoscaler"}},
	}
	cfg.Credential.Name = "ghcr"
	cfg.Nodes.Probe = config.Probe{Image: "ghcr.io/org/private-probe@sha256:0123", Images: []string{"ghcr.io/org/private-probe@sha256:0123"}, Namespace: config.DefaultProbeNamespace, ServiceAccount: config.DefaultProbeServiceAccount}

	targets := []cluster.SecretTarget{
		{Namespace: "billing", Name: "registry", Role: "consumer", ServiceAccounts: []string{"builder"}},
		{Namespace: "team-a", Name: "ghcr-pull", Role: "consumer", ServiceAccounts: []string{"default"}},
		{Namespace: "team-b", Name: "ghcr-pull", Role: "consumer", Credential: "tenant-b"},
		{Namespace: "flux-system", Name: "ghcr-auth", Role: "root"},
	}

	return cfg, targets
}

// The rendering is exactly the needs: every need is granted by some rule, and every permission
// a rule grants is a need (a rule on any object only where the need names none).
func TestRenderGrantsExactlyTheNeeds(t *testing.T) {
	cfg, targets := fixture()

	for _, id := range Identities(cfg, targets) {
		t.Run(id.Class, func(t *testing.T) {
			var granted []cluster.Access

			for _, o := range Render(DefaultNamespace, []Identity{id}, ShapesOf(cfg, targets)) {
				var (
					ns    string
					rules []rbacv1.PolicyRule
				)

				switch r := o.(type) {
				case *rbacv1.ClusterRole:
					rules = r.Rules
				case *rbacv1.Role:
					ns, rules = r.Namespace, r.Rules
				default:
					continue
				}

				for _, rule := range rules {
					names := rule.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}

					for _, v := range rule.Verbs {
						for _, n := range names {
							granted = append(granted, cluster.Access{Verb: v, Group: rule.APIGroups[0], Resource: rule.Resources[0], Namespace: ns, Name: n})
						}
					}
				}
			}

			for _, need := range id.Needs {
				if !slices.Contains(granted, need) {
					t.Errorf("need %s is not granted", need)
				}
			}

			for _, g := range granted {
				if !slices.Contains(id.Needs, g) {
					t.Errorf("%s is granted but not needed", g)
				}
			}
		})
	}
}

// No identity may create Secrets cluster-wide or in a namespace it writes no Secret to, or
// update a service account it does not reference the pull secret from.
func TestNoClusterWideSecretWrites(t *testing.T) {
	cfg, targets := fixture()

	for _, id := range Identities(cfg, targets) {
		for _, a := range id.Needs {
			if a.Resource == "secrets" && a.Namespace == "" {
				t.Errorf("%s: %s", id.Class, a)
			}

			if a.Resource == "serviceaccounts" && (a.Verb == "update" || a.Verb == "patch") && (a.Name == "" || a.Namespace == "") {
				t.Errorf("%s: %s", id.Class, a)
			}
		}
	}

	// The plan identity's write rights are its dry runs (PlanDryRunPolicy refuses a real
	// write): the probe pod's, and the fan-out's writes, which apply (or, for a node template,
	// the template identity) may make too — none more.
	ids := Identities(cfg, targets)
	for _, a := range ids[0].Needs {
		probe := a == cluster.Access{Verb: "create", Resource: "pods", Namespace: config.DefaultProbeNamespace}
		fanout := a.Resource == "secrets" && (slices.Contains(ids[1].Needs, a) || slices.Contains(ids[3].Needs, a))

		if a.Verb != "get" && a.Verb != "list" && !probe && !fanout {
			t.Errorf("the plan identity may %s", a)
		}
	}
}

// No one identity both writes a node template and patches a Node or evicts a pod: the template
// identity writes the templates (and restarts their readers), nothing else; apply writes none.
func TestTemplateWriterIsItsOwnIdentity(t *testing.T) {
	cfg, targets := fixture()
	if len(cfg.NodeTemplates) == 0 {
		t.Fatal("the fixture configures no node template")
	}

	template := func(a cluster.Access) bool {
		return slices.ContainsFunc(cfg.NodeTemplates, func(nt config.NodeTemplate) bool {
			return a.Resource == "secrets" && a.Namespace == nt.Namespace && a.Name == nt.Secret
		})
	}

	var writers []string

	for _, id := range Identities(cfg, targets) {
		writesTemplate, disrupts := false, false

		for _, a := range id.Needs {
			writesTemplate = writesTemplate || template(a) && a.Verb == "update" && id.Class != CommandPlan
			disrupts = disrupts || a.Resource == "nodes" && a.Verb == "patch" || a.Resource == "pods/eviction"
		}

		if writesTemplate {
			writers = append(writers, id.Class)
		}

		if writesTemplate && disrupts {
			t.Errorf("the %s identity both writes a node template and patches nodes or evicts pods", id.Class)
		}

		if id.Class == CommandTemplate {
			for _, a := range id.Needs {
				if !template(a) && a.Resource != "deployments" && (a != cluster.Access{Verb: "get", Resource: "namespaces", Name: "kube-system"}) {
					t.Errorf("the template identity may %s", a)
				}
			}
		}
	}

	if !slices.Equal(writers, []string{CommandTemplate}) {
		t.Errorf("node templates are written by %v, want the template identity alone", writers)
	}

	cfg.NodeTemplates = nil
	for _, id := range Identities(cfg, targets) {
		if id.Class == CommandTemplate {
			t.Error("a template identity is rendered for a configuration without node templates")
		}
	}
}

// The rendering of the fixture, as `ghcrsync rbac` prints it (go test ./internal/permission
// -update rewrites it).
func TestRenderGolden(t *testing.T) {
	cfg, targets := fixture()

	var b bytes.Buffer

	for _, o := range Render(DefaultNamespace, Identities(cfg, targets), ShapesOf(cfg, targets)) {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}

		b.WriteString("---\n" + strings.ReplaceAll(string(y), "  creationTimestamp: null\n", ""))
	}

	golden(t, "rendered.yaml", b.Bytes())

	if n := len(Render(DefaultNamespace, Identities(cfg, targets), ShapesOf(cfg, targets))); n < 20 {
		t.Fatalf("only %d objects", n)
	}
}

// deploy/rbac/admission-policy.yaml is the policy Render includes, for the default namespace.
func TestShippedAdmissionPolicy(t *testing.T) {
	var b bytes.Buffer

	b.WriteString(admissionHeader)

	for _, o := range StaticPolicies(DefaultNamespace) {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}

		b.WriteString("---\n" + strings.ReplaceAll(string(y), "  creationTimestamp: null\n", ""))
	}

	path := filepath.Join("..", "..", "deploy", "rbac", "admission-policy.yaml")
	if goldenfile.Updating() {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("%s is not StaticPolicies' rendering (%v): run go test ./internal/permission -update", path, err)
	}
}

const admissionHeader = `# The admission policies ` + "`ghcrsync rbac`" + ` renders before the roles that do not depend on a
# configuration (for the default namespace, ghcrsync-system). Whatever RBAC grants them,
# ghcrsync's service accounts may write only the fields ghcrsync writes: pull secrets and opaque
# Secrets with no service-account annotation (no create right becomes a token); a Node's cordon,
# steering taint and ghcrsync.dev/* annotations; a ServiceAccount's imagePullSecrets; a
# Deployment's rollout-restart annotation; a Kustomization's spec.suspend; an OCIRepository's
# reconcile request; Events of ghcrsync's own shape. ` + "`ghcrsync rbac`" + ` also renders, from the
# configuration, the Secrets policy narrowed to the Secrets it names (each pull secret pinned to
# its credential, each node template to its key), the run Lease's, the probe pod's (its exact
# shape) and the plan identity's (dry runs only). Needs Kubernetes 1.30+ (docs/rbac.md).
`

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, filepath.Join("testdata", name), got)
}

// Each bound an identity's rights reach has its canary: the escapes the containment preflight
// tries, by command. A contested pull secret (written by none) is not tried.
func TestEscapesCoverEachBound(t *testing.T) {
	cfg, targets := fixture()
	targets[0].Contested = []string{"", "tenant-b"}

	for _, tc := range []struct {
		command string
		want    []cluster.EscapeKind
		not     []cluster.EscapeKind
	}{
		{CommandApply, []cluster.EscapeKind{cluster.EscapeNodeLabel, cluster.EscapeNoExecuteTaint, cluster.EscapeForgedEvent, cluster.EscapeSecretAnnotate,
			cluster.EscapeForeignLease, cluster.EscapeTokenSecret, cluster.EscapeOpaqueSecret, cluster.EscapeSecretKey, cluster.EscapeCredentialMark,
			cluster.EscapeOCIRepository, cluster.EscapePod}, []cluster.EscapeKind{cluster.EscapeTemplateKey, cluster.EscapeDeploymentSA}},
		{CommandTemplate, []cluster.EscapeKind{cluster.EscapeTemplateKey, cluster.EscapeDeploymentSA},
			[]cluster.EscapeKind{cluster.EscapeNodeLabel, cluster.EscapeNoExecuteTaint, cluster.EscapeForeignLease, cluster.EscapeSecretKey}},
		{CommandRelease, []cluster.EscapeKind{cluster.EscapeNodeLabel, cluster.EscapeNoExecuteTaint, cluster.EscapeForgedEvent, cluster.EscapeSecretAnnotate},
			[]cluster.EscapeKind{cluster.EscapeForeignLease, cluster.EscapeOpaqueSecret, cluster.EscapeTemplateKey, cluster.EscapePod}},
		{CommandPlan, nil, []cluster.EscapeKind{cluster.EscapeNodeLabel}},
	} {
		t.Run(tc.command, func(t *testing.T) {
			got := map[cluster.EscapeKind][]string{}
			for _, e := range Escapes(cfg, tc.command, targets) {
				got[e.Kind] = append(got[e.Kind], e.Namespace+"/"+e.Name)
			}

			for _, k := range tc.want {
				if _, ok := got[k]; !ok {
					t.Errorf("no canary %q", k)
				}
			}

			for _, k := range tc.not {
				if _, ok := got[k]; ok {
					t.Errorf("canary %q for a right %s does not hold", k, tc.command)
				}
			}

			for _, where := range got[cluster.EscapeSecretKey] {
				if where == targets[0].Namespace+"/"+targets[0].Name {
					t.Errorf("the contested %s is tried", where)
				}
			}

			if tc.command == CommandApply && !slices.Equal(got[cluster.EscapeSecretKey], []string{"team-a/ghcr-pull", "flux-system/ghcr-auth"}) {
				t.Errorf("pull secret key canaries on %v, want the first consumer and the root", got[cluster.EscapeSecretKey])
			}
		})
	}
}
