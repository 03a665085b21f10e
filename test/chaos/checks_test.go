package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/state"
)

// checkInvariants is what must hold after recovery and convergence.
func (r *seedRun) checkInvariants(ctx context.Context) {
	stats := r.sb.Fleet().Stats()
	if d := stats.UnsafeWrites - r.before.UnsafeWrites; d != 0 {
		r.problem("%d unsafe Talos write(s): %+v", d, stats.Unsafe[len(r.before.Unsafe):])
	}

	if d := stats.InterleavedWrites - r.before.InterleavedWrites; d != 0 {
		r.problem("%d interleaved Talos write(s): %+v", d, stats.Interleaved[len(r.before.Interleaved):])
	}

	r.checkNodes(ctx)
	r.checkLeaseFree(ctx)

	pj, ok := r.plan("")
	if ok {
		for _, n := range pj.Nodes {
			if n.Action != "no-op" {
				r.problem("final plan: %s is %s (%s), want no-op", n.Name, n.Action, n.Reason)
			}
		}

		if pj.Changes {
			r.problem("final plan has changes: %+v", pj.Summary)
		}

		r.checkState(pj.CredentialRevision)
		r.checkVerdict(ctx, pj)
	}

	r.checkCarriedChanges(ctx)
	r.checkAvailability()
	r.checkWorkloadsPull(ctx)
}

// checkAvailability is the availability witness: from the start of the seed's rotation to its
// convergence, no pod of the demo workloads spent a second unable to pull (ErrImagePull,
// ImagePullBackOff) — in seeds that revoke the old credential before the first plan too.
func (r *seedRun) checkAvailability() {
	d, err := r.sb.Disruption(r.started, sandbox.DemoNamespaces)
	if err != nil {
		r.problem("availability witness: %v", err)

		return
	}

	r.note("disruption", fmt.Sprintf("%d evictions, max %d per pod, %.1f pod-s unable to pull", len(d.Evictions), d.MaxEvictionsPerPod, d.PullFailurePodSecs))

	if d.PullFailurePodSecs > 0 {
		var pods []string
		for _, f := range d.PullFailures {
			pods = append(pods, fmt.Sprintf("%s %.1fs", f.Pod, f.Seconds))
		}

		r.problem("availability: demo pods spent %.1f pod-seconds unable to pull (old credential revoked first: %t): %s",
			d.PullFailurePodSecs, r.revokedFirst, strings.Join(pods, ", "))
	}
}

// checkVerdict: ghcrsync's own verdict — the final plan's — is clean, and agrees with the
// sandbox's ground truth: every machine's runtime pulls with the seed's credential (the
// credential its container runtime loaded, not its config), every managed pull secret and the
// node template hold it. A verdict that says "safe to revoke" while a machine or secret still
// uses the old credential is the failure this check exists for.
func (r *seedRun) checkVerdict(ctx context.Context, pj view.PlanJSON) {
	var truth []string

	for _, m := range r.sb.Fleet().Machines() {
		if eff := m.Effective(); eff.Username != r.cred.Username || eff.Password != r.cred.Password {
			truth = append(truth, "machine "+m.Name+" pulls as "+eff.Username)
		}
	}

	targets := [][2]string{{sandbox.RootNamespace, sandbox.RootSecret}}
	for _, ns := range sandbox.ConsumerNamespaces {
		targets = append(targets, [2]string{ns, sandbox.ConsumerSecret})
	}

	for _, tg := range targets {
		s, err := r.kube.CoreV1().Secrets(tg[0]).Get(ctx, tg[1], metav1.GetOptions{})
		if err != nil {
			r.problem("read %s/%s: %v", tg[0], tg[1], err)

			return
		}

		c, err := credential.Parse(s.Data[corev1.DockerConfigJsonKey], registry.RegistryHost)
		if err != nil || c.Username != r.cred.Username || c.Password() != r.cred.Password {
			truth = append(truth, "secret "+tg[0]+"/"+tg[1])
		}
	}

	v := pj.Verdict

	switch {
	case v == nil:
		r.problem("the final plan has no verdict")
	case len(truth) > 0 && v.SafeToRevoke:
		r.problem("ghcrsync says it is safe to revoke the old credential, but the sandbox still uses it: %s", strings.Join(truth, "; "))
	case len(truth) == 0 && !v.SafeToRevoke:
		r.problem("the sandbox uses only the new credential, but ghcrsync's verdict says: %s", v.Sentence)
	case len(truth) > 0:
		r.problem("after convergence the old credential is still used: %s (ghcrsync: %s)", strings.Join(truth, "; "), v.Sentence)
	}
}

// checkNodes: no ghcrsync mark on any node; a node is cordoned only by an operator, and
// every operator cordon and taint is still there.
func (r *seedRun) checkNodes(ctx context.Context) {
	nodes, err := r.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		r.problem("list nodes: %v", err)

		return
	}

	seen := map[string]bool{}

	for _, n := range nodes.Items {
		seen[n.Name] = true

		for _, k := range []string{object.OwnerAnnotation, object.PhaseAnnotation, object.RecordAnnotation, object.ScaleDownGuardByAnnotation, object.ScaleDownDisabledAnnotation} {
			if v, ok := n.Annotations[k]; ok {
				r.problem("node %s still carries %s=%q", n.Name, k, v)
			}
		}

		if n.Spec.Unschedulable && !r.cordoned[n.Name] {
			r.problem("node %s is cordoned, and no operator cordoned it", n.Name)
		}

		if !n.Spec.Unschedulable && r.cordoned[n.Name] {
			r.problem("node %s lost its operator's cordon", n.Name)
		}

		if r.tainted[n.Name] && !hasOperatorTaint(n.Spec.Taints) {
			r.problem("node %s lost its operator's taint %s", n.Name, operatorTaint)
		}
	}
}

func hasOperatorTaint(ts []corev1.Taint) bool {
	for _, t := range ts {
		if t.Key == operatorTaint {
			return true
		}
	}

	return false
}

func withoutOperatorTaint(ts []corev1.Taint) []corev1.Taint {
	out := ts[:0:0]

	for _, t := range ts {
		if t.Key != operatorTaint {
			out = append(out, t)
		}
	}

	return out
}

func (r *seedRun) checkLeaseFree(ctx context.Context) {
	l, err := r.kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Get(ctx, sandbox.LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}

	if err != nil {
		r.problem("read Lease: %v", err)

		return
	}

	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		r.problem("the Lease is still held by %s", h)
	}
}

// checkState: the state (either backend, read with `ghcrsync state pull`) agrees with the
// cluster: nothing recorded as held, the last run done for this credential, every pull secret
// written with it.
func (r *seedRun) checkState(revision string) {
	p, err := r.c.cli.run(time.Minute, "state", "pull", "--config", r.cfg)
	if err != nil || exitOf(p) != 0 {
		r.problem("state pull: %v exit %d\n%s", err, exitOf(p), outputOf(p))

		return
	}

	var st state.State
	if err := json.Unmarshal(p.stdout.Bytes(), &st); err != nil {
		r.problem("state pull is not a state: %v", err)

		return
	}

	for _, rec := range st.Records {
		if rec.Holds() {
			r.problem("state says %s is still fenced (phase %s, outcome %q), the cluster says not", rec.Node, rec.Phase, rec.Outcome)
		}
	}

	switch {
	case st.Run == nil:
		r.problem("state has no run record")
	case st.Run.Outcome != "succeeded" || st.Run.Finished == nil:
		r.problem("state's last run: outcome %q, finished %v", st.Run.Outcome, st.Run.Finished)
	case st.Run.CredentialRevision != revision:
		r.problem("state's last run is for revision %s, the credential is %s", st.Run.CredentialRevision, revision)
	}

	// A write-ahead record a later run found already in sync is settled as "unchanged".
	for _, s := range st.Secrets {
		if s.Outcome != "written" && s.Outcome != "unchanged" || s.DesiredRevision != revision {
			r.problem("state: %s %s/%s is %s for %s", s.Role, s.Namespace, s.Name, s.Outcome, s.DesiredRevision)
		}
	}
}

// checkCarriedChanges: a staged change the operator re-staged with the credential is never
// lost: it is live (ghcrsync rebooted its node after it was staged) or still staged (ghcrsync had
// no reason to reboot the node: it already ran the credential).
func (r *seedRun) checkCarriedChanges(ctx context.Context) {
	for name := range r.carried {
		if _, ok := r.sb.Fleet().Machine(name); !ok {
			continue
		}

		live, err := r.configLabel(ctx, name, talosconfig.ActiveID)
		if err != nil {
			r.problem("read %s's config: %v", name, err)

			continue
		}

		staged, err := r.configLabel(ctx, name, talosconfig.PersistentID)
		if err != nil {
			r.problem("read %s's staged config: %v", name, err)
		} else if live != "yes" && staged != "yes" {
			r.problem("the operator's staged change on %s was dropped by the rotation", name)
		}
	}
}

// checkWorkloadsPull: with the old credential revoked, every node's runtime pulls the private
// image (a DaemonSet without pull secrets, its pods re-created), and the demo Deployment runs.
func (r *seedRun) checkWorkloadsPull(ctx context.Context) {
	r.sb.Registry().RevokeCredential(r.old.Username)

	if err := r.c.ensurePullCheck(ctx); err != nil {
		r.problem("pull check DaemonSet: %v", err)

		return
	}

	pods := r.kube.CoreV1().Pods(pullCheckNamespace)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{}); err != nil {
		r.problem("re-create pull check pods: %v", err)
	}

	deadline := time.Now().Add(90 * time.Second)

	for {
		why := r.pullsPending(ctx)
		if why == "" {
			return
		}

		if time.Now().After(deadline) {
			r.problem("workloads do not pull: %s", why)

			return
		}

		time.Sleep(500 * time.Millisecond)
	}
}

func (r *seedRun) pullsPending(ctx context.Context) string {
	ds, err := r.kube.AppsV1().DaemonSets(pullCheckNamespace).Get(ctx, pullCheckName, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}

	st := ds.Status
	if st.ObservedGeneration < ds.Generation || st.DesiredNumberScheduled == 0 || st.NumberReady != st.DesiredNumberScheduled {
		return fmt.Sprintf("DaemonSet %d/%d pods ready; %s", st.NumberReady, st.DesiredNumberScheduled, r.pullErrors(ctx))
	}

	web, err := r.kube.AppsV1().Deployments("apps").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}

	if web.Status.ReadyReplicas != ptr.Deref(web.Spec.Replicas, 1) {
		return fmt.Sprintf("Deployment web %d/%d ready", web.Status.ReadyReplicas, ptr.Deref(web.Spec.Replicas, 1))
	}

	return ""
}

func (r *seedRun) pullErrors(ctx context.Context) string {
	pods, err := r.kube.CoreV1().Pods(pullCheckNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}

	var out []string

	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				out = append(out, p.Spec.NodeName+": "+w.Reason)
			}
		}
	}

	return strings.Join(out, ", ")
}

const (
	pullCheckNamespace = "chaos-pull"
	pullCheckName      = "pull-check"
)

// ensurePullCheck creates, once, a DaemonSet on every node (every taint tolerated) whose pods
// pull the private image with no pull secret: only the node's own credential can pull it.
func (c *campaign) ensurePullCheck(ctx context.Context) error {
	c.pullOnce.Do(func() {
		kube := c.sb.Kube()

		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pullCheckNamespace}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			c.pullErr = err

			return
		}

		labels := map[string]string{"app": pullCheckName}
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: pullCheckName, Namespace: pullCheckNamespace},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
						TerminationGracePeriodSeconds: ptr.To(int64(0)),
						AutomountServiceAccountToken:  ptr.To(false),
						Containers: []corev1.Container{{
							Name: "pull", Image: registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1", ImagePullPolicy: corev1.PullAlways,
						}},
					},
				},
			},
		}

		if _, err := kube.AppsV1().DaemonSets(pullCheckNamespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			c.pullErr = err
		}
	})

	return c.pullErr
}

// leaseLog records every change of the run Lease's holder, from a watch (so no change is
// missed), to check that no run ever took the Lease from a live run.
type leaseLog struct {
	mu     sync.Mutex
	events []leaseEvent
	cancel context.CancelFunc
	done   chan struct{}
}

type leaseEvent struct {
	at     time.Time
	holder string
}

func watchLease(ctx context.Context, kube kubernetes.Interface) *leaseLog {
	ctx, cancel := context.WithCancel(ctx)
	l := &leaseLog{cancel: cancel, done: make(chan struct{})}

	go func() {
		defer close(l.done)

		rv := ""

		for ctx.Err() == nil {
			w, err := kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Watch(ctx, metav1.ListOptions{
				FieldSelector: "metadata.name=" + sandbox.LeaseName, ResourceVersion: rv, AllowWatchBookmarks: true,
			})
			if err != nil {
				time.Sleep(100 * time.Millisecond)

				continue
			}

			for ev := range w.ResultChan() {
				lease, ok := ev.Object.(*coordinationv1.Lease)
				if !ok {
					rv = "" // an error event (e.g. the version expired): watch afresh

					continue
				}

				rv = lease.ResourceVersion
				if ev.Type == watch.Bookmark {
					continue
				}

				h := ptr.Deref(lease.Spec.HolderIdentity, "")
				if ev.Type == watch.Deleted {
					h = ""
				}

				l.mu.Lock()
				if n := len(l.events); n == 0 || l.events[n-1].holder != h {
					l.events = append(l.events, leaseEvent{at: time.Now(), holder: h})
				}
				l.mu.Unlock()
			}
		}
	}()

	return l
}

func (l *leaseLog) stop() {
	l.cancel()
	<-l.done
}

func (l *leaseLog) snapshot() []leaseEvent {
	l.mu.Lock()
	defer l.mu.Unlock()

	return append([]leaseEvent(nil), l.events...)
}

// checkLeaseHistory: the Lease never passed straight from one holder to another while the
// first one's process was still running.
func (r *seedRun) checkLeaseHistory() {
	if r.leases == nil {
		return
	}

	procOf := map[int]*proc{}

	for _, p := range r.applies {
		procOf[p.cmd.Process.Pid] = p
	}

	evs := r.leases.snapshot()
	for i := 1; i < len(evs); i++ {
		prev, cur := evs[i-1], evs[i]
		if prev.holder == "" || cur.holder == "" {
			continue
		}

		id, ok := holder.Parse(prev.holder)
		if !ok {
			continue
		}

		if p, ok := procOf[id.PID]; ok {
			if _, exited := p.exit(); exited.IsZero() || exited.After(cur.at) {
				r.problem("interleaved runs: the Lease passed from %s to %s while %s's process still ran", prev.holder, cur.holder, prev.holder)
			}
		}
	}
}
