package view_test

import (
	"bytes"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// `ghcrsync rbac`'s output, through the output guard as printed, holds the very policies
// rendered: every CEL expression read back is the one rendered (a long expression folded by YAML
// at a space before ":" once came out with "\x3a" and did not compile). The control: a policy
// whose expression would fold so is refused, not printed altered.
func TestRBACOutputIsWhatWasRendered(t *testing.T) {
	cfg := &config.Config{
		Credential:       config.Credential{Name: "ghcr", Registry: "ghcr.io"},
		Lease:            config.Lease{Namespace: "flux-system", Name: "ghcr-auth-refresh"},
		State:            config.State{Backend: "kubernetes", Namespace: "flux-system", Secret: "ghcrsync-state"},
		ConsumerSelector: &config.ConsumerSelector{Selector: "ghcrsync.dev/pull-secret=ghcr", Secret: "ghcr-pull"},
		FluxRoot:         &config.FluxRoot{Namespace: "flux-system", Secret: "ghcr-auth"},
		NodeTemplates:    []config.NodeTemplate{{Name: "hcloud", Namespace: "kube-system", Secret: "hcloud-cluster-config", Key: "HCLOUD_CLUSTER_CONFIG"}},
	}
	targets := []cluster.SecretTarget{{Namespace: "team-a", Name: "ghcr-pull"}, {Namespace: "team-b", Name: "ghcr-pull", Credential: "tenant-b"},
		{Namespace: "flux-system", Name: "ghcr-auth", Role: "root"}}

	objs, _, err := permission.ForConfiguration(cfg, permission.DefaultNamespace, targets, nil, true)
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := view.RBAC(view.Guard(&out), "ghcrsync.hcl", nil, objs); err != nil {
		t.Fatal(err)
	}

	rendered := expressions(objs)
	if len(rendered) < 20 {
		t.Fatalf("only %d expressions rendered", len(rendered))
	}

	var back []runtime.Object

	for _, doc := range strings.Split(out.String(), "\n---\n")[1:] {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := yaml.Unmarshal([]byte(doc), &p); err == nil && p.Kind == "ValidatingAdmissionPolicy" {
			back = append(back, &p)
		}
	}

	got := expressions(back)
	if len(got) != len(rendered) {
		t.Fatalf("%d expressions printed, %d rendered", len(got), len(rendered))
	}

	for i := range got {
		if got[i] != rendered[i] {
			t.Fatalf("printed expression %d differs from the rendered one:\n%s\n%s", i, got[i], rendered[i])
		}
	}

	// The control: an expression YAML folds right before a ":" (some length of prefix does) is
	// refused, not printed altered.
	folded := 0

	for n := 20; n < 120; n++ {
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			Validations: []admissionregistrationv1.Validation{{Expression: strings.Repeat("x", n) + " ? y : z && " + strings.Repeat("w ", 40)}}}}

		b, _ := yaml.Marshal(p)
		if !strings.Contains(string(b), "\n      : ") && !strings.Contains(string(b), "\n    : ") && !strings.Contains(string(b), "\n  : ") {
			continue
		}

		folded++

		if err := view.RBAC(view.Guard(&bytes.Buffer{}), "ghcrsync.hcl", nil, []runtime.Object{p}); err == nil {
			t.Fatalf("a rendering the guard would alter was printed:\n%s", b)
		}
	}

	if folded == 0 {
		t.Fatal("control: no expression folded before its colon; the check is not exercised")
	}
}

func expressions(objs []runtime.Object) []string {
	var out []string

	for _, o := range objs {
		if p, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok {
			for _, v := range p.Spec.Validations {
				out = append(out, v.Expression)
			}

			for _, m := range p.Spec.MatchConditions {
				out = append(out, m.Expression)
			}
		}
	}

	return out
}
