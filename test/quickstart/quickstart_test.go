// Package quickstart plays docs/quickstart.md as a new team would: its command blocks, in
// order, in one shell, with the real tools the reader has (git, make and Go for the install,
// the sops CLI, kubectl, talosctl) against the sandbox. The test substitutes only what the
// sandbox must: its kubeconfig and talosconfig (the reader's admin ones), its registry's
// account and token, a local age key, and a local fork with the tag the quickstart installs.
// A block the test does not run is marked in the file, with why:
//
//	<!-- not run by test/quickstart: WHY -->
//
// on the line before its fence. The same holds for README.md's Install and Set-up blocks.
package quickstart

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/actions"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// notRunMarker marks a block the test does not run; what follows it is why.
const notRunMarker = "<!-- not run by test/quickstart: "

// block is one fenced code block of a Markdown file.
type block struct {
	file    string
	line    int    // the fence's line
	section string // the ## heading it is under
	lang    string
	text    string
	notRun  string // why the test does not run it ("" when it does)
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// blocksOf reads every fenced block of the Markdown text.
func blocksOf(t *testing.T, file, text string) []block {
	t.Helper()

	var (
		out     []block
		cur     *block
		section string
		prev    string
	)

	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()

		switch {
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case strings.HasPrefix(line, "```"):
			cur = &block{file: file, line: n, section: section, lang: strings.TrimPrefix(line, "```")}
			if why, ok := strings.CutPrefix(prev, notRunMarker); ok {
				cur.notRun = strings.TrimSuffix(why, " -->")
			}
		case strings.HasPrefix(line, "## "):
			section = strings.TrimPrefix(line, "## ")
		}

		prev = line
	}

	if cur != nil {
		t.Fatalf("%s:%d: a fence that never closes", file, cur.line)
	}

	return out
}

// readRepo is a file of the repository.
func readRepo(t *testing.T, path string) string {
	t.Helper()

	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}

	return string(b)
}

// quickstartBlocks are docs/quickstart.md's blocks, and README.md's Install and Set-up ones.
func quickstartBlocks(t *testing.T, doc string) (quick, readme []block) {
	t.Helper()

	for _, b := range blocksOf(t, "README.md", readRepo(t, "README.md")) {
		if b.section == "Install" || b.section == "Set-up" {
			readme = append(readme, b)
		}
	}

	return blocksOf(t, "docs/quickstart.md", doc), readme
}

// fileName is the file a yaml block is written to: its first line names it ("# .sops.yaml").
func fileName(b block) string {
	first, _, _ := strings.Cut(b.text, "\n")
	if name, ok := strings.CutPrefix(first, "# "); ok && !strings.Contains(name, " ") {
		return name
	}

	return ""
}

// Every block of the quickstart and of README.md's Install and Set-up is one the test runs — a
// sh block, or a yaml block naming its file — or is marked as not run, with why. README's
// Install block is the quickstart's step 1 word for word (the test runs it there).
func TestEveryQuickstartBlockIsRunOrMarked(t *testing.T) {
	quick, readme := quickstartBlocks(t, readRepo(t, "docs/quickstart.md"))
	if len(quick) == 0 || len(readme) == 0 {
		t.Fatalf("no blocks: %d in the quickstart, %d in README.md's Install and Set-up", len(quick), len(readme))
	}

	for _, b := range append(slices.Clone(quick), readme...) {
		switch {
		case b.notRun != "":
			if len(strings.Fields(b.notRun)) < 4 {
				t.Errorf("%s: marked as not run without a reason: %q", b.where(), b.notRun)
			}
		case b.lang == "sh", b.lang == "yaml" && fileName(b) != "":
		default:
			t.Errorf("%s: a %q block the test cannot run, and not marked %q…", b.where(), b.lang, notRunMarker)
		}
	}

	step1 := ""

	for _, b := range quick {
		if strings.HasPrefix(b.section, "1. ") && b.notRun == "" {
			step1 = b.text
		}
	}

	for _, b := range readme {
		if b.section == "Install" && b.notRun == "" && b.text != step1 {
			t.Errorf("%s: README.md's install block is not the quickstart's step 1, which the test runs:\n%s\nvs\n%s", b.where(), b.text, step1)
		}
	}
}

// substitution is a text of the quickstart the sandbox must replace, and why.
type substitution struct{ old, new, why string }

// script is the quickstart's runnable blocks, in order, as one shell session: a yaml block is
// written to the file its first line names; each block is announced on stderr.
func script(t *testing.T, blocks []block, subs []substitution) string {
	t.Helper()

	var b strings.Builder

	b.WriteString("set -eo pipefail\n")

	for i, bl := range blocks {
		if bl.notRun != "" {
			continue
		}

		fmt.Fprintf(&b, "echo '::quickstart:: block %d (%s)' >&2\n", i, bl.where())

		switch bl.lang {
		case "sh":
			b.WriteString(bl.text)
		case "yaml":
			fmt.Fprintf(&b, "cat > %s <<'QUICKSTART_FILE'\n%sQUICKSTART_FILE\n", fileName(bl), bl.text)
		}
	}

	s := b.String()

	for _, sub := range subs {
		if !strings.Contains(s, sub.old) {
			t.Fatalf("the quickstart no longer says %q, which the test replaces (%s)", sub.old, sub.why)
		}

		s = strings.ReplaceAll(s, sub.old, sub.new)
	}

	return s
}

// tools is the directory of the operator's kubectl and sops (make tools).
func tools(t *testing.T) string {
	t.Helper()

	dir := os.Getenv("GHCRSYNC_TOOLS")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "ghcrsync", "tools", "operator-kubectl-v1.37.2-sops-v3.13.3")
	}

	for _, tool := range []string{"kubectl", "sops"} {
		if _, err := os.Stat(filepath.Join(dir, tool)); err != nil {
			t.Skipf("the quickstart runs the real %s: make tools (%v)", tool, err)
		}
	}

	return dir
}

// reader is the shell a reader runs the quickstart in: a home of its own, the tools on PATH
// (no ghcrsync: the quickstart installs it), Go's caches, nothing of this process's
// configuration (no KUBECONFIG, TALOSCONFIG, SOPS_*, GHCRSYNC_*) but what the test sets.
type reader struct {
	t        *testing.T
	dir      string // the fleet repository, where the reader works
	home     string
	env      []string
	secrets  []string // never to appear in the output
	stdin    string
	output   string
	exitCode int
}

func newReader(t *testing.T, path ...string) *reader {
	t.Helper()

	home, dir := t.TempDir(), t.TempDir()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go")
	}

	r := &reader{t: t, dir: dir, home: home}
	dirs := append([]string{filepath.Join(home, ".local", "bin")}, path...)
	dirs = append(dirs, filepath.Dir(goBin), "/usr/local/bin", "/usr/bin", "/bin")

	r.env = append(hostEnv(t, home), "PATH="+strings.Join(dirs, ":"))

	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "ghcrsync")); err == nil {
			t.Fatalf("ghcrsync is already on the reader's PATH (%s): the quickstart must install it", d)
		}
	}

	return r
}

// hostEnv is the environment of a shell or a runner of this machine that is not this test's:
// a home of its own, no configuration of this process (PATH, KUBECONFIG, TALOSCONFIG,
// XDG_CONFIG_HOME, SOPS_*, GHCRSYNC_*), and this machine's Go caches (a new home would move them).
func hostEnv(t *testing.T, home string) []string {
	t.Helper()

	var env []string

	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "PATH" || k == "KUBECONFIG" || k == "TALOSCONFIG" || k == "XDG_CONFIG_HOME" ||
			strings.HasPrefix(k, "SOPS_") || strings.HasPrefix(k, "GHCRSYNC_") {
			continue
		}

		env = append(env, kv)
	}

	env = append(env, "HOME="+home)

	for _, v := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		out, _ := exec.Command("go", "env", v).Output()
		env = append(env, v+"="+strings.TrimSpace(string(out)))
	}

	return env
}

// run runs the script in the reader's shell.
func (r *reader) run(ctx context.Context, s string) {
	c := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-c", s)
	c.Dir, c.Env, c.Stdin = r.dir, r.env, strings.NewReader(r.stdin)

	out, _ := c.CombinedOutput()
	r.output, r.exitCode = string(out), c.ProcessState.ExitCode()

	for _, secret := range r.secrets {
		if secret != "" && strings.Contains(r.output, secret) {
			r.t.Fatalf("a secret appeared in the quickstart's output (not shown)")
		}
	}
}

// fork is a local stand-in for the reader's fork of ghcrsync: this repository's commit, with
// the tag the quickstart installs.
func fork(t *testing.T, tag string) string {
	t.Helper()

	dir := filepath.Join(t.TempDir(), "ghcrsync.git")
	actions.Git(t, ".", "clone", "-q", "--bare", "../..", dir)
	actions.Git(t, dir, "tag", "-f", tag, "HEAD")

	return "file://" + dir
}

// recipient is the age public key of an identity file ("# public key: age1…").
func recipient(t *testing.T, identity string) string {
	t.Helper()

	m := regexp.MustCompile(`(?m)^# public key: (age1[0-9a-z]+)$`).FindStringSubmatch(identity)
	if m == nil {
		t.Fatal("the age identity names no public key")
	}

	return m[1]
}

// The quickstart, steps 1 to 7, as written, on the sandbox: the install builds the fork's tag;
// the SOPS step encrypts the token read from the terminal with the repository's .sops.yaml;
// validate passes; the identities and the CI talosconfig are made with kubectl and talosctl;
// plan, show and apply run with them; apply ends safe to revoke, every node holding the
// token the reader typed, and neither the token nor the age key ever shows.
func TestQuickstartOnTheSandbox(t *testing.T) {
	toolDir := tools(t)
	talosctl := sandboxtest.NewTalosctl(t, "")

	sb := sandboxtest.Start(t, sandbox.Options{ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: 2 * time.Second})

	r := newReader(t, toolDir, filepath.Dir(talosctl.Bin))
	cred := sb.NewCredential()
	identity, err := os.ReadFile(sb.Path(sandbox.AgeKeyFile))
	if err != nil {
		t.Fatal(err)
	}

	// What the reader has before the quickstart: an admin kubeconfig (kubectl's current
	// context) and talosconfig, an age identity where sops looks for it, and ghcrsync.hcl
	// (step 3 starts from an example; the sandbox's names its registry, probe and fleet).
	copyFile(t, sb.Path(sandbox.KubeconfigFile), filepath.Join(r.dir, "admin.kubeconfig"))
	copyFile(t, sb.Path(sandbox.TalosconfigOperatorFile), filepath.Join(r.dir, "admin.talosconfig"))
	copyFile(t, sb.Path(sandbox.AgeKeyFile), filepath.Join(r.home, ".config", "sops", "age", "keys.txt"))
	writeConfig(t, sb, filepath.Join(r.dir, "ghcrsync.hcl"))
	r.env = append(r.env, "KUBECONFIG="+filepath.Join(r.dir, "admin.kubeconfig"))
	r.stdin = cred.Password + "\n" // typed at the token prompt
	r.secrets = []string{cred.Password, secretKey(t, string(identity))}

	quick, _ := quickstartBlocks(t, readRepo(t, "docs/quickstart.md"))
	s := script(t, quick, []substitution{
		{"https://github.com/acme/ghcrsync.git", fork(t, "v0.3.0"), "the reader's fork, with the tag"},
		{"age1...your-recipient...", recipient(t, string(identity)), "the reader's age recipient"},
		{"ghcrsync-bot", cred.Username, "the token's account"},
	})

	// Step 2 alone, for the next rotation's token.
	step2 := func(user string) string {
		return script(t, section(quick, "2. "), []substitution{
			{"age1...your-recipient...", recipient(t, string(identity)), "the reader's age recipient"},
			{"ghcrsync-bot", user, "the token's account"},
		})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()

	r.run(ctx, s)

	if r.exitCode != 0 {
		t.Fatalf("the quickstart failed (exit %d) at the last block announced:\n%s", r.exitCode, r.output)
	}

	t.Logf("the quickstart's output:\n%s", r.output)

	// Step 7's verdict, as the quickstart quotes it ("…" stands for the part that varies), is
	// apply's last line; step 1's version is the tag installed.
	verdict := regexp.MustCompile("Exit 0 and the last line `([^`]+)`").FindStringSubmatch(readRepo(t, "docs/quickstart.md"))
	if verdict == nil {
		t.Fatal("the quickstart's step 7 no longer quotes the verdict (\"Exit 0 and the last line `…`\")")
	}

	lines := strings.Split(strings.TrimSpace(r.output), "\n")
	last := lines[len(lines)-1]

	for _, part := range strings.Split(verdict[1], "…") {
		if !strings.Contains(last, strings.TrimSpace(part)) {
			t.Fatalf("apply's last line is not the verdict the quickstart quotes (%q):\n%s", verdict[1], last)
		}
	}

	if !strings.Contains(r.output, "ghcrsync v0.3.0") {
		t.Fatal("ghcrsync version did not print the tag installed, v0.3.0")
	}

	enc, err := os.ReadFile(filepath.Join(r.dir, "clusters", "prod", "ghcr-secret.enc.yaml"))
	if err != nil || !strings.Contains(string(enc), "ENC[AES256_GCM,") || !strings.Contains(string(enc), recipient(t, string(identity))) {
		t.Fatalf("the SOPS file is not encrypted for the recipient: %v", err)
	}

	if _, err := os.Stat(filepath.Join(r.dir, "secret.yaml")); !os.IsNotExist(err) {
		t.Fatalf("the plain secret.yaml is still there (%v)", err)
	}

	for _, m := range sb.Fleet().Machines() {
		if got := m.Configured(); got != cred {
			t.Fatalf("%s holds %q after the quickstart, want the token typed (%q)", m.Name, got.Username, cred.Username)
		}
	}

	// Step 8: the pipeline, in docs/ci.md's order; its last pull request is a rotation.
	playAdoption(t, sb, r, step2, identity)

	for _, m := range sb.Fleet().Machines() {
		if got := m.Configured(); got != sb.NewCredential() {
			t.Fatalf("%s holds %q after the pipeline's rotation, want %q", m.Name, got.Username, sb.NewCredential().Username)
		}
	}
}

// section is the blocks under the ## heading that starts with prefix ("2. ").
func section(blocks []block, prefix string) []block {
	var out []block

	for _, b := range blocks {
		if strings.HasPrefix(b.section, prefix) {
			out = append(out, b)
		}
	}

	return out
}

// The SOPS step's control: with the line the quickstart had (`sops --encrypt secret.yaml`), sops
// matches .sops.yaml's path_regex against secret.yaml, finds no rule and fails; as written now
// it encrypts. Both run the quickstart's step 2 blocks alone, with the real sops.
func TestQuickstartSopsStepControl(t *testing.T) {
	toolDir := tools(t)
	doc := readRepo(t, "docs/quickstart.md")
	old := strings.Replace(doc, "sops --encrypt --filename-override clusters/prod/ghcr-secret.enc.yaml secret.yaml >", "sops --encrypt secret.yaml >", 1)

	if old == doc {
		t.Fatal("the quickstart's sops line changed: update this control")
	}

	for _, c := range []struct {
		name, doc string
		fails     bool
	}{
		{"as written", doc, false},
		{"the sops line put back", old, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			quick, _ := quickstartBlocks(t, c.doc)
			step2 := section(quick, "2. ")

			r := newReader(t, toolDir)
			r.stdin = "ghp_not-a-real-token\n"
			r.secrets = []string{"ghp_not-a-real-token"}
			r.run(t.Context(), script(t, step2, []substitution{
				{"age1...your-recipient...", "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p", "an age recipient"},
			}))

			failed := r.exitCode != 0
			if failed != c.fails || (c.fails && !strings.Contains(r.output, "no matching creation rules found")) {
				t.Fatalf("exit %d, want a failure: %v\n%s", r.exitCode, c.fails, r.output)
			}

			enc, _ := os.ReadFile(filepath.Join(r.dir, "clusters", "prod", "ghcr-secret.enc.yaml"))
			if encrypted := strings.Contains(string(enc), "ENC[AES256_GCM,"); encrypted == c.fails {
				t.Fatalf("the SOPS file encrypted: %v, want %v", encrypted, !c.fails)
			}
		})
	}
}

// writeConfig is the sandbox's configuration as the reader's repository keeps it: the SOPS file
// at the quickstart's path, no kubeconfig or talosconfig named (every command is given them).
func writeConfig(t *testing.T, sb *sandbox.Sandbox, path string) {
	t.Helper()

	b, err := os.ReadFile(sb.Path(sandbox.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	s := string(b)
	for _, sub := range [][2]string{
		{`sops_file = "secret.enc.yaml"`, `sops_file = "clusters/prod/ghcr-secret.enc.yaml"`},
		{`kubeconfig = "kubeconfig"`, ``},
		{`talosconfig = "talosconfig"`, ``},
	} {
		if !strings.Contains(s, sub[0]) {
			t.Fatalf("the sandbox's ghcrsync.hcl no longer says %q", sub[0])
		}

		s = strings.Replace(s, sub[0], sub[1], 1)
	}

	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()

	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}

	writeFile(t, to, string(b))
}

// secretKey is the AGE-SECRET-KEY line of an identity file.
func secretKey(t *testing.T, identity string) string {
	t.Helper()

	for _, line := range strings.Split(identity, "\n") {
		if strings.HasPrefix(line, "AGE-SECRET-KEY-") {
			return line
		}
	}

	t.Fatal("the age identity holds no secret key")

	return ""
}
