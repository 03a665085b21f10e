package apply_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Another tool that writes a consumer pull secret's credential (its own field manager, by
// server-side apply, as a config-sync tool does) is named by plan as another owner, with what
// it means: it may put the old credential back. After apply writes the secret the field is
// ghcrsync's, and a plan names no other writer of it (the negative control, with team-a, which
// nobody else wrote, never named). Then the real event: the tool applies its content again —
// the old credential — and the next plan's verdict says the old credential is still used there.
func TestPlanNamesAnotherWriterOfAPullSecret(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	const ns, manager = "team-b", "config-sync"
	name := sandbox.ConsumerSecret
	where := ns + "/" + name

	// The tool's content: the credential being replaced.
	old := sandbox.DockerConfigJSON(sb.OldCredential())
	syncAgain := func() {
		t.Helper()

		ac := corev1ac.Secret(name, ns).WithType(corev1.SecretTypeDockerConfigJson).WithData(map[string][]byte{corev1.DockerConfigJsonKey: old})
		if _, err := kube.CoreV1().Secrets(ns).Apply(ctx, ac, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
			t.Fatal(err)
		}
	}

	// Leave the secret as it was found, for the tests after this one.
	before, err := kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	existed := err == nil

	t.Cleanup(func() {
		ctx := context.Background()
		_ = kube.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{})

		if existed {
			before.ResourceVersion, before.UID, before.ManagedFields = "", "", nil
			_, _ = kube.CoreV1().Secrets(ns).Create(ctx, before, metav1.CreateOptions{})
		}
	})

	syncAgain()

	writers := func(p *plan.Plan) (named []string) {
		for _, o := range p.Owners {
			if o.Owner == "field manager "+manager {
				named = append(named, o.Object)
			}
		}

		return named
	}

	r := newRotation(t, sb, nil, "prod-worker-1")
	path := r.plan()

	if got := writers(r.planned); !slices.Equal(got, []string{"Secret " + where + " (consumer)"}) {
		t.Fatalf("the plan names %s as a writer of %v, want of %s only; owners: %+v", manager, got, where, r.planned.Owners)
	}

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	for _, s := range res.Secrets {
		if s.Namespace+"/"+s.Secret == where && s.Outcome != secretwrite.Written {
			t.Fatalf("apply did not write %s: %+v", where, s)
		}
	}

	after, err := planCfg(ctx, r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if got := writers(after.Plan); len(got) != 0 {
		t.Fatalf("after apply's write the plan still names %s as a writer of %v", manager, got)
	}

	// The event the plan warned of.
	syncAgain()

	again, err := planCfg(ctx, r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	v := again.Plan.Verdict
	if v == nil || v.SafeToRevoke {
		t.Fatalf("the other writer put the old credential back, and the verdict says revoking is safe: %+v", v)
	}

	i := slices.IndexFunc(v.Uses, func(u plan.Use) bool { return u.Kind == plan.UseSecret && u.Name == where })
	if i < 0 || v.Uses[i].State != plan.UseOld {
		t.Fatalf("the verdict does not name %s as holding the old credential: %+v", where, v.Uses)
	}

	if got := writers(again.Plan); !slices.Contains(got, "Secret "+where+" (consumer)") {
		t.Fatalf("the plan no longer names %s after it wrote again: %v", manager, got)
	}
}
