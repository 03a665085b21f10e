package main

import (
	"sort"
	"strings"

	"github.com/spf13/cobra"
)

// completeFromState completes a flag from the state of --config (no cluster write, no Talos):
// the recorded node names, or the holder ids of the recorded runs and fences.
func completeFromState(cfgFlag string, holders bool) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		cfg, _ := cmd.Flags().GetString(cfgFlag)

		ws, err := open(cmd, cfg, false)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		defer ws.Close()

		seen := map[string]bool{}

		if holders && ws.State.Run != nil {
			seen[ws.State.Run.Holder] = true
		}

		for _, r := range ws.State.Records {
			v := r.Node
			if holders {
				v = r.Owner
			}

			seen[v] = true
		}

		var out []string

		for v := range seen {
			if v != "" && strings.HasPrefix(v, prefix) {
				out = append(out, v)
			}
		}

		sort.Strings(out)

		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
