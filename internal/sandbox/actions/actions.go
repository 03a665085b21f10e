// Package actions plays GitHub Actions for the workflows ghcrsync ships (docs/workflows): a
// runner that runs a workflow's job step by step as GitHub's runner would, and a stand-in for
// the gh CLI's releases. Tests use it; nothing in ghcrsync does.
package actions

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/rhysd/actionlint"
)

// Runner plays a GitHub Actions runner for the shipped workflows: every step in order, each
// run: script under `bash --noprofile --norc -e -o pipefail` in the workspace, with the
// variables a runner sets (GITHUB_ACTIONS, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, RUNNER_TEMP,
// GITHUB_WORKSPACE, GITHUB_RUN_ID, GITHUB_RUN_ATTEMPT, GITHUB_REPOSITORY), the workflow's,
// job's and step's env with their expressions evaluated from the test's secrets and inputs.
// The actions the steps use are played as the runner would leave the workspace: checkout (the
// workspace is a clone), setup-go (Go is on PATH), cache (a miss unless CacheSeed is set: the
// step that fills it runs), github-script (its comment body is checked). GITHUB_PATH adds to
// the next steps' PATH.
type Runner struct {
	T         testing.TB
	Workspace string
	Temp      string
	Values    map[string]string // expression -> value: "secrets.X", "inputs.holder", …
	Path      string            // PATH: the gh stub first, then what steps added ($GITHUB_PATH)
	Env       []string          // the environment every step starts from (a runner's own)
	Summary   string
	Log       strings.Builder // every step's output
	Failed    bool
	Outputs   map[string]map[string]string // step id -> outputs
	Outcomes  map[string]string            // step id -> success, failure, skipped
	Comments  []string
	// Existing are the pull request's comments before the comment step; Edits are what it did
	// to them (the comment step's script runs under node against a stub of the GitHub API).
	Existing []PRComment
	Edits    []CommentEdit
	// Pinned are values the repository's copy of a workflow sets in its env (the digest pin),
	// replacing the shipped placeholder of a variable the workflow declares.
	Pinned map[string]string
	// CacheSeed, when set, is what actions/cache restores (file name -> content): a hit.
	CacheSeed map[string][]byte
	// Attestations is the file actions/attest-build-provenance records what it attests in, as
	// GitHub's attestation store would ("SHA256 REPOSITORY" lines, the repository the workflow
	// ran in): GhStub's `gh attestation verify` reads it (STORE/attested).
	Attestations string
}

// New is a runner in workspace with its own temporary directory and step summary, the
// contexts values, and PATH path.
func New(t testing.TB, workspace, path string, env []string, values map[string]string) *Runner {
	r := &Runner{T: t, Workspace: workspace, Temp: t.TempDir(), Path: path, Env: env, Values: values,
		Outputs: map[string]map[string]string{}, Outcomes: map[string]string{}}
	r.Summary = filepath.Join(r.Temp, "summary.md")

	return r
}

// PRComment is a pull-request comment as the GitHub API lists it.
type PRComment struct {
	ID   int    `json:"id"`
	Body string `json:"body"`
	User struct {
		Login string `json:"login"`
		Type  string `json:"type"`
	} `json:"user"`
}

// CommentEdit is a create (ID 0) or update the comment step made.
type CommentEdit struct {
	Op   string `json:"op"`
	ID   int    `json:"comment_id"`
	Body string `json:"body"`
}

var (
	expr       = regexp.MustCompile(`\$\{\{\s*([^}]*?)\s*\}\}`)
	statusFunc = regexp.MustCompile(`\b(always|success|failure|cancelled)\(\)`)
)

func (r *Runner) eval(s string) string {
	return expr.ReplaceAllStringFunc(s, func(m string) string {
		return r.value(expr.FindStringSubmatch(m)[1])
	})
}

// value is a context value: a step's output or outcome (steps.ID.outputs.NAME, steps.ID.outcome:
// "" for a step that did not run), or one of the test's secrets and inputs.
func (r *Runner) value(key string) string {
	if rest, ok := strings.CutPrefix(key, "steps."); ok {
		id, field, _ := strings.Cut(rest, ".")
		if name, ok := strings.CutPrefix(field, "outputs."); ok {
			return r.Outputs[id][name]
		}

		if field == "outcome" {
			return r.Outcomes[id]
		}
	}

	// a || b: the first that is not empty, as GitHub's || returns its first truthy operand.
	if strings.Contains(key, "||") {
		for _, part := range strings.Split(key, "||") {
			if v := r.value(strings.TrimSpace(part)); v != "" {
				return v
			}
		}

		return ""
	}

	v, ok := r.Values[key]
	if !ok {
		r.T.Fatalf("the workflow uses ${{ %s }}, which this runner does not know", key)
	}

	return v
}

// cond evaluates a step's if: as the runner does, for the forms the shipped workflows use:
// the status functions (always, success, failure, cancelled — never cancelled here), !, && and
// || (&& binding tighter), and a context value compared with a string literal (==, !=). Without
// a status function, success() is implied.
func (r *Runner) cond(s string) bool {
	s = strings.TrimSpace(s)
	if m := expr.FindStringSubmatch(s); m != nil && m[0] == s {
		s = m[1]
	}

	v := r.any(s)
	if !statusFunc.MatchString(s) {
		return !r.Failed && v
	}

	return v
}

func (r *Runner) any(s string) bool {
	for _, part := range strings.Split(s, "||") {
		if r.all(part) {
			return true
		}
	}

	return false
}

func (r *Runner) all(s string) bool {
	for _, part := range strings.Split(s, "&&") {
		if !r.atom(strings.TrimSpace(part)) {
			return false
		}
	}

	return true
}

func (r *Runner) atom(s string) bool {
	if rest, ok := strings.CutPrefix(s, "!"); ok && !strings.HasPrefix(rest, "=") {
		return !r.atom(strings.TrimSpace(rest))
	}

	switch s {
	case "always()":
		return true
	case "success()":
		return !r.Failed
	case "failure()":
		return r.Failed
	case "cancelled()":
		return false
	}

	for _, op := range []string{"==", "!="} {
		if left, right, ok := strings.Cut(s, op); ok {
			eq := r.value(strings.TrimSpace(left)) == strings.Trim(strings.TrimSpace(right), "'")

			return eq == (op == "==")
		}
	}

	r.T.Fatalf("the workflow's condition %q is not one this runner evaluates", s)

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

// Run runs the workflow's one job; it returns each run: step's name and exit code.
func (r *Runner) Run(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		r.T.Fatal(err)
	}

	wf, errs := Parse(b)
	if len(errs) > 0 || len(wf.Jobs) != 1 {
		r.T.Fatalf("%s: %v, %d jobs", file, errs, len(wf.Jobs))
	}

	var trace []string

	for _, job := range wf.Jobs {
		env := envOf(wf.Env)
		for k, v := range envOf(job.Env) {
			env[k] = v
		}

		for k, v := range r.Pinned {
			if _, ok := env[k]; ok {
				env[k] = v
			}
		}

		for i, step := range job.Steps {
			name := ""
			if step.Name != nil {
				name = step.Name.Value
			}

			run := !r.Failed
			if step.If != nil {
				run = r.cond(step.If.Value)
			}

			if !run {
				trace = append(trace, name+": skipped")

				if step.ID != nil {
					r.Outcomes[step.ID.Value] = "skipped"
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

func (r *Runner) action(step *actionlint.Step, exe *actionlint.ExecAction, env map[string]string) {
	uses := exe.Uses.Value

	switch {
	case strings.HasPrefix(uses, "actions/checkout@"), strings.HasPrefix(uses, "actions/setup-go@"):
	case strings.HasPrefix(uses, "actions/cache@"):
		hit := len(r.CacheSeed) > 0
		if hit {
			r.restore(exe.Inputs["path"].Value.Value)
		}

		if step.ID != nil {
			r.Outputs[step.ID.Value] = map[string]string{"cache-hit": strconv.FormatBool(hit)}
		}
	case strings.HasPrefix(uses, "actions/github-script@"):
		r.githubScript(exe.Inputs["script"].Value.Value, env)
	case strings.HasPrefix(uses, "actions/attest-build-provenance@"):
		r.attest(exe)
	default:
		r.T.Fatalf("the workflow uses %s, which this runner does not play", uses)
	}
}

// attest plays actions/attest-build-provenance with subject-checksums (a SHA256SUMS file of
// the workspace): each subject is recorded as attested by this repository's workflow.
func (r *Runner) attest(exe *actionlint.ExecAction) {
	in := exe.Inputs["subject-checksums"]
	if in == nil || r.Attestations == "" {
		r.T.Fatalf("the attest step is played with subject-checksums and a Runner.Attestations file (got %v, %q)", in, r.Attestations)
	}

	sums, err := os.ReadFile(filepath.Join(r.Workspace, r.eval(in.Value.Value)))
	if err != nil {
		r.T.Fatalf("attest: %v", err)
	}

	f, err := os.OpenFile(r.Attestations, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		r.T.Fatal(err)
	}
	defer f.Close()

	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		if sum, _, ok := strings.Cut(line, "  "); ok {
			_, _ = f.WriteString(sum + " " + r.value("github.repository") + "\n")
		}
	}
}

// restore writes the cache seed into path (~ is the runner's HOME), as a cache hit does.
func (r *Runner) restore(path string) {
	home := ""

	for _, kv := range r.Env {
		if v, ok := strings.CutPrefix(kv, "HOME="); ok {
			home = v
		}
	}

	dir := strings.Replace(path, "~", home, 1)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		r.T.Fatal(err)
	}

	for name, content := range r.CacheSeed {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o700); err != nil {
			r.T.Fatal(err)
		}
	}
}

// githubScriptStub runs a github-script step's script as the action does (an async function
// body, with github, context and require), against a stub of the comments API: listComments
// answers r.Existing, createComment and updateComment are recorded.
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

func (r *Runner) githubScript(script string, env map[string]string) {
	node, err := exec.LookPath("node")
	if err != nil {
		r.T.Fatalf("the comment step's script needs node to be played (install nodejs): %v", err)
	}

	dir := r.T.TempDir()
	existing, edits, js := filepath.Join(dir, "existing.json"), filepath.Join(dir, "edits.json"), filepath.Join(dir, "script.js")

	b, _ := json.Marshal(append([]PRComment{}, r.Existing...))
	_ = os.WriteFile(existing, b, 0o600)
	_ = os.WriteFile(js, []byte(strings.Replace(githubScriptStub, "SCRIPT", script, 1)), 0o600)

	c := exec.Command(node, js)
	c.Dir, c.Env = r.Workspace, append(os.Environ(), "STUB_EXISTING="+existing, "STUB_EDITS="+edits)
	for k, v := range env {
		c.Env = append(c.Env, k+"="+r.eval(v))
	}

	if out, err := c.CombinedOutput(); err != nil {
		r.T.Fatalf("the comment step's script failed: %v\n%s", err, out)
	}

	got, err := os.ReadFile(edits)
	if err != nil || json.Unmarshal(got, &r.Edits) != nil {
		r.T.Fatalf("the comment step's edits: %v %s", err, got)
	}

	for _, e := range r.Edits {
		r.Comments = append(r.Comments, e.Body)
	}
}

func (r *Runner) script(i int, step *actionlint.Step, script string, env map[string]string) int {
	out := filepath.Join(r.Temp, "output-"+strconv.Itoa(i))
	_ = os.WriteFile(out, nil, 0o600)
	addPath := filepath.Join(r.Temp, "path-"+strconv.Itoa(i))
	_ = os.WriteFile(addPath, nil, 0o600)

	vars := append(slices.Clone(r.Env), "PATH="+r.Path, "GITHUB_ACTIONS=true", "GITHUB_OUTPUT="+out, "GITHUB_PATH="+addPath, "GITHUB_STEP_SUMMARY="+r.Summary,
		"RUNNER_TEMP="+r.Temp, "GITHUB_WORKSPACE="+r.Workspace, "GITHUB_RUN_ID=7001", "GITHUB_RUN_ATTEMPT=1",
		"GITHUB_REPOSITORY=ghcrsync/fleet", "SOPS_AGE_KEY_FILE=")

	for k, v := range env {
		vars = append(vars, k+"="+r.eval(v))
	}

	path := filepath.Join(r.Temp, "step-"+strconv.Itoa(i)+".sh")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		r.T.Fatal(err)
	}

	c := exec.Command("bash", "--noprofile", "--norc", "-e", "-o", "pipefail", path)
	c.Dir, c.Env = r.Workspace, vars

	var buf bytes.Buffer
	c.Stdout, c.Stderr = &buf, &buf

	_ = c.Run()
	code := c.ProcessState.ExitCode()
	r.T.Logf("step %d (%v): exit %d\n%s", i+1, stepName(step), code, buf.String())
	r.Log.Write(buf.Bytes())

	if added, _ := os.ReadFile(addPath); len(bytes.TrimSpace(added)) > 0 {
		for _, dir := range strings.Split(strings.TrimSpace(string(added)), "\n") {
			r.Path = dir + ":" + r.Path
		}
	}

	// continue-on-error: the step's outcome is a failure, the job's status is not.
	if code != 0 && (step.ContinueOnError == nil || !step.ContinueOnError.Value) {
		r.Failed = true
	}

	if step.ID != nil {
		r.Outcomes[step.ID.Value] = map[bool]string{true: "success", false: "failure"}[code == 0]

		got, _ := os.ReadFile(out)
		r.Outputs[step.ID.Value] = map[string]string{}

		for _, line := range strings.Split(strings.TrimSpace(string(got)), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				r.Outputs[step.ID.Value][k] = v
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

// Contexts are the contexts a workflow's expressions read: the repository's secrets (one
// kubeconfig for every identity), the pull request's head and the run's own names.
func Contexts(kubeconfig, talosconfig, age, prSHA string) map[string]string {
	return map[string]string{
		"secrets.SOPS_AGE_KEY": age, "secrets.PLAN_KUBECONFIG": kubeconfig, "secrets.APPLY_KUBECONFIG": kubeconfig, "secrets.TEMPLATE_KUBECONFIG": kubeconfig,
		"secrets.RELEASE_KUBECONFIG": kubeconfig, "secrets.TALOSCONFIG": talosconfig,
		"secrets.IMAGE_REGISTRY_USER": "", "secrets.IMAGE_REGISTRY_PASSWORD": "", "vars.GHCRSYNC_IMAGE": "", "secrets.GHCRSYNC_RELEASES_TOKEN": "",
		"github.event.pull_request.head.sha": prSHA, "github.token": "ghs_test", "github.ref_name": "v0.3.0",
		"github.server_url": "https://github.com", "github.repository": "ghcrsync/fleet", "github.run_id": "7001",
		"github.workflow": "ghcrsync plan", "github.job": "plan", "strategy.job-index": "0",
	}
}

// GhStub plays the gh commands the workflows run, over a folder of releases (STORE/TAG/FILE):
// release create copies the files named into the tag's folder, release download copies the
// files its patterns name out of it (and fails on one that is not there, as gh does),
// attestation verify passes a file only when STORE/attested holds its SHA-256 attested by a
// workflow of --repo (what Runner.Attestations records).
const GhStub = `#!/bin/sh
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
"attestation verify")
	file=$3; shift 3; repo=
	while [ $# -gt 0 ]; do
		case "$1" in
		--repo) repo=$2; shift 2 ;;
		--signer-workflow) shift 2 ;;
		*) shift ;;
		esac
	done
	sum=$(sha256sum "$file" | cut -d' ' -f1)
	if ! grep -qx "$sum $repo" "$store/attested" 2>/dev/null; then
		echo "gh stub: no attestation of $file ($sum) by a workflow of $repo" >&2; exit 1
	fi
	echo "Loaded 1 attestation from GitHub API (the stand-in)" ;;
*) echo "gh stub: $* is not played" >&2; exit 1 ;;
esac
`

// PublishedDigest is archive's SHA-256 as the release's SHA256SUMS lists it.
func PublishedDigest(t testing.TB, sums, archive string) string {
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

// TarGz is a gzipped tar archive of one executable file.
func TarGz(t testing.TB, name, content string) []byte {
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

// Version is the ghcrsync release the shipped workflows pin (their GHCRSYNC_VERSION).
const Version = "v0.3.0"

// ReleaseArchive is the archive of the pinned release for this machine's architecture, as the
// install steps name it, holding content as its ghcrsync: its name, its bytes and its SHA-256
// (what a workflow pins in GHCRSYNC_SHA256).
func ReleaseArchive(t testing.TB, content string) (name string, archive []byte, digest string) {
	t.Helper()

	archive = TarGz(t, "ghcrsync", content)
	sum := sha256.Sum256(archive)

	return "ghcrsync_" + Version + "_linux_" + runtime.GOARCH + ".tar.gz", archive, hex.EncodeToString(sum[:])
}

// Publish puts the pinned release — ReleaseArchive of content and its SHA256SUMS — in a
// stand-in for GitHub's releases, attested by a workflow of attestedBy ("": not attested), and
// returns the directory of GhStub over it and the archive's digest.
func Publish(t testing.TB, content, attestedBy string) (ghDir, digest string) {
	t.Helper()

	name, archive, digest := ReleaseArchive(t, content)
	store, ghDir := t.TempDir(), t.TempDir()

	attested := ""
	if attestedBy != "" {
		attested = digest + " " + attestedBy + "\n"
	}

	for path, b := range map[string][]byte{
		filepath.Join(store, Version, name):         archive,
		filepath.Join(store, Version, "SHA256SUMS"): []byte(digest + "  " + name + "\n"),
		filepath.Join(store, "attested"):            []byte(attested),
		filepath.Join(ghDir, "gh"):                  []byte(strings.ReplaceAll(GhStub, "STORE", store)),
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(path, b, 0o700); err != nil {
			t.Fatal(err)
		}
	}

	return ghDir, digest
}

// Git runs git in dir as a maintainer would (a name and address, main the default branch, no
// detached-HEAD advice) and returns its trimmed output; a failure fails the test.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()

	c := exec.Command("git", append([]string{"-c", "user.name=maintainer", "-c", "user.email=maintainer@example.com",
		"-c", "init.defaultBranch=main", "-c", "advice.detachedHead=false"}, args...)...)
	c.Dir = dir

	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}

	return strings.TrimSpace(string(out))
}
