package permission

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
)

// ForConfiguration renders the roles every command class needs with cfg, ghcrsync's identities
// in namespace ns: targets are the configuration's pull secrets, existing (connected) the
// namespaces that exist — a need in one that does not is left out, and skipped names it;
// offline, every need is rendered. A runtime probe namespace that is ns is refused: a pod
// created there could run as one of the identities.
func ForConfiguration(cfg *config.Config, ns string, targets []cluster.SecretTarget, existing []string, offline bool) (objs []runtime.Object, skipped []string, err error) {
	if slices.Contains(ReservedNamespaces, ns) {
		return nil, nil, fmt.Errorf("--namespace %s is the cluster's or Flux's own: ghcrsync's identities, and the admission policies that bound them, "+
			"belong in a namespace of their own (the default, %s)", ns, DefaultNamespace)
	}

	ids := Identities(cfg, targets)
	shapes := ShapesOf(cfg, targets)

	if !offline {
		// The namespaces the rendering creates itself are there once it is applied.
		if shapes.ProbeNamespace != "" {
			existing = append(existing, shapes.ProbeNamespace)
		}

		if shapes.Writer != nil {
			existing = append(existing, shapes.Writer.Namespace)
		}

		skipped = withoutAbsent(ids, ns, existing)
	}

	if pr := cfg.Nodes.Probe; pr.Image != "" && pr.Namespace == ns {
		return nil, nil, fmt.Errorf("nodes.runtime_probe.namespace is %s, where ghcrsync's identities live (--namespace): a pod created there could run "+
			"as one of them or mount the Job's inputs; give the probe a namespace of its own (the default, %s)", ns, config.DefaultProbeNamespace)
	}

	return Render(ns, ids, shapes), skipped, nil
}

// withoutAbsent drops the identities' needs in a namespace that does not exist (besides ns,
// where the roles go), and names those namespaces, sorted.
func withoutAbsent(ids []Identity, ns string, existing []string) []string {
	var skipped []string

	for i := range ids {
		ids[i].Needs = slices.DeleteFunc(ids[i].Needs, func(a cluster.Access) bool {
			if a.Namespace == "" || a.Namespace == ns || slices.Contains(existing, a.Namespace) {
				return false
			}

			if !slices.Contains(skipped, a.Namespace) {
				skipped = append(skipped, a.Namespace)
			}

			return true
		})
	}

	slices.Sort(skipped)

	return skipped
}
