package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/redact"
)

// UpgradePlans is the system-upgrade-controller's Plan resource.
var UpgradePlans = schema.GroupVersionResource{Group: "upgrade.cattle.io", Version: "v1", Resource: "plans"}

// Others are the other maintenance tools as the cluster shows them (the maintenance block):
// kured's lock on its DaemonSet and its mark on a Node, the system-upgrade-controller's Plans,
// and the budgets that hold a node's drain for good.
type Others struct {
	c   *Connection
	cfg config.Others
	now func() time.Time
}

// NewOthers reads the other tools of cfg through c, judging TTLs by now.
func NewOthers(c *Connection, cfg config.Others, now func() time.Time) *Others {
	return &Others{c: c, cfg: cfg, now: now}
}

// Holds are what keeps ghcrsync off node now: kured's lock held by another (or its mark on the
// Node), a Plan applying to it, and — unless held_drain is "wait" — a budget on its pods that
// never frees by itself. Kured or the Plans' CRD not installed holds nothing.
//
// An API in passing trouble (Transient) is asked again, up to othersRide: a blip does not fail a
// node it cannot tell is free.
func (o *Others) Holds(ctx context.Context, node string) ([]maintenance.Hold, error) {
	var out []maintenance.Hold

	err := clock.Ride(ctx, o.c.Clock, othersRide, clock.Every(time.Second), transientCause, func() (err error) {
		out, err = o.holds(ctx, node)

		return err
	})

	return out, err
}

// othersRide bounds how long the other tools' reads ride out an API in passing trouble.
const othersRide = time.Minute

// readErr is a read of the other tools' objects that failed: its message redacted, its cause
// kept for the classification.
type readErr struct {
	msg   string
	cause error
}

func (e *readErr) Error() string { return e.msg }
func (e *readErr) Unwrap() error { return e.cause }

func readFailed(what string, err error) error {
	return &readErr{msg: what + ": " + redact.Error(err), cause: err}
}

// transientCause reports whether the read's cause is the API's passing trouble.
func transientCause(err error) bool {
	var re *readErr
	if errors.As(err, &re) {
		return answer.Transient(re.cause)
	}

	return false
}

func (o *Others) holds(ctx context.Context, node string) ([]maintenance.Hold, error) {
	var out []maintenance.Hold

	add := func(h *maintenance.Hold) {
		if h != nil {
			out = append(out, *h)
		}
	}

	n, err := o.c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
		return nil, nil // gone: the claim's guard judges that, not the other tools
	case err != nil:
		return nil, readFailed("read Node "+node+" for kured's mark", err)
	}

	add(maintenance.KuredRebooting(n.Annotations))

	if o.cfg.Kured.Name != "" {
		lock, _, err := o.KuredLock(ctx)
		if err != nil {
			return nil, err
		}

		add(lock.Holds(node, o.now()))
	}

	plans, err := o.UpgradePlans(ctx)
	if err != nil {
		return nil, err
	}

	add(maintenance.Upgrading(plans, node))

	if o.cfg.HeldDrain != config.HeldDrainWait {
		drains, err := o.drainHolds(ctx, node)
		if err != nil {
			return nil, err
		}

		out = append(out, drains...)
	}

	return out, nil
}

// drainHolds are the budgets holding node's drain that need an action (drain.Action).
func (o *Others) drainHolds(ctx context.Context, node string) ([]maintenance.Hold, error) {
	pods, err := o.c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, readFailed("list the pods on "+node, err)
	}

	pdbs, err := o.c.Client.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, readFailed("list the PodDisruptionBudgets", err)
	}

	var out []maintenance.Hold

	seen := map[string]bool{}

	for _, b := range drain.Blockers(pods.Items, pdbs.Items, nil)[node] {
		if b.NeedsAction() && !seen[b.Budget] {
			seen[b.Budget] = true
			out = append(out, maintenance.Hold{Tool: maintenance.ToolDrain, Reason: "its drain is held by a budget that needs an action: " + b.Action})
		}
	}

	return out, nil
}

// KuredLock reads kured's lock (exists false: kured's DaemonSet is not there, or none is
// configured).
func (o *Others) KuredLock(ctx context.Context) (lock maintenance.KuredLock, exists bool, err error) {
	d, lock, err := o.readKuredLock(ctx)

	return lock, d != nil, err
}

// readKuredLock is the one read of kured's DaemonSet and its lock (nil: none configured, or not
// there).
func (o *Others) readKuredLock(ctx context.Context) (*appsv1.DaemonSet, maintenance.KuredLock, error) {
	ds := o.cfg.Kured
	if ds.Name == "" {
		return nil, maintenance.KuredLock{}, nil
	}

	d, err := o.c.Client.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
		return nil, maintenance.KuredLock{}, nil
	case err != nil:
		return nil, maintenance.KuredLock{}, readFailed("read kured's DaemonSet "+ds.String()+" (maintenance.kured)", err)
	}

	lock, err := maintenance.ParseKuredLock(d.Annotations[maintenance.KuredLockAnnotation])
	if err != nil {
		return d, lock, fmt.Errorf("DaemonSet %s: %w; ghcrsync neither takes nor ignores a lock it cannot read", ds, err)
	}

	return d, lock, nil
}

// TakeKuredLock takes kured's lock for run holder's reboot of node: nil when it is taken (or kured
// is not installed), the hold when another holds it. The write is a JSON patch that tests the
// annotation's value as read, so a holder kured wrote between the read and the patch fails
// the test (not the DaemonSet's resourceVersion, which its controller moves on every status
// change); the lock is then read and judged again.
func (o *Others) TakeKuredLock(ctx context.Context, node, holder string, cordoned bool) (*maintenance.Hold, error) {
	var hold *maintenance.Hold

	err := o.changeKuredLock(ctx, func(l maintenance.KuredLock) (*string, error) {
		if hold = l.Holds(node, o.now()); hold != nil {
			return nil, nil
		}

		return l.Take(node, holder, cordoned, o.now())
	})

	return hold, err
}

// DropKuredLock takes ghcrsync's entry for node out of kured's lock (none: nothing is written).
func (o *Others) DropKuredLock(ctx context.Context, node string) error {
	return o.changeKuredLock(ctx, func(l maintenance.KuredLock) (*string, error) { return l.Drop(node) })
}

// BetweenReadAndLockPatch, when set (tests), runs between the lock's read and its patch.
var BetweenReadAndLockPatch func()

// changeKuredLock writes what change makes of the lock (nil: nothing), retrying a patch whose
// test failed with a fresh read.
func (o *Others) changeKuredLock(ctx context.Context, change func(maintenance.KuredLock) (*string, error)) error {
	ds := o.cfg.Kured

	for range casTries {
		d, lock, err := o.readKuredLock(ctx)
		if d == nil || err != nil {
			return err // none configured, not there, or unreadable
		}

		old, had := d.Annotations[maintenance.KuredLockAnnotation]

		value, err := change(lock)
		if err != nil || value == nil {
			return err
		}

		if BetweenReadAndLockPatch != nil {
			BetweenReadAndLockPatch()
		}

		_, err = o.c.Client.AppsV1().DaemonSets(ds.Namespace).Patch(ctx, ds.Name, types.JSONPatchType, lockPatch(d.Annotations != nil, had, old, *value),
			metav1.PatchOptions{FieldManager: FieldManager})

		switch {
		case err == nil:
			return nil
		case apierrors.IsInvalid(err) || apierrors.IsConflict(err) || strings.Contains(err.Error(), "test"):
			continue // the lock changed since the read: judge it again
		default:
			return fmt.Errorf("write kured's lock on DaemonSet %s: %s", ds, redact.Error(err))
		}
	}

	return fmt.Errorf("kured's lock on DaemonSet %s changed on each of %d tries; try again", ds, casTries)
}

// lockPatch is the JSON patch from the annotation as read (had, old) to value ("" removes it):
// its first operation tests the read.
func lockPatch(annotations, had bool, old, value string) []byte {
	path := "/metadata/annotations/" + strings.ReplaceAll(maintenance.KuredLockAnnotation, "/", "~1") // JSON Pointer escaping

	var ops []map[string]any

	switch {
	case !annotations:
		ops = []map[string]any{{"op": "test", "path": "/metadata/annotations", "value": nil},
			{"op": "add", "path": "/metadata/annotations", "value": map[string]string{maintenance.KuredLockAnnotation: value}}}
	case !had:
		ops = []map[string]any{{"op": "test", "path": path, "value": nil}, {"op": "add", "path": path, "value": value}}
	case value == "":
		ops = []map[string]any{{"op": "test", "path": path, "value": old}, {"op": "remove", "path": path}}
	default:
		ops = []map[string]any{{"op": "test", "path": path, "value": old}, {"op": "replace", "path": path, "value": value}}
	}

	b, _ := json.Marshal(ops)

	return b
}

// UpgradePlans are the system-upgrade-controller's Plans in maintenance.upgrade_plans (none when
// it is "" or the Plan CRD is not installed).
func (o *Others) UpgradePlans(ctx context.Context) ([]maintenance.UpgradePlan, error) {
	if o.cfg.UpgradePlans == "" {
		return nil, nil
	}

	dyn, err := o.c.Dynamic()
	if err != nil {
		return nil, err
	}

	list, err := dyn.Resource(UpgradePlans).Namespace(o.cfg.UpgradePlans).List(ctx, metav1.ListOptions{})

	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, readFailed("list the system-upgrade-controller's Plans in "+o.cfg.UpgradePlans+" (maintenance.upgrade_plans)", err)
	}

	out := make([]maintenance.UpgradePlan, 0, len(list.Items))

	for _, p := range list.Items {
		applying, _, err := unstructured.NestedStringSlice(p.Object, "status", "applying")
		if err != nil {
			return nil, fmt.Errorf("Plan %s/%s: status.applying: %w", p.GetNamespace(), p.GetName(), err)
		}

		out = append(out, maintenance.UpgradePlan{Namespace: p.GetNamespace(), Name: p.GetName(), Applying: applying})
	}

	return out, nil
}
