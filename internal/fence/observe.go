package fence

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Checker is a liveness source.
type Checker interface {
	Check(ctx context.Context, runRef string) (liveness.Verdict, error)
}

// Observe reads the fences: every Node carrying ghcrsync's owner annotation, every state record
// that may still hold one, and the Lease; then asks the liveness source about each holder that
// no live Lease vouches for.
func Observe(ctx context.Context, kube *cluster.Connection, st *state.State, leaseNS, leaseName string, checker Checker, now time.Time) (Observation, error) {
	o := Observation{Now: now, Verdicts: map[string]Verdict{}}

	for _, sr := range st.Secrets {
		if sr.Outcome == "writing" {
			o.SecretsInFlight = append(o.SecretsInFlight, sr)
		}
	}

	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, kube.Unreachable("list nodes", err)
	}

	seen := map[string]bool{}

	for i := range list.Items {
		n := &list.Items[i]
		if n.Annotations[plan.OwnerAnnotation] == "" {
			continue
		}

		obs := FromNode(n)
		obs.StateRecord = st.Record(n.Name)
		o.Nodes = append(o.Nodes, obs)
		seen[n.Name] = true
	}

	for i := range st.Records {
		r := &st.Records[i]
		if !r.Holds() || seen[r.Node] {
			continue
		}

		obs := NodeObs{Name: r.Node, StateRecord: r, UID: r.UID, Phase: string(r.Phase)}

		n, err := kube.Client.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return o, kube.Unreachable("read node "+r.Node, err)
		case string(n.UID) == r.UID:
			full := FromNode(n)
			full.StateRecord = r
			obs = full
		}

		o.Nodes = append(o.Nodes, obs)
	}

	l, err := kube.Client.CoordinationV1().Leases(leaseNS).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return o, kube.Unreachable("read lease", err)
	}

	if err == nil {
		pl := cluster.FromLease(l)
		o.Lease = &LeaseObs{Namespace: leaseNS, Name: leaseName, Holder: pl.Holder, RenewTime: pl.RenewTime,
			Duration: time.Duration(pl.DurationSeconds) * time.Second, Transitions: pl.Transitions}
	}

	if checker == nil {
		return o, nil
	}

	holders := []string{}
	for _, n := range o.Nodes {
		h := n.Owner
		if h == "" && n.StateRecord != nil {
			h = n.StateRecord.Owner
		}

		holders = append(holders, h)
	}

	if o.Lease != nil {
		holders = append(holders, o.Lease.Holder)
	}

	slices.Sort(holders)

	for _, h := range slices.Compact(holders) {
		if h == "" || (o.Lease.Live(now) && o.Lease.Holder == h) {
			continue
		}

		v, err := checker.Check(ctx, liveness.RunRef(h))
		o.Verdicts[h] = Verdict{Checked: err == nil && v.Applicable, Terminal: v.Terminal, Evidence: v.Evidence, Err: err}
	}

	return o, nil
}

// FromNode reads a fence from a Node.
func FromNode(n *corev1.Node) NodeObs {
	obs := NodeObs{
		Name: n.Name, Exists: true, UID: string(n.UID),
		Owner: n.Annotations[plan.OwnerAnnotation], Phase: n.Annotations[plan.PhaseAnnotation],
		Cordoned: n.Spec.Unschedulable, Ready: cluster.Ready(n),
		ScaleDownGuard: n.Annotations[cluster.ScaleDownGuardByAnnotation] != "",
		Lifecycle:      slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return taints.Lifecycle(t.Key) }),
	}

	if rec, ok := cluster.RecordOf(n); ok {
		obs.Record = &rec
	}

	return obs
}
