package quickstart

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/actions"
)

// pullRequest is a row of docs/ci.md's adoption table: what the pull request adds or changes,
// the workflows that run on it, and those that run on main after its merge (by name:
// "validate" for validate.yml).
type pullRequest struct {
	name       string
	files      []string
	runs, then []string
}

// adoptionTable reads docs/ci.md's adoption table.
func adoptionTable(t *testing.T, ci string) []pullRequest {
	t.Helper()

	_, table, ok := strings.Cut(ci, "| Pull request | Adds or changes | Runs on it | Then, on main |\n")
	if !ok {
		t.Fatal("docs/ci.md has no adoption table (| Pull request | Adds or changes | Runs on it | Then, on main |)")
	}

	names := func(cell string) []string {
		if cell = strings.TrimSpace(cell); cell == "—" {
			return nil
		}

		var out []string
		for _, n := range strings.Split(cell, ",") {
			out = append(out, strings.TrimSpace(n))
		}

		return out
	}

	var prs []pullRequest

	for _, line := range strings.Split(table, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}

		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			t.Fatalf("docs/ci.md: an adoption row this test cannot read: %q", line)
		}

		pr := pullRequest{name: strings.TrimSpace(cells[0]), runs: names(cells[2]), then: names(cells[3])}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			pr.files = append(pr.files, m[1])
		}

		prs = append(prs, pr)
	}

	if len(prs) == 0 {
		t.Fatal("docs/ci.md's adoption table has no rows")
	}

	return prs
}

// fleetRepo is the reader's repository on GitHub, played: a bare origin with the pull
// requests' heads (refs/pull/N/head), and the maintainer's clone that makes and merges them.
type fleetRepo struct {
	t            *testing.T
	origin, work string
}

func (f *fleetRepo) git(dir string, args ...string) string {
	f.t.Helper()

	c := exec.Command("git", append([]string{"-c", "user.name=maintainer", "-c", "user.email=m@example.com", "-c", "init.defaultBranch=main",
		"-c", "advice.detachedHead=false"}, args...)...)
	c.Dir = dir

	out, err := c.CombinedOutput()
	if err != nil {
		f.t.Fatalf("git %v: %v\n%s", args, err, out)
	}

	return strings.TrimSpace(string(out))
}

// checkout is a fresh clone of origin at rev, as a job's checkout leaves its workspace.
func (f *fleetRepo) checkout(rev string) string {
	f.t.Helper()

	dir := f.t.TempDir()
	f.git(dir, "clone", "-q", f.origin, ".")
	f.git(dir, "checkout", "-q", rev)

	return dir
}

// playAdoption hands the quickstart's cluster to the pipeline as docs/ci.md's adoption table
// says: each pull request made from the reader's files (the workflows copied from
// docs/workflows), the workflows GitHub's rules start on it and after its merge compared with
// the table, and each played against the sandbox with the quickstart's identities, talosconfig
// and build (published as the fork's release). A row that changes the SOPS file again is a
// rotation: the quickstart's step 2 is run again with a new token first.
func playAdoption(t *testing.T, sb *sandbox.Sandbox, r *reader, step2 func(user string) string, identity []byte) {
	t.Helper()

	f := &fleetRepo{t: t, origin: t.TempDir(), work: t.TempDir()}
	f.git(f.origin, "init", "-q", "--bare")
	f.git(f.work, "init", "-q")
	_ = os.WriteFile(filepath.Join(f.work, "README.md"), []byte("# fleet\n"), 0o600)
	f.git(f.work, "add", "-A")
	f.git(f.work, "commit", "-qm", "the fleet")
	f.git(f.work, "remote", "add", "origin", f.origin)
	f.git(f.work, "push", "-q", "origin", "HEAD:main")

	gh, pin := publishRelease(t, filepath.Join(r.dir, "ghcrsync-src", "bin", "ghcrsync"))
	secret := func(name string) string {
		b, err := os.ReadFile(filepath.Join(r.dir, name))
		if err != nil {
			t.Fatalf("the quickstart made no %s: %v", name, err)
		}

		return string(b)
	}

	play := func(workflow, workspace, prSHA string) *actions.Runner {
		values := actions.Contexts(secret("apply.kubeconfig"), secret("ci.talosconfig"), string(identity), prSHA)
		for k, file := range map[string]string{"PLAN": "plan.kubeconfig", "RELEASE": "release.kubeconfig", "TEMPLATE": "template.kubeconfig"} {
			values["secrets."+k+"_KUBECONFIG"] = secret(file)
		}

		run := actions.New(t, workspace, gh+":"+os.Getenv("PATH"), runnerEnv(t), values)
		run.Pinned = map[string]string{"GHCRSYNC_SHA256": pin}
		trace := run.Run(filepath.Join(workspace, ".github", "workflows", workflow))

		if run.Failed {
			t.Fatalf("%s failed: %v\n%s", workflow, trace, run.Log.String())
		}

		return run
	}

	for i, pr := range adoptionTable(t, readRepo(t, "docs/ci.md")) {
		n := strings.TrimSpace(strings.SplitN(pr.name, ".", 2)[0])
		f.git(f.work, "checkout", "-q", "-b", "pr-"+n, "main")

		if i > 0 && slices.Contains(pr.files, "clusters/prod/ghcr-secret.enc.yaml") {
			rotateAgain(t, sb, r, step2)
		}

		for _, file := range pr.files {
			from, to := filepath.Join(r.dir, file), filepath.Join(f.work, file)
			if strings.HasSuffix(file, ".yml") {
				from, to = filepath.Join("..", "..", "docs", "workflows", file), filepath.Join(f.work, ".github", "workflows", file)
			}

			copyFile(t, from, to)
		}

		f.git(f.work, "add", "-A")
		f.git(f.work, "commit", "-qm", pr.name)
		prSHA := f.git(f.work, "rev-parse", "HEAD")
		f.git(f.work, "push", "-q", "origin", "HEAD:refs/pull/"+n+"/head")
		changed := strings.Split(f.git(f.work, "diff", "--name-only", "main", "HEAD"), "\n")

		// On the pull request: its own pull_request workflows, the base's pull_request_target ones.
		head, base := f.checkout(prSHA), f.checkout("main")
		own := triggered(t, head, actions.Event{Name: "pull_request", Branch: "main", Changed: changed})
		target := triggered(t, base, actions.Event{Name: "pull_request_target", Branch: "main", Changed: changed})

		if got := names(own, target); !slices.Equal(got, pr.runs) {
			t.Fatalf("%s (%v): GitHub runs %v on it, docs/ci.md's table says %v", pr.name, changed, got, pr.runs)
		}

		for _, w := range own {
			play(w, f.checkout(prSHA), prSHA)
		}

		for _, w := range target {
			if run := play(w, f.checkout("main"), prSHA); w == "plan.yml" && (len(run.Comments) != 1 || strings.Contains(run.Comments[0], "plan: failed")) {
				t.Fatalf("%s: plan.yml's comment: %q", pr.name, run.Comments)
			}
		}

		// The merge, then what runs on main: the push's workflows, then the next scheduled run.
		f.git(f.work, "checkout", "-q", "main")
		f.git(f.work, "merge", "-q", "--ff-only", "pr-"+n)
		f.git(f.work, "push", "-q", "origin", "main")

		pushed := triggered(t, f.checkout("main"), actions.Event{Name: "push", Branch: "main", Changed: changed})
		scheduled := triggered(t, f.checkout("main"), actions.Event{Name: "schedule", Branch: "main"})

		if got := names(pushed, scheduled); !slices.Equal(got, pr.then) {
			t.Fatalf("%s: after its merge GitHub runs %v on main, docs/ci.md's table says %v", pr.name, got, pr.then)
		}

		for _, w := range append(pushed, scheduled...) {
			run := play(w, f.checkout("main"), prSHA)

			switch {
			case w == "apply.yml" && (run.Outputs["apply"]["outcome"] != "done" || run.Outputs["apply"]["safe_to_revoke"] != "true"):
				t.Fatalf("%s: apply.yml's outputs %v, want done and safe to revoke", pr.name, run.Outputs["apply"])
			case w == "continue.yml" && run.Outputs["plan"]["exitcode"] != "0":
				t.Fatalf("%s: the continuation's plan exited %s, want 0 (nothing left)", pr.name, run.Outputs["plan"]["exitcode"])
			}
		}

		t.Logf("%s: ran %v on it, %v on main", pr.name, pr.runs, pr.then)
	}
}

// rotateAgain is the next rotation as the quickstart says to make it: a new token the
// registry accepts, and step 2 run again with it.
func rotateAgain(t *testing.T, sb *sandbox.Sandbox, r *reader, step2 func(user string) string) {
	t.Helper()

	cred, err := sb.RotateSecret("pipeline")
	if err != nil {
		t.Fatal(err)
	}

	r.stdin, r.secrets = cred.Password+"\n", append(r.secrets, cred.Password)
	r.run(t.Context(), step2(cred.Username))

	if r.exitCode != 0 {
		t.Fatalf("step 2 again, for the next rotation: exit %d\n%s", r.exitCode, r.output)
	}
}

// triggered lists the workflows of the checkout the event starts.
func triggered(t *testing.T, checkout string, ev actions.Event) []string {
	t.Helper()

	w, err := actions.Triggered(filepath.Join(checkout, ".github", "workflows"), ev)
	if err != nil {
		t.Fatal(err)
	}

	return w
}

// names are the workflows' names without .yml, in order.
func names(lists ...[]string) []string {
	var out []string

	for _, l := range lists {
		for _, w := range l {
			out = append(out, strings.TrimSuffix(w, ".yml"))
		}
	}

	return out
}

// publishRelease publishes the binary the quickstart built as the fork's v0.3.0 release (its
// archive and SHA256SUMS), behind a stand-in for gh; it returns the stand-in's directory and
// the archive's digest, which the reader pins in each workflow.
func publishRelease(t *testing.T, binary string) (ghDir, pin string) {
	t.Helper()

	b, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}

	store, ghDir := t.TempDir(), t.TempDir()
	archive := "ghcrsync_v0.3.0_linux_" + runtime.GOARCH + ".tar.gz"
	content := actions.TarGz(t, "ghcrsync", string(b))
	sum := sha256.Sum256(content)
	pin = hex.EncodeToString(sum[:])

	_ = os.MkdirAll(filepath.Join(store, "v0.3.0"), 0o700)
	_ = os.WriteFile(filepath.Join(store, "v0.3.0", archive), content, 0o600)
	_ = os.WriteFile(filepath.Join(store, "v0.3.0", "SHA256SUMS"), []byte(pin+"  "+archive+"\n"), 0o600)

	if err := os.WriteFile(filepath.Join(ghDir, "gh"), []byte(strings.ReplaceAll(actions.GhStub, "STORE", store)), 0o700); err != nil {
		t.Fatal(err)
	}

	return ghDir, pin
}

// runnerEnv is a hosted runner's environment: a home of its own, no configuration of this
// process (KUBECONFIG, TALOSCONFIG, SOPS_*, GHCRSYNC_*), Go's caches.
func runnerEnv(t *testing.T) []string {
	t.Helper()

	var env []string

	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "KUBECONFIG" || k == "TALOSCONFIG" || strings.HasPrefix(k, "SOPS_") || strings.HasPrefix(k, "GHCRSYNC_") {
			continue
		}

		env = append(env, kv)
	}

	return append(env, "HOME="+t.TempDir())
}
