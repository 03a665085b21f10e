package fence

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
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
func Observe(ctx context.Context, kube *cluster.Connection, st *state.State, where Targets, source liveness.Source, now time.Time) (Observation, error) {
	o := Observation{Now: now, Verdicts: map[string]Verdict{}}

	for _, sr := range st.Secrets {
		if sr.Outcome == state.SecretWriting {
			o.SecretsInFlight = append(o.SecretsInFlight, sr)
		}
	}

	var (
		err  error
		list []corev1.Node
	)

	if o.Nodes, list, err = observeNodes(ctx, kube, st); err != nil {
		return o, err
	}

	if o.Lease, err = observeLease(ctx, kube, where.LeaseNamespace, where.LeaseName); err != nil {
		return o, err
	}

	leaseHolder := ""
	if o.Lease != nil {
		leaseHolder = o.Lease.Holder
	}

	o.Steered = observeSteering(list, st, leaseHolder)
	o.Holds = observeHolds(list)

	if o.Flux, err = observeFlux(ctx, kube, st, where.Kustomizations); err != nil {
		return o, err
	}

	// A Lease is judged by the API server's clock, not this machine's.
	if server, ok := kube.ServerNow(); ok && o.Lease != nil && o.Lease.Written != nil {
		o.Now = server
	} else if o.Lease != nil {
		o.Lease.Written = nil
	}

	var client kubernetes.Interface
	if kube != nil {
		client = kube.Client
	}

	o.Verdicts = checkHolders(ctx, client, o, source)

	return o, nil
}

// observeHolds are the listed nodes on ghcrsync's unproven hold with no fence of a run on them.
func observeHolds(nodes []corev1.Node) []HoldObs {
	var out []HoldObs

	for i := range nodes {
		n := &nodes[i]
		if cluster.HeldUnproven(n) && n.Annotations[cluster.OwnerAnnotation] == "" {
			out = append(out, HoldObs{Name: n.Name, UID: string(n.UID), Revision: n.Annotations[cluster.UnprovenAnnotation], Cordoned: n.Spec.Unschedulable})
		}
	}

	return out
}

// observeNodes lists the annotated Nodes, then reads each state record's node not among them;
// the whole list is returned too.
func observeNodes(ctx context.Context, kube *cluster.Connection, st *state.State) ([]NodeObs, []corev1.Node, error) {
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, kube.Unreachable("list nodes", err)
	}

	// A list that is not the whole fleet must never read as "no fence".
	if err := cluster.Whole("list nodes", list.ListMeta); err != nil {
		return nil, nil, err
	}

	var out []NodeObs

	seen := map[string]bool{}

	for i := range list.Items {
		n := &list.Items[i]
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

		n, err := kube.Client.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, nil, kube.Unreachable("read node "+r.Node, err)
		case string(n.UID) == r.UID:
			obs = FromNode(n)
			obs.StateRecord = r
		}

		out = append(out, obs)
	}

	return out, list.Items, nil
}

func observeLease(ctx context.Context, kube *cluster.Connection, ns, name string) (*LeaseObs, error) {
	l, err := kube.Lease(ctx, ns, name)
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
func checkHolders(ctx context.Context, kube kubernetes.Interface, o Observation, source liveness.Source) map[string]Verdict {
	holders := []string{}
	for _, n := range o.Nodes {
		holders = append(holders, n.holder())
	}

	holders = append(holders, steeringHolders(o.Steered)...)
	holders = append(holders, fluxHolders(o.Flux)...)

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
		if pod, err := (liveness.Pod{Client: kube}).Check(ctx, id); err != nil || pod.Applicable {
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
	_, ok := n.Annotations[cluster.OwnerAnnotation]

	return ok
}

// FromNode reads a fence from a Node.
func FromNode(n *corev1.Node) NodeObs {
	obs := NodeObs{
		Name: n.Name, Exists: true, UID: string(n.UID),
		Owner: n.Annotations[cluster.OwnerAnnotation], Phase: state.Phase(n.Annotations[cluster.PhaseAnnotation]),
		Cordoned: n.Spec.Unschedulable, Ready: cluster.Ready(n),
		ScaleDownGuard: n.Annotations[cluster.ScaleDownGuardByAnnotation] != "",
		Lifecycle:      taints.HasLifecycle(cluster.Taints(n.Spec.Taints)),
	}

	if raw, ok := n.Annotations[cluster.RecordAnnotation]; ok {
		if rec, err := cluster.ParseRecord(raw); err != nil {
			obs.RecordErr = err.Error()
		} else {
			obs.Record = &rec
		}
	}

	return obs
}
