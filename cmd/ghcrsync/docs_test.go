package main

import (
	"os"
	"path/filepath"
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
		if name == "destroy" { // release's alias, on its line
			name = "release"
		}

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
