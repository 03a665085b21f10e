// Package usage checks that a command tree's flag help renders as written.
package usage

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var spans = regexp.MustCompile("`([^`]*)`")

// Garbled reports whether pflag would render f's usage other than as written: it takes a
// back-quoted span of a usage as the value's name (`--autoscaler make cluster-autoscaler`), so a
// back-quoted span must be one word, meant as that name.
func Garbled(f *pflag.Flag) bool {
	for _, m := range spans.FindAllStringSubmatch(f.Usage, -1) {
		if strings.ContainsAny(m[1], " \t") {
			return true
		}
	}

	return false
}

// Problems lists every flag of root and its subcommands whose help is Garbled, as it renders.
func Problems(root *cobra.Command) []string {
	var out []string

	var walk func(c *cobra.Command)

	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if Garbled(f) {
					name, _ := pflag.UnquoteUsage(f)
					out = append(out, fmt.Sprintf("%s --%s renders as %q: its usage back-quotes more than a value's name: %q",
						c.CommandPath(), f.Name, "--"+f.Name+" "+name, f.Usage))
				}
			})
		}

		for _, sub := range c.Commands() {
			walk(sub)
		}
	}

	walk(root)

	return out
}
