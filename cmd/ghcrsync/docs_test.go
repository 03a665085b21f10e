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
