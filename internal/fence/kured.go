package fence

import (
	"context"
	"fmt"

	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/redact"
)

// KindKured is ghcrsync's entry in kured's reboot lock (maintenance.kured): kured reboots no node
// while it is there, so it is listed and released like a fence — after the node's own fence.
const KindKured = "kured-lock"

// Kured is kured's lock as fence reads and gives it back (cluster.Others; nil: kured is not
// configured).
type Kured interface {
	KuredLock(ctx context.Context) (lock maintenance.KuredLock, exists bool, err error)
	DropKuredLock(ctx context.Context, node string) error
}

// observeKured are ghcrsync's entries in kured's lock.
func observeKured(ctx context.Context, k Kured) ([]maintenance.OurEntry, error) {
	if k == nil {
		return nil, nil
	}

	lock, exists, err := k.KuredLock(ctx)
	if err != nil || !exists {
		return nil, err
	}

	return lock.Ours(), nil
}

// classifyKured is the report's entry for one of ghcrsync's entries in kured's lock: releasable
// as its run's fences are, and never before the node's own fence (kept, it keeps the lock).
func classifyKured(e maintenance.OurEntry, o Observation, rep Report) Fence {
	f := Fence{Kind: KindKured, Name: e.Node, Holder: e.Holder, Exists: true,
		Evidence: fmt.Sprintf("%s holds %s since %s", maintenance.KuredLockAnnotation, maintenance.KuredID(e.Node), e.Created.UTC().Format("2006-01-02T15:04:05Z"))}

	assessLiveness(&f, o)
	f.Reason = "kured's reboot lock held for ghcrsync's reboot of the node (kured reboots no node meanwhile): " + f.Reason

	for _, n := range rep.Fences {
		if n.Kind == KindNode && n.Name == e.Node && !n.Releasable {
			f.Releasable = false
			f.Reason = "kured's reboot lock stays with the node's fence, which is not releasable: " + n.Reason
		}
	}

	return f
}

// releaseKured gives kured's lock back for a node whose fence is released (kept: kept).
func releaseKured(ctx context.Context, in Inputs, f Fence, nodeKept map[string]bool) Outcome {
	if nodeKept[f.Name] {
		return Outcome{Fence: f, Message: "not released: the node's fence is still held, and kured's lock goes with it"}
	}

	err := riding(ctx, in.Clock, undoBound, func() error { return in.Kured.DropKuredLock(ctx, f.Name) })
	if err != nil {
		return Outcome{Fence: f, Message: "not released: " + redact.Error(err)}
	}

	return Outcome{Fence: f, Released: true, Message: "kured's reboot lock given back"}
}
