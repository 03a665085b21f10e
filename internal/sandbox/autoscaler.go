package sandbox

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// autoscaler simulates the cluster autoscaler on the autoscaler-managed nodes: every interval
// it adds or removes the advisory DeletionCandidateOfClusterAutoscaler taint (added once with
// its timestamp, never rewritten while present, as the real one), and on a seeded schedule
// scales down a candidate (ToBeDeletedByClusterAutoscaler taint, cordon as with
// --cordon-node-before-terminating, evict, delete the Node and its machine) or scales up a new
// node from the template it read when it started. Nodes annotated
// cluster-autoscaler.kubernetes.io/scale-down-disabled=true are left alone when it plans; as in
// the real actuator, the annotation is not checked again once a scale-down has been decided.
// Deterministic per seed for a given sequence of ticks. AutoscalerReal runs the real one.
type autoscaler struct {
	f   *Fleet
	rng *mrand.Rand

	mu         sync.Mutex
	ticking    sync.Mutex // held through a tick: a pause waits out the one in flight
	paused     bool
	candidates map[string]int // node -> ticks as a candidate
	maxNodes   int
	// template is the machine config it hands new servers: the template Secret as it was when
	// it (re)started (templateErr if it could not be read then), and starts counts the reads.
	template    []byte
	templateErr error
	starts      int
	// provisioning are servers created and not joined yet (provision).
	provisioning []string

	cancel context.CancelFunc
	done   chan struct{}
}

func newAutoscaler(f *Fleet) *autoscaler {
	return &autoscaler{
		f:          f,
		rng:        mrand.New(mrand.NewPCG(uint64(f.opts.Seed), 0xa5)),
		candidates: map[string]int{},
		maxNodes:   f.opts.Autoscaled + 2,
	}
}

func (a *autoscaler) start() {
	a.restart()

	ctx, cancel := context.WithCancel(a.f.ctx)
	a.cancel, a.done = cancel, make(chan struct{})

	go func() {
		defer close(a.done)

		a.publish(ctx)

		t := time.NewTicker(a.f.opts.AutoscalerInterval)
		defer t.Stop()

		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				a.ticking.Lock()
				if !a.isPaused() {
					a.tick(ctx)
				}
				a.ticking.Unlock()
			}
		}
	}()
}

// restart is the autoscaler's pod starting again: it reads the template Secret now.
func (a *autoscaler) restart() {
	ctx, cancel := context.WithTimeout(a.f.ctx, 10*time.Second)
	defer cancel()

	cfg, err := a.f.templateConfig(ctx)

	a.mu.Lock()
	a.template, a.templateErr = cfg, err
	a.starts++
	a.mu.Unlock()
}

// Starts is how many times it read the template: 1, plus one per restart.
func (a *autoscaler) Starts() int {
	a.mu.Lock()
	defer a.mu.Unlock()

	return a.starts
}

func (a *autoscaler) stop() {
	if a.cancel != nil {
		a.cancel()
		<-a.done
	}
}

// setPaused pauses (or resumes) the loop. A pause returns once the tick in flight, if any, has
// ended: a caller that then clears the candidates (PauseAutoscaler) is not followed by a tick
// that planned from a list read before the pause and marks one again (chaos seed 8306's
// converging apply met exactly that candidate).
func (a *autoscaler) setPaused(p bool) {
	a.mu.Lock()
	a.paused = p
	a.mu.Unlock()

	if p {
		a.ticking.Lock()
		a.ticking.Unlock() //nolint:staticcheck // an empty critical section: waits out the tick in flight
	}
}

func (a *autoscaler) isPaused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()

	return a.paused
}

func (a *autoscaler) managed(ctx context.Context) ([]corev1.Node, error) {
	list, err := a.f.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: NodeGroupLabel})
	if err != nil {
		return nil, err
	}

	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })

	return list.Items, nil
}

func (a *autoscaler) tick(ctx context.Context) {
	defer a.publish(ctx)

	nodes, err := a.managed(ctx)
	if err != nil {
		a.f.log.Debug("autoscaler list", "error", err)

		return
	}

	for _, n := range nodes {
		if hasTaint(&n, ToBeDeletedTaint) {
			continue
		}

		disabled := n.Annotations[ScaleDownDisabledAnnotation] == "true"
		candidate := hasTaint(&n, DeletionCandidateTaint)
		roll := a.rng.Float64()

		var action string

		switch {
		case disabled && candidate:
			action = "remove"
		case disabled:
			continue
		case candidate && roll < 0.75:
			action = "keep" // still unneeded: the taint stays as it was added, and ages
		case candidate:
			action = "remove"
		case roll < 0.5:
			action = "add"
		default:
			continue
		}

		if action != "keep" {
			if err := a.setCandidate(ctx, n.Name, action == "add"); err != nil {
				a.f.log.Debug("autoscaler taint", "node", n.Name, "error", err)

				continue
			}
		}

		a.mu.Lock()
		if action == "remove" {
			delete(a.candidates, n.Name)
		} else {
			a.candidates[n.Name]++
		}
		a.mu.Unlock()
	}

	rate := a.f.opts.AutoscalerScaleRate
	if rate <= 0 {
		return
	}

	if a.rng.Float64() < rate {
		if victim := a.longestCandidate(); victim != "" {
			if err := a.scaleDown(ctx, victim, false); err != nil {
				a.f.log.Info("autoscaler scale-down abandoned", "node", victim, "error", err)
			}
		}
	}

	if a.rng.Float64() < rate && len(nodes) < a.maxNodes {
		if _, err := a.scaleUp(ctx); err != nil {
			a.f.log.Info("autoscaler scale-up failed", "error", err)
		}
	}
}

func (a *autoscaler) longestCandidate() string {
	a.mu.Lock()
	defer a.mu.Unlock()

	best, ticks := "", 1
	for n, t := range a.candidates {
		if t > ticks || (t == ticks && best != "" && n < best) {
			best, ticks = n, t
		}
	}

	return best
}

// updateNode is the autoscaler's read-modify-write of a Node, retried on conflict as the real
// one does: this is the concurrent writer ghcrsync's claims race against.
func (a *autoscaler) updateNode(ctx context.Context, name string, mutate func(*corev1.Node) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := a.f.admin.CoreV1().Nodes().Get(ctx, name, getOpts)
		if err != nil {
			return err
		}

		if !mutate(n) {
			return nil
		}

		_, err = a.f.admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})

		return err
	})
}

func (a *autoscaler) setCandidate(ctx context.Context, name string, present bool) error {
	return a.updateNode(ctx, name, func(n *corev1.Node) bool {
		taints := withoutTaint(n.Spec.Taints, DeletionCandidateTaint)
		if present {
			taints = append(taints, corev1.Taint{
				Key: DeletionCandidateTaint, Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectPreferNoSchedule,
			})
		}

		n.Spec.Taints = taints

		return true
	})
}

// scaleDown deletes an autoscaled node the way the cluster autoscaler does. If its pods cannot
// be evicted in time the scale-down is abandoned and the node restored. plan checks the
// scale-down-disabled annotation first (a scale-down asked for now); the loop's own decisions
// were planned from its tick's list and are not checked again, as the real actuator does not.
func (a *autoscaler) scaleDown(ctx context.Context, name string, plan bool) error {
	m, ok := a.f.Machine(name)
	if !ok || !m.Autoscaled {
		return fmt.Errorf("%s is not an autoscaler-managed machine", name)
	}

	n, err := a.f.admin.CoreV1().Nodes().Get(ctx, name, getOpts)
	if err != nil {
		return err
	}

	if plan && n.Annotations[ScaleDownDisabledAnnotation] == "true" {
		return fmt.Errorf("%s has %s=true: the autoscaler does not scale it down", name, ScaleDownDisabledAnnotation)
	}

	wasCordoned := n.Spec.Unschedulable

	if err := a.updateNode(ctx, name, func(n *corev1.Node) bool {
		n.Spec.Taints = append(withoutTaint(n.Spec.Taints, DeletionCandidateTaint), corev1.Taint{
			Key: ToBeDeletedTaint, Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule,
		})
		n.Spec.Unschedulable = true

		return true
	}); err != nil {
		return err
	}

	a.f.log.Info("autoscaler scaling down", "node", name)

	if err := a.evictAll(ctx, name, 20*time.Second); err != nil {
		a.abandonScaleDown(ctx, name, wasCordoned)

		return err
	}

	a.f.removeMachine(m)

	err = a.f.admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}

	a.mu.Lock()
	delete(a.candidates, name)
	a.mu.Unlock()

	a.f.log.Info("autoscaler deleted node", "node", name)

	return nil
}

// abandonScaleDown restores a node whose scale-down did not finish, as the cluster autoscaler
// cleans up after a failed drain: its ToBeDeleted taint removed and its cordon undone. It does so
// even when the scale-down was cancelled (the cleanup is not the caller's to cancel), retrying
// through an API outage for up to a minute.
func (a *autoscaler) abandonScaleDown(ctx context.Context, name string, wasCordoned bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()

	for {
		err := a.updateNode(rctx, name, func(n *corev1.Node) bool {
			n.Spec.Taints = withoutTaint(n.Spec.Taints, ToBeDeletedTaint)
			n.Spec.Unschedulable = wasCordoned

			return true
		})
		if err == nil || apierrors.IsNotFound(err) {
			return
		}

		select {
		case <-rctx.Done():
			a.f.log.Warn("autoscaler could not restore an abandoned scale-down", "node", name, "error", err)

			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// evictAll evicts every evictable pod through the Eviction API (PDBs honoured) and waits
// until they are gone.
func (a *autoscaler) evictAll(ctx context.Context, node string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)

	for {
		pods, err := a.f.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return err
		}

		remaining := 0

		var lastErr error

		for i := range pods.Items {
			p := &pods.Items[i]
			if !Evictable(p) {
				continue
			}

			remaining++

			if p.DeletionTimestamp != nil {
				continue
			}

			err := a.f.admin.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{
				ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
			})
			if err != nil && !apierrors.IsNotFound(err) {
				lastErr = fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)
			}
		}

		if remaining == 0 {
			return nil
		}

		if time.Now().After(deadline) {
			if lastErr == nil {
				lastErr = errors.New("pods still terminating")
			}

			return fmt.Errorf("drain of %s timed out: %w", node, lastErr)
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// provision creates a server now, from the template it holds now, whose Node joins after d (a
// real server's provisioning and boot): until then the status counts it as target only.
func (a *autoscaler) provision(d time.Duration) (string, error) {
	a.mu.Lock()
	cfg, err := a.template, a.templateErr
	name := a.f.autoscaledName()
	a.provisioning = append(a.provisioning, name)
	a.mu.Unlock()

	if err != nil {
		return "", fmt.Errorf("autoscaler: no machine from the node template it read at its start: %w", err)
	}

	a.publish(a.f.ctx)

	go func() {
		defer func() {
			a.mu.Lock()
			a.provisioning = slices.DeleteFunc(a.provisioning, func(n string) bool { return n == name })
			a.mu.Unlock()
			a.publish(a.f.ctx)
		}()

		select {
		case <-a.f.ctx.Done():
			return
		case <-time.After(d):
		}

		if _, err := a.f.addMachine(a.f.ctx, name, RoleWorker, true, Credential{}, cfg); err != nil {
			a.f.log.Warn("autoscaler: a provisioned server did not join", "node", name, "error", err)
		}
	}()

	a.f.log.Info("autoscaler provisioning a server", "node", name, "joins_after", d)

	return name, nil
}

// StatusConfigMap is where the cluster-autoscaler publishes its own status
// (--write-status-configmap, on by default): kube-system/cluster-autoscaler-status, key "status",
// YAML. The simulation writes the fields the real one does for a node group's sizes.
const StatusConfigMap = "cluster-autoscaler-status"

// publish writes the status: the group's target (servers that exist) and how many are registered
// as Nodes and how many not yet.
func (a *autoscaler) publish(ctx context.Context) {
	nodes, err := a.managed(ctx)
	if err != nil {
		return
	}

	a.mu.Lock()
	pending := len(a.provisioning)
	a.mu.Unlock()

	status := fmt.Sprintf("time: %s\nautoscalerStatus: Running\nnodeGroups:\n- name: autoscale-cx43\n  health:\n    status: Healthy\n"+
		"    nodeCounts:\n      registered:\n        total: %d\n        ready: %d\n        notStarted: 0\n      longUnregistered: 0\n      unregistered: %d\n"+
		"    cloudProviderTarget: %d\n    minSize: 0\n    maxSize: %d\n",
		time.Now().UTC().Format("2006-01-02 15:04:05.999999999 -0700 MST"), len(nodes), len(nodes), pending, len(nodes)+pending, a.maxNodes)

	cms := a.f.admin.CoreV1().ConfigMaps("kube-system")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: StatusConfigMap, Namespace: "kube-system"}, Data: map[string]string{"status": status}}

	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, _ = cms.Create(ctx, cm, metav1.CreateOptions{})
	}
}

func (a *autoscaler) scaleUp(ctx context.Context) (*Machine, error) {
	a.mu.Lock()
	cfg, err := a.template, a.templateErr
	a.mu.Unlock()

	if err != nil {
		return nil, fmt.Errorf("autoscaler: no machine from the node template it read at its start: %w", err)
	}

	m, err := a.f.addMachine(ctx, a.f.autoscaledName(), RoleWorker, true, Credential{}, cfg)
	if err != nil {
		return nil, err
	}

	a.f.log.Info("autoscaler added node", "node", m.Name)

	return m, nil
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}

	return false
}

func withoutTaint(taints []corev1.Taint, key string) []corev1.Taint {
	out := make([]corev1.Taint, 0, len(taints))

	for _, t := range taints {
		if t.Key != key {
			out = append(out, t)
		}
	}

	return out
}
