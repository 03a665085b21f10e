package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag's help renders as written: pflag takes a back-quoted span of a usage as the
// value's name (`--autoscaler make cluster-autoscaler`), so a back-quoted span must be one word,
// meant as that name. The negative control: a usage with a back-quoted command is caught.
func TestFlagUsagesRenderAsWritten(t *testing.T) {
	spans := regexp.MustCompile("`([^`]*)`")
	bad := func(f *pflag.Flag) bool {
		for _, m := range spans.FindAllStringSubmatch(f.Usage, -1) {
			if strings.ContainsAny(m[1], " \t") {
				return true
			}
		}

		return false
	}

	if !bad(&pflag.Flag{Usage: "build it with `make cluster-autoscaler`"}) {
		t.Fatal("the check misses a back-quoted command")
	}

	var walk func(c *cobra.Command)

	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if bad(f) {
					name, _ := pflag.UnquoteUsage(f)
					t.Errorf("%s --%s renders as %q: its usage back-quotes more than a value's name: %q", c.CommandPath(), f.Name, "--"+f.Name+" "+name, f.Usage)
				}
			})
		}

		for _, sub := range c.Commands() {
			walk(sub)
		}
	}

	walk(newRoot())
}
