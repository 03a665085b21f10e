package fence

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/state"
)

// Targets are where a run's fences other than node fences are: the run Lease and the
// Kustomizations the flux block suspends.
type Targets struct {
	LeaseNamespace, LeaseName string
	Kustomizations            []config.NamespacedName
}

// TargetsOf are cfg's targets.
func TargetsOf(cfg *config.Config) Targets {
	return Targets{LeaseNamespace: cfg.Lease.Namespace, LeaseName: cfg.Lease.Name, Kustomizations: cfg.FluxSuspend}
}

// Observe reads the fences: every Node carrying ghcrsync's owner annotation, every state record
// that may still hold one, and the Lease; then asks the liveness source about each holder that
// no live Lease vouches for.
func Observe(ctx context.Context, in Inputs, where Targets) (Observation, error) {
	st := in.State
	o := Observation{Now: in.Clock.Now(), Verdicts: map[string]Verdict{}}

	for _, sr := range st.Secrets {
		if sr.Outcome == state.SecretWriting {
			o.SecretsInFlight = append(o.SecretsInFlight, sr)
		}
	}

	var (
		err  error
		list []corev1.Node
	)

	if o.Nodes, list, err = observeNodes(ctx, in.Nodes, st); err != nil {
		return o, err
	}

	if o.Lease, err = observeLease(ctx, in.Leases, where.LeaseNamespace, where.LeaseName); err != nil {
		return o, err
	}

	leaseHolder := ""
	if o.Lease != nil {
		leaseHolder = o.Lease.Holder
	}

	o.Steered = observeSteering(list, st, leaseHolder)
	o.Holds = observeHolds(list)

	if o.Flux, err = observeFlux(ctx, in.Flux, st, where.Kustomizations); err != nil {
		return o, err
	}

	if o.Kured, err = observeKured(ctx, in.Kured); err != nil {
		return o, err
	}

	// A Lease is judged by the API server's clock, not this machine's.
	if server, ok := in.Leases.ServerNow(); ok && o.Lease != nil && o.Lease.Written != nil {
		o.Now = server
	} else if o.Lease != nil {
		o.Lease.Written = nil
	}

	o.Verdicts = checkHolders(ctx, in.Pods, o, in.Liveness)

	return o, nil
}

// observeHolds are the listed nodes on ghcrsync's unproven hold with no fence of a run on them.
func observeHolds(nodes []corev1.Node) []HoldObs {
	var out []HoldObs

	for i := range nodes {
		n := &nodes[i]
		if object.HeldUnproven(n) && n.Annotations[object.OwnerAnnotation] == "" {
			out = append(out, HoldObs{Name: n.Name, UID: string(n.UID), Revision: n.Annotations[object.UnprovenAnnotation], Cordoned: n.Spec.Unschedulable})
		}
	}

	return out
}

// observeNodes lists the annotated Nodes, then reads each state record's node not among them;
// the whole list is returned too.
func observeNodes(ctx context.Context, nodes Nodes, st *state.State) ([]NodeObs, []corev1.Node, error) {
	items, err := nodes.ListNodes(ctx) // whole: a list that is not the whole fleet never reads as "no fence"
	if err != nil {
		return nil, nil, err
	}

	var out []NodeObs

	seen := map[string]bool{}

	for i := range items {
		n := &items[i]
		if !carriesFence(n) {
			continue
		}

		obs := FromNode(n)
		obs.StateRecord = st.Record(n.Name)
		out = append(out, obs)
		seen[n.Name] = true
	}

	for i := range st.Records {
		r := &st.Records[i]
		if !r.Holds() || seen[r.Node] {
			continue
		}

		obs := NodeObs{Name: r.Node, StateRecord: r, UID: r.UID, Phase: r.Phase}

		n, err := nodes.ReadNode(ctx, r.Node)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, nil, err
		case string(n.UID) == r.UID:
			obs = FromNode(n)
			obs.StateRecord = r
		}

		out = append(out, obs)
	}

	return out, items, nil
}

func observeLease(ctx context.Context, leases Leases, ns, name string) (*LeaseObs, error) {
	l, err := leases.Lease(ctx, ns, name)
	if err != nil || l == nil {
		return nil, err
	}

	return &LeaseObs{Namespace: ns, Name: name, Holder: l.Holder, RenewTime: l.RenewTime, Written: l.Written,
		Duration: time.Duration(l.DurationSeconds) * time.Second, Transitions: l.Transitions}, nil
}

// checkHolders judges every holder no live Lease vouches for: a holder whose process, on this
// machine, has exited is terminated (liveness.Local) — even under a live Lease when the evidence
// is unique to that process, never on a host name and pid alone; otherwise the configured
// source (if any) is asked.
func checkHolders(ctx context.Context, pods liveness.Source, o Observation, source liveness.Source) map[string]Verdict {
	holders := []string{}
	for _, n := range o.Nodes {
		holders = append(holders, n.holder())
	}

	holders = append(holders, steeringHolders(o.Steered)...)
	holders = append(holders, fluxHolders(o.Flux)...)

	for _, e := range o.Kured {
		holders = append(holders, e.Holder)
	}

	if o.Lease != nil {
		holders = append(holders, o.Lease.Holder)
	}

	slices.Sort(holders)

	verdicts := map[string]Verdict{}

	for _, h := range slices.Compact(holders) {
		if h == "" {
			continue
		}

		id, _ := holder.Parse(h)

		if local, _ := (liveness.Local{}).Check(ctx, id); local.Applicable && (local.Unique || !o.Lease.vouches(h, o.Now)) {
			verdicts[h] = Verdict{Checked: true, Terminal: true, Exited: true, Evidence: local.Evidence}

			continue
		}

		// A run in a pod (docs/deploy/job.yaml): the pod as the API server sees it. Its end is
		// proof beyond the Lease; its absence only where no live Lease vouches for it.
		if pod, err := podCheck(ctx, pods, id); err != nil || pod.Applicable {
			switch {
			case err != nil:
				verdicts[h] = Verdict{Err: err}
			case pod.Terminal && (pod.Unique || !o.Lease.vouches(h, o.Now)):
				verdicts[h] = Verdict{Checked: true, Terminal: true, Exited: pod.Unique, Evidence: pod.Evidence}
			default:
				verdicts[h] = Verdict{Checked: true, Evidence: pod.Evidence}
			}

			continue
		}

		if source == nil || o.Lease.vouches(h, o.Now) {
			continue
		}

		v, err := source.Check(ctx, id)
		verdicts[h] = Verdict{Checked: err == nil && v.Applicable, Terminal: v.Terminal, Evidence: v.Evidence, Err: err}
	}

	return verdicts
}

// podCheck asks pods (cluster.PodLiveness, nil: not asked) about a holder's pod.
func podCheck(ctx context.Context, pods liveness.Source, id holder.ID) (liveness.Verdict, error) {
	if pods == nil {
		return liveness.Verdict{}, nil
	}

	return pods.Check(ctx, id)
}

// holder is the run that holds the observed fence: the node's owner, else the state record's.
func (n NodeObs) holder() string {
	if n.Owner == "" && n.StateRecord != nil {
		return n.StateRecord.Owner
	}

	return n.Owner
}

// carriesFence reports whether ghcrsync's owner annotation is on the node, whatever its value:
// an empty owner is reported (whose fence it is cannot be told), never skipped as no fence.
func carriesFence(n *corev1.Node) bool {
	_, ok := n.Annotations[object.OwnerAnnotation]

	return ok
}

// FromNode reads a fence from a Node.
func FromNode(n *corev1.Node) NodeObs {
	obs := NodeObs{
		Name: n.Name, Exists: true, UID: string(n.UID),
		Owner: n.Annotations[object.OwnerAnnotation], Phase: state.Phase(n.Annotations[object.PhaseAnnotation]),
		Cordoned: n.Spec.Unschedulable, Ready: drain.NodeReady(n),
		ScaleDownGuard: n.Annotations[object.ScaleDownGuardByAnnotation] != "",
		Lifecycle:      taints.HasLifecycle(object.Taints(n.Spec.Taints)),
	}

	if raw, ok := n.Annotations[object.RecordAnnotation]; ok {
		if rec, err := object.ParseRecord(raw); err != nil {
			obs.RecordErr = err.Error()
		} else {
			obs.Record = &rec
		}
	}

	return obs
}
