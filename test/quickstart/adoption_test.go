package quickstart

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

	return actions.Git(f.t, dir, args...)
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

	f := newFleetRepo(t)
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

		run := actions.New(t, workspace, gh+":"+os.Getenv("PATH"), hostEnv(t, t.TempDir()), values)
		run.Pinned = map[string]string{"GHCRSYNC_SHA256": pin}
		trace := run.Run(filepath.Join(workspace, ".github", "workflows", workflow))

		if run.Failed {
			t.Fatalf("%s failed: %v\n%s", workflow, trace, run.Log.String())
		}

		return run
	}

	for i, pr := range adoptionTable(t, readRepo(t, "docs/ci.md")) {
		if i > 0 && slices.Contains(pr.files, "clusters/prod/ghcr-secret.enc.yaml") {
			rotateAgain(t, sb, r, step2)
		}

		prSHA, changed := f.open(i, pr, r.dir)
		own, target := f.onPullRequest(prSHA, changed)

		if err := pr.runsOnIt(own, target); err != nil {
			t.Fatal(err)
		}

		for _, w := range own {
			play(w, f.checkout(prSHA), prSHA)
		}

		for _, w := range target {
			if run := play(w, f.checkout("main"), prSHA); w == "plan.yml" && (len(run.Comments) != 1 || strings.Contains(run.Comments[0], "plan: failed")) {
				t.Fatalf("%s: plan.yml's comment: %q", pr.name, run.Comments)
			}
		}

		pushed, scheduled := f.merge(i, changed)
		if err := pr.runsOnMain(pushed, scheduled); err != nil {
			t.Fatal(err)
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

// newFleetRepo is the reader's repository before ghcrsync: a README on main.
func newFleetRepo(t *testing.T) *fleetRepo {
	t.Helper()

	f := &fleetRepo{t: t, origin: t.TempDir(), work: t.TempDir()}
	f.git(f.origin, "init", "-q", "--bare")
	f.git(f.work, "init", "-q")
	_ = os.WriteFile(filepath.Join(f.work, "README.md"), []byte("# fleet\n"), 0o600)
	f.git(f.work, "add", "-A")
	f.git(f.work, "commit", "-qm", "the fleet")
	f.git(f.work, "remote", "add", "origin", f.origin)
	f.git(f.work, "push", "-q", "origin", "HEAD:main")

	return f
}

// open makes the i-th pull request: the row's files from the reader's directory (a workflow
// from docs/workflows into .github/workflows), pushed as refs/pull/N/head. It returns the
// head's commit and the files it changes.
func (f *fleetRepo) open(i int, pr pullRequest, readerDir string) (sha string, changed []string) {
	f.t.Helper()

	f.git(f.work, "checkout", "-q", "-b", fmt.Sprintf("pr-%d", i+1), "main")

	for _, file := range pr.files {
		from, to := filepath.Join(readerDir, file), filepath.Join(f.work, file)
		if strings.HasSuffix(file, ".yml") {
			from, to = filepath.Join("..", "..", "docs", "workflows", file), filepath.Join(f.work, ".github", "workflows", file)
		}

		copyFile(f.t, from, to)
	}

	f.git(f.work, "add", "-A")
	f.git(f.work, "commit", "-qm", pr.name)
	sha = f.git(f.work, "rev-parse", "HEAD")
	f.git(f.work, "push", "-q", "origin", fmt.Sprintf("HEAD:refs/pull/%d/head", i+1))

	return sha, strings.Split(f.git(f.work, "diff", "--name-only", "main", "HEAD"), "\n")
}

// onPullRequest is what GitHub runs on a pull request: its own pull_request workflows, and the
// base branch's pull_request_target ones.
func (f *fleetRepo) onPullRequest(sha string, changed []string) (own, target []string) {
	f.t.Helper()

	own = triggered(f.t, f.checkout(sha), actions.Event{Name: "pull_request", Branch: "main", Changed: changed})
	target = triggered(f.t, f.checkout("main"), actions.Event{Name: "pull_request_target", Branch: "main", Changed: changed})

	return own, target
}

// merge fast-forwards main to the i-th pull request and says what then runs on main: the
// push's workflows, and the scheduled ones.
func (f *fleetRepo) merge(i int, changed []string) (pushed, scheduled []string) {
	f.t.Helper()

	f.git(f.work, "checkout", "-q", "main")
	f.git(f.work, "merge", "-q", "--ff-only", fmt.Sprintf("pr-%d", i+1))
	f.git(f.work, "push", "-q", "origin", "main")

	main := f.checkout("main")

	return triggered(f.t, main, actions.Event{Name: "push", Branch: "main", Changed: changed}),
		triggered(f.t, main, actions.Event{Name: "schedule", Branch: "main"})
}

// runsOnIt compares what GitHub runs on the pull request with the table's row.
func (pr pullRequest) runsOnIt(own, target []string) error {
	if got := names(own, target); !slices.Equal(got, pr.runs) {
		return fmt.Errorf("%s: GitHub runs %v on it, docs/ci.md's adoption table says %v", pr.name, got, pr.runs)
	}

	return nil
}

// runsOnMain compares what GitHub runs on main after the merge with the table's row.
func (pr pullRequest) runsOnMain(pushed, scheduled []string) error {
	if got := names(pushed, scheduled); !slices.Equal(got, pr.then) {
		return fmt.Errorf("%s: after its merge GitHub runs %v on main, docs/ci.md's adoption table says %v", pr.name, got, pr.then)
	}

	return nil
}

// The adoption table against GitHub's rules, with no cluster: each pull request's files (a
// stand-in for the reader's), what runs on it and on main after its merge. The control puts
// back the order the docs had (the pull request that adds plan.yml promised a plan): plan.yml
// runs from the base branch, which has none yet, and the check fails naming it.
func TestAdoptionTableMatchesGitHubsTriggers(t *testing.T) {
	ci := readRepo(t, "docs/ci.md")
	old := strings.Replace(ci, "`validate.yml`, `plan.yml` | validate | — |", "`validate.yml`, `plan.yml` | validate, plan | — |", 1)

	if old == ci {
		t.Fatal("the adoption table's first row changed: update this control")
	}

	for _, c := range []struct {
		name, doc string
		fails     string
	}{
		{"as written", ci, ""},
		{"a plan promised on the pull request that adds plan.yml", old, "1. Adoption: GitHub runs [validate] on it, docs/ci.md's adoption table says [validate plan]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, reader := newFleetRepo(t), t.TempDir()

			var err error

			for i, pr := range adoptionTable(t, c.doc) {
				for _, file := range pr.files { // the reader's files, each pull request's own version
					if !strings.HasSuffix(file, ".yml") {
						writeFile(t, filepath.Join(reader, file), pr.name+"\n")
					}
				}

				sha, changed := f.open(i, pr, reader)
				if err = pr.runsOnIt(f.onPullRequest(sha, changed)); err != nil {
					break
				}

				if err = pr.runsOnMain(f.merge(i, changed)); err != nil {
					break
				}
			}

			if got := fmt.Sprint(err); (c.fails == "") != (err == nil) || c.fails != "" && !strings.Contains(got, c.fails) {
				t.Fatalf("got %v, want %q", err, c.fails)
			}
		})
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

	// Attested by the fork's release workflow (its attest step), for gh attestation verify.
	return actions.Publish(t, string(b), "acme/ghcrsync")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()

	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
