package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rhysd/actionlint"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// runner plays a GitHub Actions runner for the shipped workflows: every step in order, each
// run: script under `bash --noprofile --norc -e -o pipefail` in the workspace, with the
// variables a runner sets (GITHUB_ACTIONS, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, RUNNER_TEMP,
// GITHUB_WORKSPACE, GITHUB_RUN_ID, GITHUB_RUN_ATTEMPT, GITHUB_REPOSITORY), the workflow's,
// job's and step's env with their expressions evaluated from the test's secrets and inputs.
// The actions the steps use are played as the runner would leave the workspace: checkout (the
// workspace is a clone), setup-go (Go is on PATH), cache (always a miss: the step that fills it
// runs), github-script (its comment body is checked). GITHUB_PATH adds to the next steps' PATH.
type runner struct {
	t         *testing.T
	workspace string
	temp      string
	values    map[string]string // expression -> value: "secrets.X", "inputs.holder", …
	path      string            // PATH: the gh stub first, then what steps added ($GITHUB_PATH)
	env       []string          // the environment every step starts from (a runner's own)
	summary   string
	log       strings.Builder // every step's output
	failed    bool
	outputs   map[string]map[string]string // step id -> outputs
	outcomes  map[string]string            // step id -> success, failure, skipped
	comments  []string
	// existing are the pull request's comments before the comment step; edits are what it did
	// to them (the comment step's script runs under node against a stub of the GitHub API).
	existing []prComment
	edits    []commentEdit
	// pinned are values the repository's copy of a workflow sets in its env (the digest pin),
	// replacing the shipped placeholder of a variable the workflow declares.
	pinned map[string]string
	// cacheSeed, when set, is what actions/cache restores (file name -> content): a hit.
	cacheSeed map[string][]byte
}

// prComment is a pull-request comment as the GitHub API lists it.
type prComment struct {
	ID   int    `json:"id"`
	Body string `json:"body"`
	User struct {
		Login string `json:"login"`
		Type  string `json:"type"`
	} `json:"user"`
}

// commentEdit is a create (ID 0) or update the comment step made.
type commentEdit struct {
	Op   string `json:"op"`
	ID   int    `json:"comment_id"`
	Body string `json:"body"`
}

var (
	expr       = regexp.MustCompile(`\$\{\{\s*([^}]*?)\s*\}\}`)
	statusFunc = regexp.MustCompile(`\b(always|success|failure|cancelled)\(\)`)
)

func (r *runner) eval(s string) string {
	return expr.ReplaceAllStringFunc(s, func(m string) string {
		return r.value(expr.FindStringSubmatch(m)[1])
	})
}

// value is a context value: a step's output or outcome (steps.ID.outputs.NAME, steps.ID.outcome:
// "" for a step that did not run), or one of the test's secrets and inputs.
func (r *runner) value(key string) string {
	if rest, ok := strings.CutPrefix(key, "steps."); ok {
		id, field, _ := strings.Cut(rest, ".")
		if name, ok := strings.CutPrefix(field, "outputs."); ok {
			return r.outputs[id][name]
		}

		if field == "outcome" {
			return r.outcomes[id]
		}
	}

	v, ok := r.values[key]
	if !ok {
		r.t.Fatalf("the workflow uses ${{ %s }}, which this runner does not know", key)
	}

	return v
}

// cond evaluates a step's if: as the runner does, for the forms the shipped workflows use:
// the status functions (always, success, failure, cancelled — never cancelled here), !, && and
// || (&& binding tighter), and a context value compared with a string literal (==, !=). Without
// a status function, success() is implied.
func (r *runner) cond(s string) bool {
	s = strings.TrimSpace(s)
	if m := expr.FindStringSubmatch(s); m != nil && m[0] == s {
		s = m[1]
	}

	v := r.any(s)
	if !statusFunc.MatchString(s) {
		return !r.failed && v
	}

	return v
}

func (r *runner) any(s string) bool {
	for _, part := range strings.Split(s, "||") {
		if r.all(part) {
			return true
		}
	}

	return false
}

func (r *runner) all(s string) bool {
	for _, part := range strings.Split(s, "&&") {
		if !r.atom(strings.TrimSpace(part)) {
			return false
		}
	}

	return true
}

func (r *runner) atom(s string) bool {
	if rest, ok := strings.CutPrefix(s, "!"); ok && !strings.HasPrefix(rest, "=") {
		return !r.atom(strings.TrimSpace(rest))
	}

	switch s {
	case "always()":
		return true
	case "success()":
		return !r.failed
	case "failure()":
		return r.failed
	case "cancelled()":
		return false
	}

	for _, op := range []string{"==", "!="} {
		if left, right, ok := strings.Cut(s, op); ok {
			eq := r.value(strings.TrimSpace(left)) == strings.Trim(strings.TrimSpace(right), "'")

			return eq == (op == "==")
		}
	}

	r.t.Fatalf("the workflow's condition %q is not one this runner evaluates", s)

	return false
}

func envOf(e *actionlint.Env) map[string]string {
	out := map[string]string{}

	if e != nil {
		for _, v := range e.Vars {
			out[v.Name.Value] = v.Value.Value
		}
	}

	return out
}

// run runs the workflow's one job; it returns each run: step's name and exit code.
func (r *runner) run(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		r.t.Fatal(err)
	}

	wf, errs := actionlint.Parse(b)
	if len(errs) > 0 || len(wf.Jobs) != 1 {
		r.t.Fatalf("%s: %v, %d jobs", file, errs, len(wf.Jobs))
	}

	var trace []string

	for _, job := range wf.Jobs {
		env := envOf(wf.Env)
		for k, v := range envOf(job.Env) {
			env[k] = v
		}

		for k, v := range r.pinned {
			if _, ok := env[k]; ok {
				env[k] = v
			}
		}

		for i, step := range job.Steps {
			name := ""
			if step.Name != nil {
				name = step.Name.Value
			}

			run := !r.failed
			if step.If != nil {
				run = r.cond(step.If.Value)
			}

			if !run {
				trace = append(trace, name+": skipped")

				if step.ID != nil {
					r.outcomes[step.ID.Value] = "skipped"
				}

				continue
			}

			stepEnv := map[string]string{}
			for k, v := range env {
				stepEnv[k] = v
			}

			for k, v := range envOf(step.Env) {
				stepEnv[k] = v
			}

			switch exe := step.Exec.(type) {
			case *actionlint.ExecAction:
				r.action(step, exe, stepEnv)
				trace = append(trace, exe.Uses.Value+": played")
			case *actionlint.ExecRun:
				code := r.script(i, step, exe.Run.Value, stepEnv)
				trace = append(trace, name+": exit "+strconv.Itoa(code))
			}
		}
	}

	return trace
}

func (r *runner) action(step *actionlint.Step, exe *actionlint.ExecAction, env map[string]string) {
	uses := exe.Uses.Value

	switch {
	case strings.HasPrefix(uses, "actions/checkout@"), strings.HasPrefix(uses, "actions/setup-go@"):
	case strings.HasPrefix(uses, "actions/cache@"):
		hit := len(r.cacheSeed) > 0
		if hit {
			r.restore(exe.Inputs["path"].Value.Value)
		}

		if step.ID != nil {
			r.outputs[step.ID.Value] = map[string]string{"cache-hit": strconv.FormatBool(hit)}
		}
	case strings.HasPrefix(uses, "actions/github-script@"):
		r.githubScript(exe.Inputs["script"].Value.Value, env)
	default:
		r.t.Fatalf("the workflow uses %s, which this runner does not play", uses)
	}
}

// restore writes the cache seed into path (~ is the runner's HOME), as a cache hit does.
func (r *runner) restore(path string) {
	home := ""

	for _, kv := range r.env {
		if v, ok := strings.CutPrefix(kv, "HOME="); ok {
			home = v
		}
	}

	dir := strings.Replace(path, "~", home, 1)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		r.t.Fatal(err)
	}

	for name, content := range r.cacheSeed {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o700); err != nil {
			r.t.Fatal(err)
		}
	}
}

// githubScriptStub runs a github-script step's script as the action does (an async function
// body, with github, context and require), against a stub of the comments API: listComments
// answers r.existing, createComment and updateComment are recorded.
const githubScriptStub = `const fs = require('fs');
const existing = JSON.parse(fs.readFileSync(process.env.STUB_EXISTING, 'utf8'));
const edits = [];
const github = {
  paginate: async (fn, args) => { if (fn !== 'listComments') throw new Error('paginate ' + fn); return existing; },
  rest: { issues: {
    listComments: 'listComments',
    createComment: async (a) => { edits.push({ op: 'create', comment_id: 0, body: a.body }); },
    updateComment: async (a) => { edits.push({ op: 'update', comment_id: a.comment_id, body: a.body }); },
  } },
};
const context = { repo: { owner: 'ghcrsync', repo: 'fleet' }, issue: { number: 1 } };
(async () => {
SCRIPT
})().then(() => fs.writeFileSync(process.env.STUB_EDITS, JSON.stringify(edits)), (e) => { console.error(e); process.exit(1); });
`

func (r *runner) githubScript(script string, env map[string]string) {
	node, err := exec.LookPath("node")
	if err != nil {
		r.t.Fatalf("the comment step's script needs node to be played (install nodejs): %v", err)
	}

	dir := r.t.TempDir()
	existing, edits, js := filepath.Join(dir, "existing.json"), filepath.Join(dir, "edits.json"), filepath.Join(dir, "script.js")

	b, _ := json.Marshal(append([]prComment{}, r.existing...))
	_ = os.WriteFile(existing, b, 0o600)
	_ = os.WriteFile(js, []byte(strings.Replace(githubScriptStub, "SCRIPT", script, 1)), 0o600)

	c := exec.Command(node, js)
	c.Dir, c.Env = r.workspace, append(os.Environ(), "STUB_EXISTING="+existing, "STUB_EDITS="+edits)
	for k, v := range env {
		c.Env = append(c.Env, k+"="+r.eval(v))
	}

	if out, err := c.CombinedOutput(); err != nil {
		r.t.Fatalf("the comment step's script failed: %v\n%s", err, out)
	}

	got, err := os.ReadFile(edits)
	if err != nil || json.Unmarshal(got, &r.edits) != nil {
		r.t.Fatalf("the comment step's edits: %v %s", err, got)
	}

	for _, e := range r.edits {
		r.comments = append(r.comments, e.Body)
	}
}

func (r *runner) script(i int, step *actionlint.Step, script string, env map[string]string) int {
	out := filepath.Join(r.temp, "output-"+strconv.Itoa(i))
	_ = os.WriteFile(out, nil, 0o600)
	addPath := filepath.Join(r.temp, "path-"+strconv.Itoa(i))
	_ = os.WriteFile(addPath, nil, 0o600)

	vars := append(slices.Clone(r.env), "PATH="+r.path, "GITHUB_ACTIONS=true", "GITHUB_OUTPUT="+out, "GITHUB_PATH="+addPath, "GITHUB_STEP_SUMMARY="+r.summary,
		"RUNNER_TEMP="+r.temp, "GITHUB_WORKSPACE="+r.workspace, "GITHUB_RUN_ID=7001", "GITHUB_RUN_ATTEMPT=1",
		"GITHUB_REPOSITORY=ghcrsync/fleet", "SOPS_AGE_KEY_FILE=")

	for k, v := range env {
		vars = append(vars, k+"="+r.eval(v))
	}

	path := filepath.Join(r.temp, "step-"+strconv.Itoa(i)+".sh")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		r.t.Fatal(err)
	}

	c := exec.Command("bash", "--noprofile", "--norc", "-e", "-o", "pipefail", path)
	c.Dir, c.Env = r.workspace, vars

	var buf bytes.Buffer
	c.Stdout, c.Stderr = &buf, &buf

	_ = c.Run()
	code := c.ProcessState.ExitCode()
	r.t.Logf("step %d (%v): exit %d\n%s", i+1, stepName(step), code, buf.String())
	r.log.Write(buf.Bytes())

	if added, _ := os.ReadFile(addPath); len(bytes.TrimSpace(added)) > 0 {
		for _, dir := range strings.Split(strings.TrimSpace(string(added)), "\n") {
			r.path = dir + ":" + r.path
		}
	}

	// continue-on-error: the step's outcome is a failure, the job's status is not.
	if code != 0 && (step.ContinueOnError == nil || !step.ContinueOnError.Value) {
		r.failed = true
	}

	if step.ID != nil {
		r.outcomes[step.ID.Value] = map[bool]string{true: "success", false: "failure"}[code == 0]

		got, _ := os.ReadFile(out)
		r.outputs[step.ID.Value] = map[string]string{}

		for _, line := range strings.Split(strings.TrimSpace(string(got)), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				r.outputs[step.ID.Value][k] = v
			}
		}
	}

	return code
}

func stepName(s *actionlint.Step) string {
	if s.Name != nil {
		return s.Name.Value
	}

	return "unnamed"
}

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

	git := func(dir string, args ...string) string {
		c := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"}, args...)...)
		c.Dir = dir

		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}

		return strings.TrimSpace(string(out))
	}

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
	if err := os.WriteFile(filepath.Join(tools, "gh"), []byte(strings.ReplaceAll(ghStub, "STORE", releases)), 0o700); err != nil {
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

	newRunnerIn := func(workspace string, inputs map[string]string) *runner {
		r := &runner{t: t, workspace: workspace, temp: t.TempDir(), path: tools + ":" + os.Getenv("PATH"), env: baseEnv,
			outputs: map[string]map[string]string{}, outcomes: map[string]string{},
			values: runnerValues(string(kubeconfig), string(talosconfig), string(age), prSHA)}
		for k, v := range inputs {
			r.values["inputs."+k] = v
		}

		r.summary = filepath.Join(r.temp, "summary.md")
		r.pinned = map[string]string{"GHCRSYNC_SHA256": pin}

		return r
	}
	newRunner := func(inputs map[string]string) *runner { return newRunnerIn(ws, inputs) }

	// release.yml, on a clone of this repository at its commit, with the tag the other workflows
	// pin: make release's archive, SBOM, provenance and SHA256SUMS published as the release.
	src := t.TempDir()
	if out, err := exec.Command("git", "clone", "-q", "../..", src).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}

	rel := newRunnerIn(src, nil)
	if trace := rel.run("../../docs/workflows/release.yml"); rel.failed || !slices.Contains(trace, "Image: skipped") {
		t.Fatalf("release.yml: %v", trace)
	}

	published, _ := filepath.Glob(filepath.Join(releases, "v0.3.0", "*"))
	for _, want := range []string{"SHA256SUMS", "ghcrsync_v0.3.0.cdx.json", "ghcrsync_v0.3.0.intoto.jsonl", "ghcrsync_v0.3.0_linux_" + runtime.GOARCH + ".tar.gz"} {
		if !slices.Contains(published, filepath.Join(releases, "v0.3.0", want)) {
			t.Fatalf("release.yml published %v, not %s", published, want)
		}
	}

	archive := "ghcrsync_v0.3.0_linux_" + runtime.GOARCH + ".tar.gz"
	pin = publishedDigest(t, filepath.Join(releases, "v0.3.0", "SHA256SUMS"), archive)

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
		{"another binary in the cache", pin, tarGz(t, "ghcrsync", "#!/bin/sh\ntouch "+ran+"\n"), "FAILED"},
		{"no pin", "", genuine, "GHCRSYNC_SHA256 is not set"},
		{"the pinned archive in the cache", pin, genuine, ""},
	} {
		r := newRunner(nil)
		r.env = append(slices.Clone(baseEnv), "HOME="+t.TempDir())
		r.cacheSeed, r.pinned = map[string][]byte{archive: c.seed}, map[string]string{"GHCRSYNC_SHA256": c.pin}

		trace := r.run("../../docs/workflows/validate.yml")

		switch {
		case !slices.Contains(trace, "Download ghcrsync: skipped"):
			t.Fatalf("%s: the cache hit downloaded anyway: %v", c.name, trace)
		case c.fails == "" && (r.failed || !slices.Contains(trace, "Valid: exit 0")):
			t.Fatalf("%s: validate.yml failed: %v\n%s", c.name, trace, r.log.String())
		case c.fails != "" && (!r.failed || !slices.Contains(trace, "Install ghcrsync: exit 1") || !strings.Contains(r.log.String(), c.fails) ||
			slices.Contains(trace, "ghcrsync on PATH: exit 0")):
			t.Fatalf("%s: the job did not fail at its install step: %v\n%s", c.name, trace, r.log.String())
		}
	}

	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatalf("the binary from the cache ran (%v)", err)
	}

	check := newRunner(nil)
	if trace := check.run("../../docs/workflows/validate.yml"); check.failed || !slices.Contains(trace, "Valid: exit 0") ||
		!slices.Contains(trace, "Formatted: exit 0") {
		t.Fatalf("validate.yml: %v\n%s", trace, check.log.String())
	}

	good, _ := os.ReadFile(filepath.Join(ws, "ghcrsync.hcl"))
	_ = os.WriteFile(filepath.Join(ws, "ghcrsync.hcl"), append(slices.Clone(good), "\nnodes {\n  drain_timout = \"1m\"\n}\n"...), 0o600)

	broken := newRunner(nil)
	if trace := broken.run("../../docs/workflows/validate.yml"); !broken.failed || !strings.Contains(broken.log.String(), "::error file=ghcrsync.hcl,line=") {
		t.Fatalf("validate.yml on a broken configuration: %v\n%s", trace, broken.log.String())
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
	comment := func(id int, login, typ, body string) prComment {
		c := prComment{ID: id, Body: body}
		c.User.Login, c.User.Type = login, typ

		return c
	}

	plan := newRunner(nil)
	plan.existing = []prComment{
		comment(11, "mallory", "User", view.MarkdownMarker+" cluster="+uid+" -->\nforged"),
		comment(12, "github-actions[bot]", "Bot", view.MarkdownMarker+" cluster=another-cluster -->\nthe other cluster's plan"),
		comment(13, "github-actions[bot]", "Bot", view.MarkdownMarker+" cluster="+uid+" -->\nthe previous plan"),
	}
	trace := plan.run("../../docs/workflows/plan.yml")

	if plan.failed || plan.outputs["plan"]["exitcode"] != "2" || len(plan.comments) != 1 || !strings.HasPrefix(plan.comments[0], view.MarkdownMarker+" cluster="+uid+" -->\n") {
		t.Fatalf("plan.yml: %v, outputs %v, %d comment(s)", trace, plan.outputs, len(plan.comments))
	}

	if len(plan.edits) != 1 || plan.edits[0].Op != "update" || plan.edits[0].ID != 13 {
		t.Fatalf("plan.yml's comment step edited %+v, want only an update of its own comment for this cluster (13)", plan.edits)
	}

	// The control: with none of its own, it creates one, and still leaves the others alone.
	fresh := newRunner(nil)
	fresh.existing = plan.existing[:2]

	if fresh.run("../../docs/workflows/plan.yml"); len(fresh.edits) != 1 || fresh.edits[0].Op != "create" {
		t.Fatalf("plan.yml's comment step with no comment of its own: %+v", fresh.edits)
	}

	// A plan that fails (an identity that cannot reach the cluster) replaces this job's last
	// plan with a failure note: a green plan must not outlive the failure.
	failing := newRunner(nil)
	failing.values["secrets.PLAN_KUBECONFIG"] = "not a kubeconfig"
	failing.existing = []prComment{comment(12, "github-actions[bot]", "Bot", view.MarkdownMarker+" cluster=another-cluster -->\nthe other cluster's plan"),
		comment(14, "github-actions[bot]", "Bot", plan.edits[0].Body)}

	if trace := failing.run("../../docs/workflows/plan.yml"); !failing.failed || len(failing.edits) != 1 || failing.edits[0].ID != 14 ||
		!strings.Contains(failing.edits[0].Body, "### ghcrsync plan: failed") {
		t.Fatalf("plan.yml with a failing plan: %v, edits %+v", trace, failing.edits)
	}

	if s, _ := os.ReadFile(plan.summary); !strings.Contains(string(s), "### ghcrsync plan: ") {
		t.Fatalf("plan.yml's step summary:\n%s", s)
	}

	// The deploy job runs on the merged commit (a fast-forward of main to the pull request's; the
	// plan job's depth-1 fetch left the clone shallow, so it is checked out, not merged).
	git(ws, "reset", "-q", "--hard", prSHA)

	apply := newRunner(nil)
	if trace := apply.run("../../docs/workflows/apply.yml"); apply.failed || !strings.Contains(strings.Join(trace, "\n"), "Recover: skipped") {
		t.Fatalf("apply.yml: %v", trace)
	}

	if s, _ := os.ReadFile(apply.summary); !strings.Contains(string(s), "ghcrsync apply") {
		t.Fatalf("apply.yml's step summary:\n%s", s)
	}

	if apply.outputs["apply"]["outcome"] != "done" || apply.outputs["apply"]["safe_to_revoke"] != "true" {
		t.Fatalf("apply.yml's Apply step outputs: %v", apply.outputs["apply"])
	}

	// The continuation lane with nothing left: it plans (exit 0) and stops — no apply, nothing
	// written, no recovery.
	idle := newRunner(nil)
	if trace := idle.run("../../docs/workflows/continue.yml"); idle.failed || idle.outputs["plan"]["exitcode"] != "0" ||
		!slices.Contains(trace, "Apply: skipped") || !slices.Contains(trace, "Outcome: skipped") || !slices.Contains(trace, "Recover: skipped") {
		t.Fatalf("continue.yml with nothing to do: %v, outputs %v", trace, idle.outputs)
	}

	// With something left (a consumer pull secret lost since), it applies and passes.
	if err := sb.Kube().CoreV1().Secrets(sandbox.ConsumerNamespaces[1]).Delete(t.Context(), sandbox.ConsumerSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	work := newRunner(nil)
	if trace := work.run("../../docs/workflows/continue.yml"); work.failed || work.outputs["plan"]["exitcode"] != "2" ||
		work.outputs["apply"]["outcome"] != "done" || !slices.Contains(trace, "Outcome: exit 0") || !slices.Contains(trace, "Recover: skipped") {
		t.Fatalf("continue.yml with a pull secret to write: %v, outputs %v", trace, work.outputs)
	}

	recover := newRunner(map[string]string{"holder": ""})
	if trace := recover.run("../../docs/workflows/recover.yml"); recover.failed {
		t.Fatalf("recover.yml: %v", trace)
	}
}

// runnerValues are the contexts a workflow's expressions read: the repository's secrets (one
// kubeconfig for every identity), the pull request's head and the run's own names.
func runnerValues(kubeconfig, talosconfig, age, prSHA string) map[string]string {
	return map[string]string{
		"secrets.SOPS_AGE_KEY": age, "secrets.PLAN_KUBECONFIG": kubeconfig, "secrets.APPLY_KUBECONFIG": kubeconfig, "secrets.TEMPLATE_KUBECONFIG": kubeconfig,
		"secrets.RELEASE_KUBECONFIG": kubeconfig, "secrets.TALOSCONFIG": talosconfig,
		"secrets.IMAGE_REGISTRY_USER": "", "secrets.IMAGE_REGISTRY_PASSWORD": "", "vars.GHCRSYNC_IMAGE": "",
		"github.event.pull_request.head.sha": prSHA, "github.token": "ghs_test", "github.ref_name": "v0.3.0",
		"github.server_url": "https://github.com", "github.repository": "ghcrsync/fleet", "github.run_id": "7001",
		"github.workflow": "ghcrsync plan", "github.job": "plan", "strategy.job-index": "0",
	}
}

// ghStub plays the gh commands the workflows run, over a folder of releases (STORE/TAG/FILE):
// release create copies the files named into the tag's folder, release download copies the
// files its patterns name out of it (and fails on one that is not there, as gh does).
const ghStub = `#!/bin/sh
set -e
store=STORE
case "$1 $2" in
"release create")
	tag=$3; shift 3; mkdir -p "$store/$tag"
	while [ $# -gt 0 ]; do
		case "$1" in
		--title|--notes|--repo) shift 2 ;;
		--*) shift ;;
		*) cp "$1" "$store/$tag/"; shift ;;
		esac
	done ;;
"release download")
	tag=$3; shift 3
	while [ $# -gt 0 ]; do
		case "$1" in
		--pattern) cp "$store/$tag/$2" . ; shift 2 ;;
		--repo) shift 2 ;;
		*) shift ;;
		esac
	done ;;
*) echo "gh stub: $* is not played" >&2; exit 1 ;;
esac
`

// publishedDigest is archive's SHA-256 as the release's SHA256SUMS lists it.
func publishedDigest(t *testing.T, sums, archive string) string {
	t.Helper()

	b, err := os.ReadFile(sums)
	if err != nil {
		t.Fatal(err)
	}

	for _, line := range strings.Split(string(b), "\n") {
		if digest, name, ok := strings.Cut(line, "  "); ok && name == archive {
			return digest
		}
	}

	t.Fatalf("%s lists no %s:\n%s", sums, archive, b)

	return ""
}

// tarGz is a gzipped tar archive of one executable file.
func tarGz(t *testing.T, name, content string) []byte {
	t.Helper()

	var b bytes.Buffer

	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)

	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(content))}); err != nil {
		t.Fatal(err)
	}

	_, _ = tw.Write([]byte(content))
	_ = tw.Close()
	_ = gz.Close()

	return b.Bytes()
}

func goTool(t *testing.T) string {
	t.Helper()

	p, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go")
	}

	return p
}
