package apply_test

import (
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/state"
)

// Parity H2: every private package the runtime needs must pull on the node, each with the
// node's own credential (runtime_probe.images; GHCR grants packages one by one). One package's
// access taken away mid-run (after the node's Talos write, before its proof) fails that node's
// proof naming that image alone, and the node keeps its fence. The control: a node whose
// credential is granted all three is proved and rotated.
func TestEveryProbeImageMustPullOnTheRuntime(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-2"

	images := `images    = ["ghcr.io/ghcrsync/private-probe:v1", "ghcr.io/ghcrsync/app:v1", "ghcr.io/` + registry.DistrolessImage + `"]`
	edit := func(s string) string {
		return strings.Replace(s, `image     = "ghcr.io/ghcrsync/private-probe:v1"`, images, 1)
	}

	r := newRotation(t, sb, edit, name)
	path := r.plan()

	if pr := r.planned.Probe; len(pr.Images) != 3 || pr.Image != pr.Images[0] {
		t.Fatalf("the plan's probe: %+v", pr)
	} else {
		for _, img := range pr.Images {
			if !strings.Contains(img, "@sha256:") {
				t.Fatalf("probe image %s is not pinned to the digest plan proved", img)
			}
		}
	}

	t.Cleanup(func() { sb.Registry().AllowRepository(r.cred.Username, "ghcrsync/app") })

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if phase == state.PhaseRebooting {
			sb.Registry().DenyRepository(r.cred.Username, "ghcrsync/app")
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	x := r.result(res, name)
	if x.Outcome != state.OutcomeFailed || !x.Fenced || !strings.Contains(x.Message, "cannot pull ghcr.io/ghcrsync/app@sha256:") ||
		strings.Contains(x.Message, "private-probe") || strings.Contains(x.Message, "distroless") {
		t.Fatalf("one of three packages denied to the runtime: %+v", x)
	}

	if res.SafeToRevoke() {
		t.Fatalf("a node whose runtime cannot pull one package, and the verdict is: %s", res.Verdict.Sentence())
	}

	if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
		t.Fatalf("release: %+v", rel.Outcomes)
	}

	// The control: another node, every package granted: all three pull, and it is rotated.
	c := newRotation(t, sb, edit, "prod-worker-3")

	res, err = c.apply(c.plan(), apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := c.result(res, "prod-worker-3"); x.Outcome != state.OutcomeDone {
		t.Fatalf("the control, every package granted: %+v", x)
	}
}
