package main

import (
	"github.com/spf13/cobra"

	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
)

func newRBAC() *cobra.Command {
	o := workspace.RBACOptions{Namespace: permission.DefaultNamespace}

	var cfgPath string

	cmd := &cobra.Command{
		Use:   "rbac",
		Short: "Print the RBAC each command class needs with this configuration (review it, then kubectl apply)",
		Long: `Print, first, the admission policies that bound every write ghcrsync's identities hold to
the fields ghcrsync writes (a Secret's type, a Node's cordon and annotations, a Kustomization's
spec.suspend, the probe pod's exact shape, …); then the probe's namespace (PodSecurity
restricted) and account; then the ServiceAccounts, Roles, ClusterRoles and bindings of the three
identities (plan, apply, release), each holding exactly what its preflight checks. The consumer
selector's namespaces are listed from the cluster now: a namespace that gains the label later
gets nothing until the output is rendered and applied again (a reviewed change).`,
		Example: `  ghcrsync rbac > rbac.yaml && kubectl apply -f deploy/rbac/namespace.yaml -f rbac.yaml
  ghcrsync rbac --consumer-namespaces team-a,team-b    # without the cluster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.ConfigPath, o.Overrides = cfgPath, overrides(cmd)
			o.Offline = cmd.Flags().Changed("consumer-namespaces")

			objs, skipped, err := workspace.RBAC(cmd.Context(), o)
			if err != nil {
				return err
			}

			return view.NewRBAC(view.Streams{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}).Objects(cfgPath, skipped, objs)
		},
	}

	cmd.Flags().StringVar(&cfgPath, "config", defaultConfig(), "configuration file")
	cmd.Flags().StringVar(&o.Namespace, "namespace", permission.DefaultNamespace, "namespace of ghcrsync's service accounts")
	cmd.Flags().StringSliceVar(&o.Selected, "consumer-namespaces", nil,
		"render without the cluster: the namespaces the consumer selector stands for (comma-separated)")

	return cmd
}
