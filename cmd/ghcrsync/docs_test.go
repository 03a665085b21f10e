package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag of every command is in the README's synopsis (the first code block), on the
// command's own line — or, for the connection and output flags every command shares, in the
// "everywhere" line: a flag added without documenting it fails here.
func TestReadmeSynopsisNamesEveryFlag(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}

	readme := string(b)
	start := strings.Index(readme, "```sh\nghcrsync plan")
	end := strings.Index(readme[start+5:], "```")

	if start < 0 || end < 0 {
		t.Fatal("README.md has no synopsis block starting with ghcrsync plan")
	}

	synopsis := strings.Split(readme[start:start+5+end], "\n")

	line := func(prefix string) string {
		for _, l := range synopsis {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}

		return ""
	}

	everywhere := line("# everywhere:")

	var missing []string

	root := newRoot()
	for _, cmd := range root.Commands() {
		if cmd.Hidden || cmd.Name() == "help" || cmd.Name() == "completion" {
			continue
		}

		name := cmd.Name()

		// A synopsis line may wrap: its continuation lines are indented.
		own := line("ghcrsync " + name)
		for i, l := range synopsis {
			if strings.HasPrefix(l, "ghcrsync "+name+" ") {
				for _, more := range synopsis[i+1:] {
					if !strings.HasPrefix(more, "  ") {
						break
					}

					own += more
				}
			}
		}

		for _, c := range append([]*cobra.Command{cmd}, cmd.Commands()...) {
			if own == "" {
				missing = append(missing, "ghcrsync "+name+" (no synopsis line)")

				continue
			}

			c.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if f.Hidden || f.Name == "help" {
					return
				}

				if !strings.Contains(own, "--"+f.Name) && !strings.Contains(everywhere, "--"+f.Name) {
					missing = append(missing, c.CommandPath()+" --"+f.Name)
				}
			})
		}
	}

	sort.Strings(missing)

	if len(missing) > 0 {
		t.Fatalf("README.md's synopsis does not name:\n  %s", strings.Join(missing, "\n  "))
	}
}

// README.md's one-line list of exit codes and docs/ci.md's table name the same codes: one of
// them drifting (a code added to the table only, as 6 nearly was) fails here.
func TestReadmeExitCodesAreCIsTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}

	ci, err := os.ReadFile("../../docs/ci.md")
	if err != nil {
		t.Fatal(err)
	}

	list := regexp.MustCompile(`(?s)the exit codes are one table \((.*?)\) in`).FindSubmatch(readme)
	if list == nil {
		t.Fatal("README.md has no list of exit codes (\"the exit codes are one table (…) in\")")
	}

	var fromReadme []string

	for _, m := range regexp.MustCompile(`(\d+)(?:/(\d+))?`).FindAllStringSubmatch(string(list[1]), -1) {
		fromReadme = append(fromReadme, m[1])
		if m[2] != "" {
			fromReadme = append(fromReadme, m[2])
		}
	}

	var fromTable []string

	for _, m := range regexp.MustCompile(`(?m)^\| (\d+)(?: / (\d+))? \|`).FindAllStringSubmatch(string(ci), -1) {
		fromTable = append(fromTable, m[1])
		if m[2] != "" {
			fromTable = append(fromTable, m[2])
		}
	}

	slices.Sort(fromReadme)
	slices.Sort(fromTable)

	if len(fromTable) == 0 || !slices.Equal(fromReadme, fromTable) {
		t.Fatalf("README.md lists exit codes %v, docs/ci.md's table %v", fromReadme, fromTable)
	}
}

// The pairs a team reads side by side say the same thing (issue 42's contradictions), each
// checked where it can be: a side changed alone fails here, naming the pair.
func TestDocsPairsAgree(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", p))
		if err != nil {
			t.Fatal(err)
		}

		return string(b)
	}

	t.Run("one_sops_file_name", func(t *testing.T) {
		// The production example's SOPS file is the one every doc and workflow names.
		want := regexp.MustCompile(`sops_file\s*=\s*"([^"]+)"`).FindStringSubmatch(read("config/examples/production.hcl"))[1]
		named := regexp.MustCompile(`clusters/[\w./-]+\.(?:enc|sops)\.ya?ml`)

		files, _ := filepath.Glob("../../docs/*.md")
		more, _ := filepath.Glob("../../docs/workflows/*.yml")

		for _, f := range append(append(files, more...), "../../README.md") {
			rel := strings.TrimPrefix(f, "../../")
			for _, m := range named.FindAllString(read(rel), -1) {
				if m != want {
					t.Errorf("%s names the SOPS file %s; config/examples/production.hcl and the workflows name %s", rel, m, want)
				}
			}
		}
	})

	t.Run("image_is_the_one_release_publishes", func(t *testing.T) {
		// release.yml copies make release's image archive to GHCRSYNC_IMAGE:VERSION; the README
		// names that image (the example variable, at the version the workflows pin), and the Job
		// and CronJob run it.
		wf := read("docs/workflows/release.yml")
		if !strings.Contains(wf, `"oci-archive:dist/ghcrsync_${VERSION}_image.oci.tar" "docker://$IMAGE:$VERSION"`) ||
			!strings.Contains(read("scripts/release.sh"), "ghcrsync-release") {
			t.Fatal("release.yml does not copy make release's image archive to $IMAGE:$VERSION")
		}

		example := regexp.MustCompile("GHCRSYNC_IMAGE` is set\\s+\\(`(\\S+)`\\)").FindStringSubmatch(read("docs/release.md"))
		version := regexp.MustCompile(`GHCRSYNC_VERSION:\s*(v\S+)`).FindStringSubmatch(read("docs/workflows/apply.yml"))

		if example == nil || version == nil {
			t.Fatal("docs/release.md names no example GHCRSYNC_IMAGE, or apply.yml pins no GHCRSYNC_VERSION")
		}

		image := example[1] + ":" + version[1]
		for _, f := range []string{"README.md", "docs/deploy/job.yaml", "docs/deploy/cronjob.yaml"} {
			if !strings.Contains(read(f), image) {
				t.Errorf("%s does not name %s, the image release.yml publishes at the pinned version", f, image)
			}
		}
	})

	t.Run("detailed_exitcode_2", func(t *testing.T) {
		// 2 means changes or an old credential still in use, in both.
		for _, f := range []string{"README.md", "docs/ci.md"} {
			if !regexp.MustCompile(`(?s)2.{0,40}changes.{0,30}or.{0,60}(old\s+credential\s+still\s+in\s+use|still\s+uses\s+the\s+old\s+credential)`).MatchString(read(f)) {
				t.Errorf("%s does not say that plan --detailed-exitcode's 2 also means an old credential still in use", f)
			}
		}
	})

	t.Run("links_stay_in_the_repository", func(t *testing.T) {
		// A relative link or path in the docs resolves inside the repository (a clone has no
		// ../shared).
		link := regexp.MustCompile(`\]\(([^)#\s]+)(?:#[^)]*)?\)`)
		files, _ := filepath.Glob("../../docs/*.md")

		for _, f := range append(files, "../../README.md") {
			text := read(strings.TrimPrefix(f, "../../"))
			if strings.Contains(text, "../shared") {
				t.Errorf("%s points outside the repository (../shared)", f)
			}

			for _, m := range link.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}

				p := filepath.Clean(filepath.Join(filepath.Dir(f), target))
				if !strings.HasPrefix(p, filepath.Clean("../..")+string(filepath.Separator)) && p != filepath.Clean("../..") {
					t.Errorf("%s links %s, outside the repository", f, target)
				} else if _, err := os.Stat(p); err != nil {
					t.Errorf("%s links %s, which does not exist", f, target)
				}
			}
		}
	})
}

// What the docs name of the workflows is what the workflows are: one ghcrsync version
// everywhere it is pinned or shown (the workflows' GHCRSYNC_VERSION, the install, the image
// tags, the release commands); the environments the quickstart says to make are the workflows'
// own; the required check's name is validate.yml's workflow and job. A doc changed alone (as
// release.md's v0.4.0 against the workflows' v0.3.0 was) fails here, naming it.
func TestDocsNameWhatTheWorkflowsDo(t *testing.T) {
	root := filepath.Join("..", "..")

	var files []string
	for _, glob := range []string{"*.md", "docs/*.md", "docs/deploy/*.yaml", "docs/workflows/*.yml", "config/examples/*.hcl"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		files = append(files, m...)
	}

	pin := regexp.MustCompile(`GHCRSYNC_VERSION:\s*(v\S+)`).FindStringSubmatch(readFile(t, filepath.Join(root, "docs/workflows/apply.yml")))
	if pin == nil {
		t.Fatal("apply.yml pins no GHCRSYNC_VERSION")
	}

	versions := regexp.MustCompile(`GHCRSYNC_VERSION[:=]\s*(v[0-9][^\s"']*)|ghcrsync:(v[0-9][^\s"'` + "`" + `]*)|ghcrsync (v[0-9]+\.[0-9]+\.[0-9]+)|VERSION=(v[0-9][^\s"']*)|git tag -s (v[0-9]\S*)`)

	for _, f := range files {
		text := readFile(t, f)
		for _, m := range versions.FindAllStringSubmatch(text, -1) {
			for _, v := range m[1:] {
				if v != "" && v != pin[1] {
					t.Errorf("%s names ghcrsync %s (%q), the workflows pin %s", strings.TrimPrefix(f, root+"/"), v, m[0], pin[1])
				}
			}
		}
	}

	// The environments.
	var envs []string
	for _, f := range files {
		if strings.Contains(f, "docs/workflows/") {
			for _, m := range regexp.MustCompile(`(?m)^\s+environment:\s*(\S+)`).FindAllStringSubmatch(readFile(t, f), -1) {
				if !slices.Contains(envs, m[1]) {
					envs = append(envs, m[1])
				}
			}
		}
	}

	quick := readFile(t, filepath.Join(root, "docs/quickstart.md"))
	for _, e := range envs {
		if !strings.Contains(quick, "`"+e+"`") {
			t.Errorf("docs/quickstart.md does not name the environment %s a shipped workflow runs in", e)
		}
	}

	// The required check: "WORKFLOW NAME / JOB ID" of validate.yml, wherever the docs name it.
	validate := readFile(t, filepath.Join(root, "docs/workflows/validate.yml"))
	name := regexp.MustCompile(`(?m)^name:\s*(.+)$`).FindStringSubmatch(validate)
	job := regexp.MustCompile(`(?m)^jobs:\n  ([a-z-]+):`).FindStringSubmatch(validate)

	if name == nil || job == nil {
		t.Fatal("validate.yml has no name or no job")
	}

	check := name[1] + " / " + job[1]

	for _, f := range files {
		for _, m := range regexp.MustCompile(`"(ghcrsync [a-z]+ / [a-z-]+)"`).FindAllStringSubmatch(readFile(t, f), -1) {
			if m[1] != check {
				t.Errorf("%s names the required check %q; validate.yml reports %q", strings.TrimPrefix(f, root+"/"), m[1], check)
			}
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	return string(b)
}

// docs/parity.md names ghcrsync's tests for each of the predecessor's scenarios: every one it
// names (outside the predecessor's own column) is a test of this repository, so a test renamed
// or removed fails here instead of leaving the page pointing at nothing. The control: a name
// that exists nowhere is found.
func TestParityNamesRealTests(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "parity.md"))
	if err != nil {
		t.Fatal(err)
	}

	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(`)

	err = filepath.WalkDir(filepath.Join("..", ".."), func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == ".git" || d.Name() == "bin"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, "_test.go"):
			return nil
		}

		b, err := os.ReadFile(path)
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}

		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	missing := func(text string) []string {
		var out []string

		for _, m := range regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(text, -1) {
			if !defined[m[1]] {
				out = append(out, m[1])
			}
		}

		return out
	}

	var ours strings.Builder

	for _, line := range strings.Split(string(page), "\n") {
		cells := strings.Split(line, " | ")
		if strings.HasPrefix(line, "| `Test") && len(cells) > 2 { // the predecessor's test, then ghcrsync's
			line = strings.Join(cells[2:], " | ")
		}

		ours.WriteString(line + "\n")
	}

	if m := missing(ours.String()); len(m) > 0 {
		t.Errorf("docs/parity.md names tests this repository does not have: %v", m)
	}

	if m := missing("`TestNoSuchTestAnywhere`"); len(m) != 1 {
		t.Errorf("the check finds no unknown name: %v", m)
	}
}
