package object

import (
	"cmp"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// FromControlPlane is a control plane's Node as the etcd gate reads it (its member's answer is
// Talos's, added by the caller).
func FromControlPlane(n *corev1.Node) plan.ControlPlane {
	return plan.ControlPlane{Name: n.Name, Ready: drain.NodeReady(n), Unschedulable: n.Spec.Unschedulable, Owner: n.Annotations[OwnerAnnotation]}
}

// FromNode converts a Node to the snapshot type, with ghcrsync's annotations as typed fields.
func FromNode(n *corev1.Node) plan.Node {
	out := plan.Node{
		Name:             n.Name,
		UID:              string(n.UID),
		Unschedulable:    n.Spec.Unschedulable,
		Taints:           Taints(n.Spec.Taints),
		BootID:           n.Status.NodeInfo.BootID,
		Ready:            drain.NodeReady(n),
		InternalIP:       InternalIP(n),
		Owner:            n.Annotations[OwnerAnnotation],
		Phase:            state.Phase(n.Annotations[PhaseAnnotation]),
		VerifiedRevision: n.Annotations[VerifiedRevisionAnnotation],
		VerifiedBoot:     n.Annotations[VerifiedBootAnnotation],
		Keyring:          n.Annotations[KeyringAnnotation],
		HeldUnproven:     HeldUnproven(n),
		Arch:             cmp.Or(n.Labels[corev1.LabelArchStable], n.Status.NodeInfo.Architecture),
	}

	_, out.Autoscaled = n.Labels[NodeGroupLabel]

	_, out.ControlPlane = n.Labels[ControlPlaneLabel]

	for _, a := range n.Status.Addresses {
		out.Addresses = append(out.Addresses, a.Address)

		if a.Type == corev1.NodeInternalIP {
			out.InternalIPs = append(out.InternalIPs, a.Address)
		}
	}

	if n.DeletionTimestamp != nil {
		t := n.DeletionTimestamp.UTC()
		out.Deleting = &t
	}

	return out
}

// InternalIP is the Node's first InternalIP address: where its Talos API is reached.
func InternalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}

	return ""
}

// Taints converts Kubernetes taints to the type the taint rule compares.
func Taints(ts []corev1.Taint) []taints.Taint {
	out := make([]taints.Taint, 0, len(ts))
	for _, t := range ts {
		out = append(out, taints.Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
	}

	return out
}
