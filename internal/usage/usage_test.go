package usage

import (
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func TestGarbled(t *testing.T) {
	for _, tc := range []struct {
		name, usage string
		want        bool
	}{
		{"a back-quoted command", "build it with `make cluster-autoscaler`", true},
		{"a back-quoted value name", "the `file` to read", false},
		{"no back quotes", "build it with: make cluster-autoscaler", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Garbled(&pflag.Flag{Usage: tc.usage}); got != tc.want {
				t.Fatalf("Garbled(%q) = %t, want %t", tc.usage, got, tc.want)
			}
		})
	}
}

// The walk reaches a subcommand's flags (the negative control of the commands' own tests).
func TestProblemsWalksSubcommands(t *testing.T) {
	root, sub := &cobra.Command{Use: "root"}, &cobra.Command{Use: "up"}
	sub.Flags().String("autoscaler", "sim", "build it with `make cluster-autoscaler`")
	root.AddCommand(sub)

	if got := Problems(root); len(got) != 1 {
		t.Fatalf("want the one garbled flag, got %v", got)
	}
}
