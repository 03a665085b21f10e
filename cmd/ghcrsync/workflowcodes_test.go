package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/actions"
)

// codeCell is one cell of docs/ci.md's table "What each shipped workflow makes of each code":
// the workflow, the step and the command it runs, the command's exit code and the job's result
// (pass, notice, fail; "—" for a code the command does not produce).
type codeCell struct {
	workflow, step, command string
	code                    int
	result                  string
}

var tableCodes = []int{0, 1, 2, 3, 4, 5, 6, 130, 143}

// workflowCodeTable reads the table from docs/ci.md.
func workflowCodeTable(t *testing.T, ci string) []codeCell {
	t.Helper()

	_, table, ok := strings.Cut(ci, "| Workflow | Step: command | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 130 | 143 |\n")
	if !ok {
		t.Fatal("docs/ci.md has no table of what each shipped workflow makes of each code")
	}

	row := regexp.MustCompile("^\\| ([a-z]+\\.yml) \\| ([A-Za-z ]+): `([a-z -]+)` \\|(.*)\\|$")

	var cells []codeCell

	for _, line := range strings.Split(table, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}

		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("docs/ci.md: a row of the workflow table this test cannot read: %q", line)
		}

		results := strings.Split(m[4], "|")
		if len(results) != len(tableCodes) {
			t.Fatalf("docs/ci.md: %q has %d cells, want %d", line, len(results), len(tableCodes))
		}

		for i, res := range results {
			res = strings.TrimSpace(res)
			if !slices.Contains([]string{"pass", "notice", "fail", "—"}, res) {
				t.Fatalf("docs/ci.md: %q: %q is not pass, notice, fail or —", line, res)
			}

			cells = append(cells, codeCell{workflow: m[1], step: m[2], command: m[3], code: tableCodes[i], result: res})
		}
	}

	return cells
}

// producedBy reads the exit-code table's last column: the commands each code comes from
// ("every command" and "any command" are all of them).
func producedBy(t *testing.T, ci string) map[int]string {
	t.Helper()

	out := map[int]string{}

	for _, m := range regexp.MustCompile(`(?m)^\| (\d+)(?: / (\d+))? \|.*\| ([^|]+) \|$`).FindAllStringSubmatch(ci, -1) {
		for _, c := range m[1:3] {
			if c != "" {
				n, _ := strconv.Atoi(c)
				out[n] = m[3]
			}
		}
	}

	if len(out) != len(tableCodes) {
		t.Fatalf("docs/ci.md's exit-code table names codes %v, want %v", out, tableCodes)
	}

	return out
}

// produces reports whether the exit-code table says the command (its first word; a code that
// only a flag produces, 2, needs the flag) can exit with code.
func produces(column, command string, code int) bool {
	name, _, _ := strings.Cut(command, " ")

	switch {
	case code == 2 && !strings.Contains(command, "--detailed-exitcode") && !strings.Contains(command, "--exit-code") && !strings.Contains(command, "--check"):
		return false
	case strings.Contains(column, "every command"), strings.Contains(column, "any command"):
		return true
	}

	return strings.Contains(column, "`"+name+"`")
}

// The table of what each workflow makes of each code agrees with the exit-code table: a cell
// only for a code its command produces, and a cell for every code it produces.
func TestWorkflowCodeTableAgreesWithTheExitCodes(t *testing.T) {
	ci := readDoc(t, "docs/ci.md")
	column := producedBy(t, ci)

	for _, c := range workflowCodeTable(t, ci) {
		if has := c.result != "—"; has != produces(column[c.code], c.command, c.code) {
			t.Errorf("%s, %s (%s), exit %d: the table says %q, the exit codes say it is produced by %s",
				c.workflow, c.step, c.command, c.code, c.result, column[c.code])
		}
	}
}

// stubGhcrsync is a ghcrsync that exits as STUB_CODES tells it: "KEY=CODE;…", KEY the command
// and the flag of it that changes its codes ("plan --detailed-exitcode", "fences --exit-code",
// "fmt --check"); any other command exits 0; validate --list-inputs prints ghcrsync.hcl and
// STUB_INPUTS (default the credential's file). Like the real one under GitHub Actions it writes
// apply's outputs (its outcome for the code: done, partial, progressed, cancelled; none when it
// stopped before a run: 1, 3, 4) and, with --markdown, the plan's Markdown on 0 and 2. Each
// call is logged as "KEY CODE" to STUB_LOG.
const stubGhcrsync = `#!/bin/bash
case " $* " in
*" --list-inputs "*) printf '%s\n' ghcrsync.hcl ${STUB_INPUTS:-clusters/prod/ghcr-secret.enc.yaml}; exit 0 ;;
esac
key=$1 markdown=
for a in "$@"; do
	case "$a" in --detailed-exitcode|--exit-code|--check) key="$key $a" ;; esac
done
while [ $# -gt 0 ]; do
	case "$1" in --markdown) markdown=$2; shift ;; esac
	shift
done
code=0
IFS=';' read -ra pairs <<< "$STUB_CODES"
for p in "${pairs[@]}"; do [ "${p%%=*}" = "$key" ] && code=${p#*=}; done
echo "$key $code" >> "$STUB_LOG"
if [ -n "$markdown" ] && { [ "$code" = 0 ] || [ "$code" = 2 ]; }; then
	printf '%s\n' '<!-- ghcrsync-plan cluster=stub -->' '### ghcrsync plan: stub' > "$markdown"
fi
if [ "$key" = apply ] && [ -n "$GITHUB_OUTPUT" ]; then
	case "$code" in
	0) printf 'outcome=done\nremaining=0\nsafe_to_revoke=true\n' >> "$GITHUB_OUTPUT" ;;
	5) printf 'outcome=partial\nremaining=0\nsafe_to_revoke=false\n' >> "$GITHUB_OUTPUT" ;;
	6) printf 'outcome=progressed\nremaining=2\nsafe_to_revoke=false\n' >> "$GITHUB_OUTPUT" ;;
	130|143) printf 'outcome=cancelled\nremaining=0\nsafe_to_revoke=false\n' >> "$GITHUB_OUTPUT" ;;
	esac
fi
exit "$code"
`

// Every shipped workflow, played once per cell of docs/ci.md's table with a ghcrsync that exits
// with the cell's code: the job's result, its notice, plan.yml's comment and the Recover step
// are what the table says. A workflow that let exit 3 pass (continue.yml once did) fails here.
func TestShippedWorkflowsAnswerEachExitCode(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("plan.yml's comment step is played with node (install nodejs)")
	}

	cells := workflowCodeTable(t, readDoc(t, "docs/ci.md"))

	// The stub is installed as a release archive is: from the cache, checked against its pin.
	archive, content, pin := actions.ReleaseArchive(t, stubGhcrsync)

	origin, prSHA := pullRequestRepo(t)

	for _, c := range cells {
		if c.result == "—" {
			continue
		}

		t.Run(fmt.Sprintf("%s %s exit %d", c.workflow, c.step, c.code), func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "calls")
			codes := fmt.Sprintf("%s=%d", c.command, c.code)

			if c.workflow == "continue.yml" && c.command == "apply" {
				codes += ";plan --detailed-exitcode=2" // apply runs only on a plan with changes
			}

			r := actions.New(t, clone(t, origin), os.Getenv("PATH"), append(os.Environ(), "HOME="+t.TempDir(), "STUB_CODES="+codes, "STUB_LOG="+log),
				actions.Contexts("kubeconfig", "talosconfig", "age-key", prSHA))
			r.Pinned, r.CacheSeed = map[string]string{"GHCRSYNC_SHA256": pin}, map[string][]byte{archive: content}
			r.Values["inputs.holder"] = ""

			trace := r.Run("../../docs/workflows/" + c.workflow)

			calls, _ := os.ReadFile(log)
			if !slices.Contains(strings.Split(string(calls), "\n"), fmt.Sprintf("%s %d", c.command, c.code)) {
				t.Fatalf("the step never ran `ghcrsync %s` (calls: %q): %v", c.command, calls, trace)
			}

			got := map[bool]string{true: "fail", false: "pass"}[r.Failed]
			if got == "pass" && strings.Contains(r.Log.String(), "::notice") {
				got = "notice"
			}

			if got != c.result {
				t.Fatalf("the job's result is %s, docs/ci.md's table says %s: %v\n%s", got, c.result, trace, r.Log.String())
			}

			if c.workflow == "apply.yml" || c.workflow == "continue.yml" {
				recovered := slices.Contains(trace, "Recover: exit 0")
				if recovered != (c.result == "fail") {
					t.Fatalf("Recover ran: %v, the job %s: %v", recovered, c.result, trace)
				}
			}

			if c.workflow == "plan.yml" {
				planned := c.result != "fail"
				if len(r.Comments) != 1 || strings.Contains(r.Comments[0], "ghcrsync plan: stub") != planned ||
					strings.Contains(r.Comments[0], "ghcrsync plan: failed") == planned {
					t.Fatalf("plan.yml's comment on exit %d: %q", c.code, r.Comments)
				}
			}
		})
	}
}

// pullRequestRepo is a repository as plan.yml finds it: the base branch with ghcrsync.hcl and
// the credential file, and a pull request's head (its SHA) on the remote changing the file.
func pullRequestRepo(t *testing.T) (origin, prSHA string) {
	t.Helper()

	return repoWithPullRequest(t, map[string]string{"ghcrsync.hcl": "# the configuration\n",
		"clusters/prod/ghcr-secret.enc.yaml": "# the base branch's\n"}, map[string]string{"clusters/prod/ghcr-secret.enc.yaml": "# the pull request's\n"})
}

// clone is a fresh workspace of the base branch, as a job's checkout leaves it.
func clone(t *testing.T, origin string) string {
	t.Helper()

	dir := t.TempDir()
	actions.Git(t, dir, "clone", "-q", origin, ".")

	return dir
}

// readDoc is a file of the repository, by its path from the root.
func readDoc(t *testing.T, path string) string {
	t.Helper()

	return readFile(t, filepath.Join("..", "..", path))
}

// The install downloads the fork's release and checks its attestation: an archive the fork's
// release workflow attested installs; one it did not (a release edited after the fact, with
// SHA256SUMS and the pin edited to match) fails the job at the download, before it runs; with
// GHCRSYNC_ATTESTATION=none (a private fork without attestations) the pin alone decides.
func TestDownloadChecksTheAttestation(t *testing.T) {
	origin, prSHA := pullRequestRepo(t)

	for _, c := range []struct {
		name, attestedBy, mode string
		fails                  bool
	}{
		{"attested by the fork's release workflow", "acme/ghcrsync", "required", false},
		{"attested by another repository's workflow", "mallory/ghcrsync", "required", true},
		{"not attested", "", "required", true},
		{"not attested, attestations off", "", "none", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			gh, pin := actions.Publish(t, stubGhcrsync, c.attestedBy)

			r := actions.New(t, clone(t, origin), gh+":"+os.Getenv("PATH"), append(os.Environ(), "HOME="+t.TempDir(), "STUB_LOG="+filepath.Join(t.TempDir(), "calls")),
				actions.Contexts("kubeconfig", "talosconfig", "age-key", prSHA))
			r.Pinned = map[string]string{"GHCRSYNC_SHA256": pin, "GHCRSYNC_ATTESTATION": c.mode}

			trace := r.Run("../../docs/workflows/validate.yml")

			switch {
			case c.fails && (!r.Failed || !slices.Contains(trace, "Download ghcrsync: exit 1") || !strings.Contains(r.Log.String(), "no attestation")):
				t.Fatalf("the job did not fail at the download: %v\n%s", trace, r.Log.String())
			case !c.fails && (r.Failed || !slices.Contains(trace, "Valid: exit 0")):
				t.Fatalf("the job failed: %v\n%s", trace, r.Log.String())
			}
		})
	}
}

// plan.yml takes every SOPS file the base's configuration reads from the pull request, and
// nothing else: a tenant's file the pull request changes is planned as it has it, while its
// ghcrsync.hcl and any other file stay the base's, and the comment says the plan was made with
// the base's configuration. The control: a pull request that leaves ghcrsync.hcl alone gets
// no such note.
func TestPlanTakesEveryInputFromThePullRequest(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("plan.yml's comment step is played with node (install nodejs)")
	}

	archive, content, pin := actions.ReleaseArchive(t, stubGhcrsync)
	base := map[string]string{"ghcrsync.hcl": "# base\n", "README.md": "base\n",
		"clusters/prod/ghcr-secret.enc.yaml": "cluster: base\n", "clusters/prod/team-a.enc.yaml": "team-a: base\n"}

	for _, c := range []struct {
		name    string
		changes map[string]string
		note    bool
	}{
		{"a tenant's file and the configuration", map[string]string{"clusters/prod/team-a.enc.yaml": "team-a: pr\n", "ghcrsync.hcl": "# pr\n", "README.md": "pr\n"}, true},
		{"a tenant's file alone", map[string]string{"clusters/prod/team-a.enc.yaml": "team-a: pr\n"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			origin, prSHA := repoWithPullRequest(t, base, c.changes)

			r := actions.New(t, clone(t, origin), os.Getenv("PATH"), append(os.Environ(), "HOME="+t.TempDir(), "STUB_LOG="+filepath.Join(t.TempDir(), "calls"),
				"STUB_CODES=plan --detailed-exitcode=2", "STUB_INPUTS=clusters/prod/ghcr-secret.enc.yaml clusters/prod/team-a.enc.yaml"),
				actions.Contexts("kubeconfig", "talosconfig", "age-key", prSHA))
			r.Pinned, r.CacheSeed = map[string]string{"GHCRSYNC_SHA256": pin}, map[string][]byte{archive: content}

			if trace := r.Run("../../docs/workflows/plan.yml"); r.Failed {
				t.Fatalf("plan.yml: %v\n%s", trace, r.Log.String())
			}

			want := map[string]string{"ghcrsync.hcl": base["ghcrsync.hcl"], "README.md": base["README.md"],
				"clusters/prod/ghcr-secret.enc.yaml": base["clusters/prod/ghcr-secret.enc.yaml"], "clusters/prod/team-a.enc.yaml": "team-a: pr\n"}
			for f, w := range want {
				if got, _ := os.ReadFile(filepath.Join(r.Workspace, f)); string(got) != w {
					t.Errorf("the plan's %s is %q, want %q", f, got, w)
				}
			}

			if len(r.Comments) != 1 || strings.Contains(r.Comments[0], "Planned with the base branch's `ghcrsync.hcl`") != c.note ||
				!strings.HasPrefix(r.Comments[0], "<!-- ghcrsync-plan cluster=stub -->\n") {
				t.Fatalf("the comment (a note wanted: %v): %q", c.note, r.Comments)
			}
		})
	}
}

// repoWithPullRequest is a remote whose main holds base and whose refs/pull/1/head changes it;
// it returns the remote and the pull request's head.
func repoWithPullRequest(t *testing.T, base, changes map[string]string) (origin, sha string) {
	t.Helper()

	origin, ws := t.TempDir(), t.TempDir()
	git := func(args ...string) string { return actions.Git(t, ws, args...) }
	write := func(files map[string]string) {
		for f, content := range files {
			_ = os.MkdirAll(filepath.Dir(filepath.Join(ws, f)), 0o700)
			_ = os.WriteFile(filepath.Join(ws, f), []byte(content), 0o600)
		}
	}

	git("init", "--bare", "-q", origin)
	git("init", "-q")
	write(base)
	git("add", "-A")
	git("commit", "-qm", "base")
	git("remote", "add", "origin", origin)
	git("push", "-q", "origin", "HEAD:main")
	write(changes)
	git("commit", "-qam", "the pull request")
	sha = git("rev-parse", "HEAD")
	git("push", "-q", "origin", "HEAD:refs/pull/1/head")

	return origin, sha
}
