package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// world is the in-memory cluster the fakes share, with one log of everything done to it, in
// order, so a test can check what came before what.
type world struct {
	mu    sync.Mutex
	nodes map[string]*corev1.Node
	rv    int
	log   []string

	// Faults, keyed by node name.
	drainErr     map[string]error
	configureErr map[string]error
	probeErr     map[string]error
	// conflicts makes the next N patches of a node lose to a concurrent write (a heartbeat).
	conflicts map[string]int
	// onPatch runs before a patch lands (an operator or controller acting in that window).
	onPatch func(w *world, node string)
	// onReboot runs as a node reboots (a run script's clock moves on by a reboot's time).
	onReboot func()
	// due are events that land once a node has been read a number of times more (a controller
	// finishing, or giving up, what it started while the run waits); they run with mu held.
	due map[string]*dueEvent
	// active and staged are each node's machine-config credential digests (default "old"): a
	// live configure writes the active one, a staged configure the next boot's, which a reboot
	// makes active.
	active, staged map[string]string
	// configUpdated and criStarted are when each node's active config last changed and its
	// container runtime last started, on the world's own clock (ticks); runtimeStays makes a
	// node's runtime not restart after a live write (Talos's CRI controller stuck);
	// restartedBefore a node whose runtime restarted for another reason after the run last saw
	// it and before the write, so the write's bound (the start seen before) is older than that
	// restart, and the write's own restart comes at the runtime's second poll.
	configUpdated, criStarted map[string]time.Time
	runtimeStays              map[string]bool
	restartedBefore           map[string]bool
	restartDue                map[string]int
	ticks                     int
	// keyrings are each node's kubelet keyring (its credential digest, "" none); keyringHeld the
	// keyring an earlier rotation wrote, as the plan sees it; keyringUnread nodes whose kubelet
	// never reads its keyring.
	keyrings      map[string]string
	keyringHeld   map[string]string
	keyringUnread map[string]bool
	// heldBy are the nodes another maintenance tool holds, with its reason; kured is whether kured
	// is installed (its lock taken and given back), kuredTaken the nodes for which kured takes its
	// lock between ghcrsync's check and its write.
	heldBy     map[string]string
	kured      bool
	kuredTaken map[string]bool
}

// tick is the world's clock, one second a step from a fixed epoch: times in a transcript are
// the same on every run.
func (w *world) tick() time.Time {
	w.ticks++

	return time.Date(2026, 1, 1, 0, 0, w.ticks, 0, time.UTC)
}

func newWorld() *world {
	return &world{nodes: map[string]*corev1.Node{}, drainErr: map[string]error{}, configureErr: map[string]error{},
		probeErr: map[string]error{}, conflicts: map[string]int{}, active: map[string]string{}, staged: map[string]string{},
		due: map[string]*dueEvent{}, configUpdated: map[string]time.Time{}, criStarted: map[string]time.Time{}, runtimeStays: map[string]bool{},
		restartedBefore: map[string]bool{}, restartDue: map[string]int{},
		keyrings: map[string]string{}, keyringHeld: map[string]string{}, keyringUnread: map[string]bool{},
		heldBy: map[string]string{}, kuredTaken: map[string]bool{}}
}

// dueEvent lands on a node at its reads-th read from now.
type dueEvent struct {
	reads int
	do    func(w *world, node string)
}

// readLocked counts a read of node, landing its due event when the count is reached.
func (w *world) readLocked(node string) {
	if d := w.due[node]; d != nil {
		if d.reads--; d.reads <= 0 {
			delete(w.due, node)
			d.do(w, node)
		}
	}
}

// digestOf is a node's config digest in the fake: "new" once configured, else "old".
func digestOf(m map[string]string, node string) string {
	if d, ok := m[node]; ok {
		return d
	}

	return "old"
}

func (w *world) record(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

// addNode adds a Ready node with an InternalIP.
func (w *world) addNode(name string, controlPlane bool) {
	w.mu.Lock()
	defer w.mu.Unlock()

	w.rv++
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: strconv.Itoa(w.rv), Labels: map[string]string{}},
		Status: corev1.NodeStatus{
			NodeInfo:   corev1.NodeSystemInfo{BootID: "boot-1-" + name},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ipOf(name)}},
		},
	}

	if controlPlane {
		n.Labels[object.ControlPlaneLabel] = ""
	}

	w.nodes[name] = n
}

// edit changes a node as another writer would (bumping its resourceVersion).
func (w *world) edit(name string, f func(*corev1.Node)) {
	w.mu.Lock()
	defer w.mu.Unlock()

	w.editLocked(name, f)
}

func (w *world) editLocked(name string, f func(*corev1.Node)) {
	if n, ok := w.nodes[name]; ok {
		f(n)
		w.rv++
		n.ResourceVersion = strconv.Itoa(w.rv)
	}
}

var nodeResource = schema.GroupResource{Resource: "nodes"}

// fakeNodes is apply.Nodes over the world.
type fakeNodes struct{ w *world }

func (f fakeNodes) Get(_ context.Context, name string) (*corev1.Node, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	f.w.readLocked(name)

	n, ok := f.w.nodes[name]
	if !ok {
		return nil, apierrors.NewNotFound(nodeResource, name)
	}

	return n.DeepCopy(), nil
}

func (f fakeNodes) ControlPlanes(context.Context) ([]corev1.Node, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	var out []corev1.Node

	for _, n := range f.w.nodes {
		if _, ok := n.Labels[object.ControlPlaneLabel]; ok {
			out = append(out, *n.DeepCopy())
		}
	}

	return out, nil
}

// CASPatch behaves like cluster.Connection.CASPatch against a server that checks the
// resourceVersion: a write in between is a conflict, re-read and re-checked.
func (f fakeNodes) CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
	build func(*corev1.Node) map[string]any, between func(int)) (*corev1.Node, error) {
	for attempt := range attempts {
		if err := ctx.Err(); err != nil { // a cancelled request is never sent, as client-go's
			return nil, err
		}

		n, err := f.Get(ctx, name)
		if err != nil {
			return nil, err
		}

		if err := check(n); err != nil {
			return n, err
		}

		patch := build(n)

		if between != nil {
			between(attempt)
		}

		if out, err := f.w.patch(name, n.ResourceVersion, patch); !apierrors.IsConflict(err) {
			return out, err
		}
	}

	return nil, fmt.Errorf("%s: %w after %d attempts", name, object.ErrConflictLimit, attempts)
}

// patch applies a merge patch of annotations and spec.unschedulable if rv is current.
func (w *world) patch(name, rv string, patch map[string]any) (*corev1.Node, error) {
	if w.onPatch != nil {
		w.onPatch(w, name)
	}

	w.mu.Lock()
	defer w.mu.Unlock()

	if w.conflicts[name] > 0 {
		w.conflicts[name]--
		w.editLocked(name, func(*corev1.Node) {}) // a heartbeat lands first
	}

	n, ok := w.nodes[name]
	if !ok {
		return nil, apierrors.NewNotFound(nodeResource, name)
	}

	if n.ResourceVersion != rv {
		return nil, apierrors.NewConflict(nodeResource, name, errors.New("the object has been modified"))
	}

	w.record("patch %s %s", name, describePatch(patch))
	w.editLocked(name, func(n *corev1.Node) { applyPatch(n, patch) })

	return n.DeepCopy(), nil
}

func applyPatch(n *corev1.Node, patch map[string]any) {
	if meta, ok := patch["metadata"].(map[string]any); ok {
		if ann, ok := meta["annotations"].(map[string]any); ok {
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}

			for k, v := range ann {
				if v == nil {
					delete(n.Annotations, k)
				} else {
					n.Annotations[k] = v.(string)
				}
			}
		}
	}

	if spec, ok := patch["spec"].(map[string]any); ok {
		if u, ok := spec["unschedulable"].(bool); ok {
			n.Spec.Unschedulable = u
		}
	}
}

// describePatch names a patch by what it does: claim, phase=X, mark, release.
func describePatch(patch map[string]any) string {
	meta, _ := patch["metadata"].(map[string]any)
	ann, _ := meta["annotations"].(map[string]any)

	switch {
	case ann[object.RecordAnnotation] != nil:
		return "claim"
	case ann[object.VerifiedRevisionAnnotation] != nil:
		return "mark"
	case len(ann) > 0 && ann[object.OwnerAnnotation] == nil && hasKey(ann, object.OwnerAnnotation):
		return "release"
	case ann[object.PhaseAnnotation] != nil:
		return "phase=" + ann[object.PhaseAnnotation].(string)
	}

	b, _ := json.Marshal(patch)

	return string(b)
}

func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]

	return ok
}

func (f fakeNodes) Drain(ctx context.Context, node string, _ time.Duration, _ progress.Func, check drain.Check) error {
	if err := ctx.Err(); err != nil {
		return err
	}

	if check != nil {
		if err := check(ctx, 0); err != nil {
			return err
		}
	}

	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	f.w.record("drain %s", node)

	return f.w.drainErr[node]
}

func (f fakeNodes) Destinations(context.Context) ([]plan.Destination, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	out := make([]plan.Destination, 0, len(f.w.nodes))
	for _, n := range f.w.nodes {
		out = append(out, plan.DestinationOf(object.FromNode(n)))
	}

	return out, nil
}

func (f fakeNodes) StaticPodsReady(context.Context, string) error { return nil }

func (f fakeNodes) ProveRuntime(ctx context.Context, node string, _ plan.Probe, _ time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}

	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	f.w.record("probe %s", node)

	return f.w.probeErr[node]
}

// Changes never signals: the fake's waits poll (every millisecond in these tests).
func (fakeNodes) Changes(context.Context, string) <-chan struct{} { return nil }

// fakeTalos is apply.Talos over the world: a reboot gives the node a new boot ID at once.
type fakeTalos struct{ w *world }

// ipOf is a fake node's InternalIP: an IPv6 address that spells its name (up to 14 bytes), so
// the fake Talos can tell which node an address is.
func ipOf(name string) string {
	var b [16]byte

	b[0] = 0xfd
	copy(b[2:], name)

	return netip.AddrFrom16(b).String()
}

func nodeOfIP(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ""
	}

	b := a.As16()

	return strings.TrimRight(string(b[2:]), "\x00")
}

func (f fakeTalos) ConfigFacts(_ context.Context, at plan.Node, _ string) (*plan.TalosFacts, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	node := nodeOfIP(at.InternalIP)

	return &plan.TalosFacts{ConfiguredDigest: digestOf(f.w.active, node), StagedDigest: digestOf(f.w.staged, node), ConfigUpdated: f.w.configUpdated[node]}, nil
}

func (f fakeTalos) RuntimeStarted(_ context.Context, ip string) (time.Time, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	node := nodeOfIP(ip)
	if f.w.restartDue[node] > 0 {
		if f.w.restartDue[node]--; f.w.restartDue[node] == 0 {
			f.w.criStarted[node] = f.w.tick()
		}
	}

	return f.w.criStarted[node], nil
}

func (f fakeTalos) Configure(ctx context.Context, ip, _, _, _ string, live bool) (time.Time, error) {
	if err := ctx.Err(); err != nil { // a cancelled call is never sent, as gRPC's
		return time.Time{}, err
	}

	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	node := nodeOfIP(ip)
	f.w.record("talos configure %s live=%t", node, live)

	if err := f.w.configureErr[node]; err != nil {
		return time.Time{}, err
	}

	f.w.staged[node] = "new"
	if live && f.w.restartedBefore[node] {
		seen := f.w.criStarted[node]
		f.w.criStarted[node] = f.w.tick()
		f.w.active[node], f.w.configUpdated[node] = "new", f.w.tick()
		f.w.restartDue[node] = 2

		return seen, nil
	}

	if live {
		// Talos 1.14: the active config changes, and its CRI controller restarts the runtime.
		f.w.active[node], f.w.configUpdated[node] = "new", f.w.tick()
		if !f.w.runtimeStays[node] {
			f.w.criStarted[node] = f.w.tick()
		}
	}

	return f.w.configUpdated[node], nil
}

func (f fakeTalos) Reboot(ctx context.Context, ip string) error {
	if err := ctx.Err(); err != nil {
		return err
	}

	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	f.w.record("talos reboot %s", nodeOfIP(ip))

	if f.w.onReboot != nil {
		f.w.onReboot()
	}
	f.w.editLocked(nodeOfIP(ip), func(n *corev1.Node) { n.Status.NodeInfo.BootID = "boot-2-" + n.Name })
	f.w.active[nodeOfIP(ip)] = digestOf(f.w.staged, nodeOfIP(ip))
	f.w.configUpdated[nodeOfIP(ip)], f.w.criStarted[nodeOfIP(ip)] = f.w.tick(), f.w.tick()

	return nil
}

func (f fakeTalos) Etcd(context.Context, string) (*plan.EtcdView, error) {
	return &plan.EtcdView{}, nil
}

// Nodename: the machine at an address is the node it is taken for.
func (f fakeTalos) Nodename(_ context.Context, ip string) (string, error) { return nodeOfIP(ip), nil }

// fakeLease is a Lease whose loss a test controls.
type fakeLease struct {
	mu   sync.Mutex
	lost error
	done chan struct{}
}

func (l *fakeLease) Done() <-chan struct{} { return l.done }

// lose loses the Lease for good.
func (l *fakeLease) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	l.lost = err
	close(l.done)
}

func (l *fakeLease) Assert() error {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.lost
}

func (l *fakeLease) WaitLive(context.Context) error { return l.Assert() }

// fakeStore logs every state write with each in-progress record's phase.
type fakeStore struct {
	w      *world
	writes []*state.State
	err    error
}

func (s *fakeStore) Write(st *state.State) error {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()

	if s.err != nil {
		return s.err
	}

	st.Serial++
	s.writes = append(s.writes, st.Clone())

	for _, r := range st.Records {
		s.w.record("state %s %s %s", r.Node, r.Phase, orInProgress(r.Outcome))
	}

	return nil
}

func orInProgress(o state.Outcome) string {
	if o == "" {
		return "in-progress"
	}

	return string(o)
}

// testPlan plans the world's nodes: each needs action (fence or apply-live).
// fakeKeyrings is the keyring writer over the world's keyrings: a write gives the node the new
// credential ("new"), a remove takes it out, an await reports the kubelet's read unless the node
// is keyringUnread.
type fakeKeyrings struct {
	w   *world
	clk clock.Clock // an await the kubelet does not answer takes its step
}

func (f fakeKeyrings) Run(ctx context.Context, node string, mode keyring.Mode, rootDir string, _ time.Duration) (keyring.Report, error) {
	if err := ctx.Err(); err != nil {
		return keyring.Report{}, err
	}

	if mode == keyring.ModeAwait && f.keyringUnread(node) {
		if err := clock.Sleep(ctx, f.clk, keyring.AwaitStep); err != nil {
			return keyring.Report{}, err
		}
	}

	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	f.w.record("keyring %s %s root=%s", mode, node, rootDir)

	written := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := keyring.Report{Path: rootDir + "/config.json", Written: written}

	if held := f.w.keyrings[node]; held != "" {
		r.Before = []string{held}
	}

	switch mode {
	case keyring.ModeWrite:
		f.w.keyrings[node] = "new"
	case keyring.ModeRemove:
		delete(f.w.keyrings, node)
	case keyring.ModeAwait:
		if !f.w.keyringUnread[node] {
			r.ReadAt = written.Add(time.Minute)
		}
	}

	r.After = f.w.keyrings[node]

	return r, nil
}

func (f fakeKeyrings) keyringUnread(node string) bool {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	return f.w.keyringUnread[node]
}

func testPlan(w *world, action plan.Action, names ...string) *plan.Plan {
	p := &plan.Plan{CredentialRevision: "rev-new", AuthDigest: "new"}

	for i, name := range names {
		n, _ := fakeNodes{w}.Get(context.Background(), name)
		obs := object.FromNode(n)

		role := plan.RoleWorker
		if obs.ControlPlane {
			role = plan.RoleControlPlane
		}

		p.Nodes = append(p.Nodes, plan.NodePlan{
			Name: name, UID: obs.UID, Role: role, Action: action, Order: i + 1, Keyring: w.keyringHeld[name],
			Invariants: plan.Invariants{UID: obs.UID, Unschedulable: obs.Unschedulable, SchedulingTaints: []string{},
				BootID: obs.BootID, ConfiguredDigest: "old", ControlPlane: obs.ControlPlane},
		})
	}

	return p
}

// ListNodes and ReadNode make fakeNodes fence's Nodes port too (fence.Reclaim, fence.Undo).
func (f fakeNodes) ListNodes(context.Context) ([]corev1.Node, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	out := make([]corev1.Node, 0, len(f.w.nodes))
	for _, name := range sortedKeys(f.w.nodes) {
		out = append(out, *f.w.nodes[name].DeepCopy())
	}

	return out, nil
}

func (f fakeNodes) ReadNode(ctx context.Context, name string) (*corev1.Node, error) {
	return f.Get(ctx, name)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}

	slices.Sort(keys)

	return keys
}

// fakeOthers are the other maintenance tools of the world: a node another tool holds, and kured's
// lock (taken and given back, logged, when kured is installed).
type fakeOthers struct{ w *world }

func (f fakeOthers) Holds(_ context.Context, node string) ([]maintenance.Hold, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	f.w.record("others %s", node)

	if why := f.w.heldBy[node]; why != "" {
		return []maintenance.Hold{{Tool: "test", Reason: why}}, nil
	}

	return nil, nil
}

func (f fakeOthers) TakeKuredLock(_ context.Context, node, holder string, _ bool) (*maintenance.Hold, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	switch {
	case !f.w.kured:
		return nil, nil
	case f.w.kuredTaken[node]:
		return &maintenance.Hold{Tool: maintenance.ToolKured, Reason: "kured's reboot lock is held by w-kured"}, nil
	}

	f.w.record("kured lock %s %s", node, holder)

	return nil, nil
}

func (f fakeOthers) DropKuredLock(_ context.Context, node string) error {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()

	if f.w.kured {
		f.w.record("kured unlock %s", node)
	}

	return nil
}
