package apply

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
)

// controlPlaneNodes lists every control-plane Node of the cluster (not only a plan's: Nodes).
type controlPlaneNodes interface {
	ControlPlanes(ctx context.Context) ([]corev1.Node, error)
}

// controlPlanes reads the control planes as the etcd gate (plan.Quorum) judges them: each Node,
// and — for every one but down, the node to be taken down — its etcd member's answer. An
// unreadable member is read as its error, for the gate to judge; only the LIST failing fails.
func controlPlanes(ctx context.Context, nodes controlPlaneNodes, etcd Etcd, down string) ([]plan.ControlPlane, error) {
	cps, err := nodes.ControlPlanes(ctx)
	if err != nil {
		return nil, err
	}

	view := make([]plan.ControlPlane, 0, len(cps))

	for i := range cps {
		cp := &cps[i]
		obs := object.FromControlPlane(cp)

		if cp.Name != down {
			if v, err := etcd.Etcd(ctx, object.InternalIP(cp)); err != nil {
				obs.Etcd.Err = redact.Error(err)
			} else {
				obs.Etcd = *v
			}
		}

		view = append(view, obs)
	}

	return view, nil
}
