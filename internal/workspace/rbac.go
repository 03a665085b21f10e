package workspace

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/fleet"
	"github.com/ghcrsync/ghcrsync/internal/permission"
)

// RBACOptions render the RBAC of a configuration.
type RBACOptions struct {
	ConfigPath string
	Overrides  config.Overrides
	// Namespace holds ghcrsync's service accounts (permission.DefaultNamespace).
	Namespace string
	// Offline renders without the cluster: Selected are then the namespaces the consumer
	// selector stands for.
	Offline  bool
	Selected []string
}

// RBAC renders the roles every command class needs with the configuration: the consumer
// selector's namespaces are the cluster's (listed now, so a new consumer namespace is a new,
// reviewed rendering) or, offline, the ones given. Connected, a Role is left out for a
// namespace that does not exist (skipped names it). Nothing is written.
func RBAC(ctx context.Context, o RBACOptions) (objs []runtime.Object, skipped []string, err error) {
	cfg, err := config.Load(o.ConfigPath)
	if err != nil {
		return nil, nil, err
	}

	if err := cfg.Override(o.Overrides); err != nil {
		return nil, nil, err
	}

	selected, existing, err := rbacNamespaces(ctx, cfg, o)
	if err != nil {
		return nil, nil, err
	}

	ns := o.Namespace
	if ns == "" {
		ns = permission.DefaultNamespace
	}

	return permission.ForConfiguration(cfg, ns, fleet.PullSecrets(cfg, selected), existing, o.Offline)
}

// rbacNamespaces are the consumer namespaces to render for (each selector's, listed now, or
// offline o.Selected for the cluster credential's) and, connected, every namespace that exists.
func rbacNamespaces(ctx context.Context, cfg *config.Config, o RBACOptions) (selected map[string][]string, existing []string, err error) {
	selected = map[string][]string{}

	if o.Offline {
		for _, t := range cfg.Tenants {
			if t.ConsumerSelector != nil {
				return nil, nil, fmt.Errorf("credential %q selects its consumer namespaces by label (%s), which an offline rendering cannot list: "+
					"render connected to the cluster, or name that tenant's consumers in consumer blocks", t.Credential.Name, t.ConsumerSelector.Selector)
			}
		}

		if cs := cfg.ConsumerSelector; cs != nil {
			selected[cs.Selector] = o.Selected
		}

		return selected, nil, nil
	}

	kube, err := connect(cfg)
	if err != nil {
		return nil, nil, err
	}

	if existing, err = kube.SelectedNamespaces(ctx, ""); err != nil {
		return nil, nil, fmt.Errorf("%w: or render offline with --consumer-namespaces", err)
	}

	for _, sel := range cfg.Selectors() {
		if selected[sel], err = kube.SelectedNamespaces(ctx, sel); err != nil {
			return nil, nil, err
		}
	}

	return selected, existing, nil
}

// connect builds the configuration's Kubernetes client.
func connect(cfg *config.Config) (*cluster.Connection, error) {
	if cfg.Cluster.InCluster {
		return cluster.ConnectInCluster(cfg.Cluster.ServiceAccountDir, cfg.Cluster.Timeout)
	}

	return cluster.Connect(cfg.Cluster.Kubeconfig, cfg.Cluster.Context, cfg.Cluster.Timeout)
}
