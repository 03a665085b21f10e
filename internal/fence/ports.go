package fence

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/plan"
)

// The fence commands reach the cluster through these ports only (the workspace wires the real
// ones): each as small as what fence does with it.

// Nodes are the Nodes fences are on: listed whole and read (an error other than NotFound names
// the API and what to check), and changed only by a judged compare-and-swap.
type Nodes interface {
	ListNodes(ctx context.Context) ([]corev1.Node, error)
	ReadNode(ctx context.Context, name string) (*corev1.Node, error)
	object.Patcher
}

// Leases are the run Leases: read, released by their holder, and judged by the API server's
// clock (ok is false before it has answered).
type Leases interface {
	Lease(ctx context.Context, namespace, name string) (*plan.Lease, error)
	// ReleaseLease gives holder's Lease back; gone is true when it no longer exists (nothing to
	// release).
	ReleaseLease(ctx context.Context, namespace, name, holder string) (gone bool, err error)
	ServerNow() (now time.Time, ok bool)
}

// Flux are the Kustomizations a run suspends: read, and resumed by their run.
type Flux interface {
	Kustomization(ctx context.Context, namespace, name string) (plan.KustomizationObs, error)
	Resume(ctx context.Context, namespace, name, holder string) (gone bool, err error)
}

// Recorder writes the cluster's audit trail (Events).
type Recorder interface {
	Record(ctx context.Context, ref object.Ref, reason, message string, warning bool) error
}

// Writers are the kubelet keyring's writer pods and Secret a run makes (nodes.kubelet_keyring):
// listed, and removed once no run is alive.
type Writers interface {
	KeyringWriters(ctx context.Context, namespace string) ([]corev1.Pod, error)
	DeleteKeyringWriters(ctx context.Context, namespace string) (int, error)
	DeleteKeyringSecret(ctx context.Context, w keyring.Writer) error
}
