package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/actions"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// The shipped workflows, copied as a newcomer copies them, run step by step against the
// sandbox: plan.yml plans the pull request's credential file (exit 2, changes), writes its
// output and the step summary, and hands the comment step the Markdown plan; apply.yml plans and
// applies the rotation (its recovery step skipped); recover.yml finds nothing held and exits 0.
func TestShippedWorkflowsRunAgainstTheSandbox(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: 2 * time.Second})

	// The repository: its ghcrsync.hcl on the base branch, the credential file under
	// clusters/prod/; the pull request's commit (on the remote) changes only that file.
	origin, ws := t.TempDir(), t.TempDir()
	cfg := sandboxtest.CopyConfig(t, sb, ws, func(s string) string {
		return strings.Replace(s, `"`+sb.Path(sandbox.SecretFile)+`"`, `"clusters/prod/ghcr-secret.enc.yaml"`, 1)
	})

	secret, err := os.ReadFile(sb.Path(sandbox.SecretFile))
	if err != nil {
		t.Fatal(err)
	}

	git := func(dir string, args ...string) string { return actions.Git(t, dir, args...) }

	git(origin, "init", "--bare", "-q")
	git(ws, "init", "-q")
	_ = os.MkdirAll(filepath.Join(ws, "clusters", "prod"), 0o700)
	_ = os.WriteFile(filepath.Join(ws, "clusters", "prod", "ghcr-secret.enc.yaml"), []byte("# the base branch's\n"), 0o600)
	_ = os.Rename(cfg, filepath.Join(ws, "ghcrsync.hcl"))
	git(ws, "add", "-A")
	git(ws, "commit", "-qm", "base")
	git(ws, "remote", "add", "origin", origin)
	git(ws, "push", "-q", "origin", "HEAD:main")
	git(ws, "checkout", "-qb", "pr")
	_ = os.WriteFile(filepath.Join(ws, "clusters", "prod", "ghcr-secret.enc.yaml"), secret, 0o600)
	git(ws, "commit", "-qam", "rotate the credential")
	prSHA := git(ws, "rev-parse", "HEAD")
	git(ws, "push", "-q", "origin", "HEAD:refs/pull/1/head")
	git(ws, "checkout", "-q", "main")

	// GitHub's releases, played by a gh stub over a folder: release.yml publishes into it (gh
	// release create), every other workflow's install step downloads from it (gh release
	// download) and checks what it got.
	tools, releases := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(tools, "gh"), []byte(strings.ReplaceAll(actions.GhStub, "STORE", releases)), 0o700); err != nil {
		t.Fatal(err)
	}

	kubeconfig, _ := os.ReadFile(sb.Path(sandbox.KubeconfigFile))
	talosconfig, _ := os.ReadFile(sb.Path(sandbox.TalosconfigFile))
	age, _ := os.ReadFile(sb.Path(sandbox.AgeKeyFile))

	// The runner's own environment: a home of its own (where the install step puts ghcrsync),
	// this machine's Go caches (a release builds with them warm), one platform for make release.
	home := t.TempDir()
	baseEnv := append(os.Environ(), "HOME="+home, "PLATFORMS=linux/"+runtime.GOARCH)

	for _, v := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		out, _ := exec.Command(goTool(t), "env", v).Output()
		baseEnv = append(baseEnv, v+"="+strings.TrimSpace(string(out)))
	}

	if os.Getenv("XDG_CACHE_HOME") == "" {
		baseEnv = append(baseEnv, "XDG_CACHE_HOME="+filepath.Join(os.Getenv("HOME"), ".cache"))
	}

	var pin string // the release archive's digest, as the repository's copies of the workflows pin it

	newRunnerIn := func(workspace string, inputs map[string]string) *actions.Runner {
		r := actions.New(t, workspace, tools+":"+os.Getenv("PATH"), baseEnv, actions.Contexts(string(kubeconfig), string(talosconfig), string(age), prSHA))
		for k, v := range inputs {
			r.Values["inputs."+k] = v
		}

		r.Pinned = map[string]string{"GHCRSYNC_SHA256": pin}

		return r
	}
	newRunner := func(inputs map[string]string) *actions.Runner { return newRunnerIn(ws, inputs) }

	// release.yml, on a clone of this repository at its commit, with the tag the other workflows
	// pin: make release's archive, SBOM, provenance and SHA256SUMS published as the release.
	src := t.TempDir()
	git(".", "clone", "-q", "../..", src)

	// The fork's release workflow: its attest step records what GitHub would have attested.
	rel := newRunnerIn(src, nil)
	rel.Values["github.repository"], rel.Attestations = "acme/ghcrsync", filepath.Join(releases, "attested")
	if trace := rel.Run("../../docs/workflows/release.yml"); rel.Failed || !slices.Contains(trace, "Image: skipped") {
		t.Fatalf("release.yml: %v", trace)
	}

	published, _ := filepath.Glob(filepath.Join(releases, "v0.3.0", "*"))
	for _, want := range []string{"SHA256SUMS", "ghcrsync_v0.3.0.cdx.json", "ghcrsync_v0.3.0.intoto.jsonl", "ghcrsync_v0.3.0_linux_" + runtime.GOARCH + ".tar.gz",
		"ghcrsync_v0.3.0_image.oci.tar"} {
		if !slices.Contains(published, filepath.Join(releases, "v0.3.0", want)) {
			t.Fatalf("release.yml published %v, not %s", published, want)
		}
	}

	archive := "ghcrsync_v0.3.0_linux_" + runtime.GOARCH + ".tar.gz"
	pin = actions.PublishedDigest(t, filepath.Join(releases, "v0.3.0", "SHA256SUMS"), archive)

	// The merge queue's required check: validate.yml on the pull request's files passes; on a
	// configuration with an error it fails, annotating the error on its line.
	git(ws, "checkout", "-q", prSHA)

	// The install step checks the pinned digest on every run. A cache entry holding another
	// binary (any workflow of the repository may write one) fails the job at that step, before
	// the binary runs; an unset pin fails it too. The control: the real archive, restored from
	// the cache, passes.
	ran := filepath.Join(t.TempDir(), "the-cached-binary-ran")
	genuine, _ := os.ReadFile(filepath.Join(releases, "v0.3.0", archive))

	for _, c := range []struct {
		name, pin string
		seed      []byte
		fails     string
	}{
		{"another binary in the cache", pin, actions.TarGz(t, "ghcrsync", "#!/bin/sh\ntouch "+ran+"\n"), "FAILED"},
		{"no pin", "", genuine, "GHCRSYNC_SHA256 is not set"},
		{"the pinned archive in the cache", pin, genuine, ""},
	} {
		r := newRunner(nil)
		r.Env = append(slices.Clone(baseEnv), "HOME="+t.TempDir())
		r.CacheSeed, r.Pinned = map[string][]byte{archive: c.seed}, map[string]string{"GHCRSYNC_SHA256": c.pin}

		trace := r.Run("../../docs/workflows/validate.yml")

		switch {
		case !slices.Contains(trace, "Download ghcrsync: skipped"):
			t.Fatalf("%s: the cache hit downloaded anyway: %v", c.name, trace)
		case c.fails == "" && (r.Failed || !slices.Contains(trace, "Valid: exit 0")):
			t.Fatalf("%s: validate.yml failed: %v\n%s", c.name, trace, r.Log.String())
		case c.fails != "" && (!r.Failed || !slices.Contains(trace, "Install ghcrsync: exit 1") || !strings.Contains(r.Log.String(), c.fails) ||
			slices.Contains(trace, "ghcrsync on PATH: exit 0")):
			t.Fatalf("%s: the job did not fail at its install step: %v\n%s", c.name, trace, r.Log.String())
		}
	}

	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatalf("the binary from the cache ran (%v)", err)
	}

	check := newRunner(nil)
	if trace := check.Run("../../docs/workflows/validate.yml"); check.Failed || !slices.Contains(trace, "Valid: exit 0") ||
		!slices.Contains(trace, "Formatted: exit 0") {
		t.Fatalf("validate.yml: %v\n%s", trace, check.Log.String())
	}

	good, _ := os.ReadFile(filepath.Join(ws, "ghcrsync.hcl"))
	_ = os.WriteFile(filepath.Join(ws, "ghcrsync.hcl"), append(slices.Clone(good), "\nnodes {\n  drain_timout = \"1m\"\n}\n"...), 0o600)

	broken := newRunner(nil)
	if trace := broken.Run("../../docs/workflows/validate.yml"); !broken.Failed || !strings.Contains(broken.Log.String(), "::error file=ghcrsync.hcl,line=") {
		t.Fatalf("validate.yml on a broken configuration: %v\n%s", trace, broken.Log.String())
	}

	_ = os.WriteFile(filepath.Join(ws, "ghcrsync.hcl"), good, 0o600)
	git(ws, "checkout", "-q", "main")

	// The pull request already has: the bot's plan comment for this cluster (to update), its
	// comment for another cluster of a matrix, and someone else's comment forged with this
	// cluster's marker (neither to touch).
	ks, err := sb.Kube().CoreV1().Namespaces().Get(t.Context(), "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	uid := string(ks.UID)
	comment := func(id int, login, typ, body string) actions.PRComment {
		c := actions.PRComment{ID: id, Body: body}
		c.User.Login, c.User.Type = login, typ

		return c
	}

	plan := newRunner(nil)
	plan.Existing = []actions.PRComment{
		comment(11, "mallory", "User", view.MarkdownMarker+" cluster="+uid+" -->\nforged"),
		comment(12, "github-actions[bot]", "Bot", view.MarkdownMarker+" cluster=another-cluster -->\nthe other cluster's plan"),
		comment(13, "github-actions[bot]", "Bot", view.MarkdownMarker+" cluster="+uid+" -->\nthe previous plan"),
	}
	trace := plan.Run("../../docs/workflows/plan.yml")

	if plan.Failed || plan.Outputs["plan"]["exitcode"] != "2" || len(plan.Comments) != 1 || !strings.HasPrefix(plan.Comments[0], view.MarkdownMarker+" cluster="+uid+" -->\n") {
		t.Fatalf("plan.yml: %v, outputs %v, %d comment(s)", trace, plan.Outputs, len(plan.Comments))
	}

	if len(plan.Edits) != 1 || plan.Edits[0].Op != "update" || plan.Edits[0].ID != 13 {
		t.Fatalf("plan.yml's comment step edited %+v, want only an update of its own comment for this cluster (13)", plan.Edits)
	}

	// The control: with none of its own, it creates one, and still leaves the others alone.
	fresh := newRunner(nil)
	fresh.Existing = plan.Existing[:2]

	if fresh.Run("../../docs/workflows/plan.yml"); len(fresh.Edits) != 1 || fresh.Edits[0].Op != "create" {
		t.Fatalf("plan.yml's comment step with no comment of its own: %+v", fresh.Edits)
	}

	// A plan that fails (an identity that cannot reach the cluster) replaces this job's last
	// plan with a failure note: a green plan must not outlive the failure.
	failing := newRunner(nil)
	failing.Values["secrets.PLAN_KUBECONFIG"] = "not a kubeconfig"
	failing.Existing = []actions.PRComment{comment(12, "github-actions[bot]", "Bot", view.MarkdownMarker+" cluster=another-cluster -->\nthe other cluster's plan"),
		comment(14, "github-actions[bot]", "Bot", plan.Edits[0].Body)}

	if trace := failing.Run("../../docs/workflows/plan.yml"); !failing.Failed || len(failing.Edits) != 1 || failing.Edits[0].ID != 14 ||
		!strings.Contains(failing.Edits[0].Body, "### ghcrsync plan: failed") {
		t.Fatalf("plan.yml with a failing plan: %v, edits %+v", trace, failing.Edits)
	}

	if s, _ := os.ReadFile(plan.Summary); !strings.Contains(string(s), "### ghcrsync plan: ") {
		t.Fatalf("plan.yml's step summary:\n%s", s)
	}

	// The deploy job runs on the merged commit (a fast-forward of main to the pull request's; the
	// plan job's depth-1 fetch left the clone shallow, so it is checked out, not merged).
	git(ws, "reset", "-q", "--hard", prSHA)

	apply := newRunner(nil)
	if trace := apply.Run("../../docs/workflows/apply.yml"); apply.Failed || !strings.Contains(strings.Join(trace, "\n"), "Recover: skipped") {
		t.Fatalf("apply.yml: %v", trace)
	}

	if s, _ := os.ReadFile(apply.Summary); !strings.Contains(string(s), "ghcrsync apply") {
		t.Fatalf("apply.yml's step summary:\n%s", s)
	}

	if apply.Outputs["apply"]["outcome"] != "done" || apply.Outputs["apply"]["safe_to_revoke"] != "true" {
		t.Fatalf("apply.yml's Apply step outputs: %v", apply.Outputs["apply"])
	}

	// The continuation lane with nothing left: it plans (exit 0) and stops — no apply, nothing
	// written, no recovery.
	idle := newRunner(nil)
	if trace := idle.Run("../../docs/workflows/continue.yml"); idle.Failed || idle.Outputs["plan"]["exitcode"] != "0" ||
		!slices.Contains(trace, "Apply: skipped") || !slices.Contains(trace, "Outcome: skipped") || !slices.Contains(trace, "Recover: skipped") {
		t.Fatalf("continue.yml with nothing to do: %v, outputs %v", trace, idle.Outputs)
	}

	// With something left (a consumer pull secret lost since), it applies and passes.
	if err := sb.Kube().CoreV1().Secrets(sandbox.ConsumerNamespaces[1]).Delete(t.Context(), sandbox.ConsumerSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	work := newRunner(nil)
	if trace := work.Run("../../docs/workflows/continue.yml"); work.Failed || work.Outputs["plan"]["exitcode"] != "2" ||
		work.Outputs["apply"]["outcome"] != "done" || !slices.Contains(trace, "Outcome: exit 0") || !slices.Contains(trace, "Recover: skipped") {
		t.Fatalf("continue.yml with a pull secret to write: %v, outputs %v", trace, work.Outputs)
	}

	recover := newRunner(map[string]string{"holder": ""})
	if trace := recover.Run("../../docs/workflows/recover.yml"); recover.Failed {
		t.Fatalf("recover.yml: %v", trace)
	}
}

func goTool(t *testing.T) string {
	t.Helper()

	p, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go")
	}

	return p
}
