// Package taints holds the one rule for comparing a node's scheduling taints across time.
//
// Some taints change all the time for reasons that do not matter to a fence: the cluster
// autoscaler re-writes DeletionCandidateOfClusterAutoscaler with a new timestamp every ~10 s,
// node.kubernetes.io/unschedulable mirrors spec.unschedulable, and the lifecycle taints
// (not-ready, unreachable, cilium's agent-not-ready) mirror readiness with a controller's lag
// (a node is often Ready for a moment before its not-ready taint goes). Readiness is checked on
// its own, from the Ready condition, where a phase requires it. Everything else — including
// ToBeDeletedByClusterAutoscaler, which means deletion has started — is a genuine change.
package taints

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Taint keys ghcrsync knows by name.
const (
	Unschedulable       = "node.kubernetes.io/unschedulable"
	NotReady            = "node.kubernetes.io/not-ready"
	Unreachable         = "node.kubernetes.io/unreachable"
	CiliumAgentNotReady = "node.cilium.io/agent-not-ready"
	DeletionCandidate   = "DeletionCandidateOfClusterAutoscaler"
	ToBeDeleted         = "ToBeDeletedByClusterAutoscaler"
	// Steering is ghcrsync's own taint: on every node a run will rotate and has not rotated
	// yet, so that evicted pods land on rotated nodes (PreferNoSchedule in an ordinary run,
	// NoSchedule where a node not yet rotated cannot pull). Its value is the run's token
	// (RunToken). It is ghcrsync's own mutation, never a change made by someone else.
	Steering = "ghcrsync.dev/rotation-pending"
)

// The effects of the steering taint.
const (
	PreferNoSchedule = "PreferNoSchedule"
	NoSchedule       = "NoSchedule"
	NoExecute        = "NoExecute"
)

// RunToken is the steering taint's value for a run's holder id: a taint value is at most 63
// characters of [A-Za-z0-9._-], which a holder id is not.
func RunToken(holder string) string {
	sum := sha256.Sum256([]byte(holder))

	return "run-" + hex.EncodeToString(sum[:8])
}

// Hard reports whether a taint keeps pods that do not tolerate it off the node.
func Hard(t Taint) bool { return t.Effect == NoSchedule || t.Effect == NoExecute }

// Taint is a node taint, independent of the Kubernetes API types.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// String is the canonical form key[=value]:Effect.
func (t Taint) String() string {
	if t.Value == "" {
		return t.Key + ":" + t.Effect
	}

	return t.Key + "=" + t.Value + ":" + t.Effect
}

// Lifecycle reports whether key is a readiness taint that appears while a node reboots.
func Lifecycle(key string) bool {
	return key == NotReady || key == Unreachable || key == CiliumAgentNotReady
}

// HasLifecycle reports whether any of ts is a lifecycle taint.
func HasLifecycle(ts []Taint) bool {
	return slices.ContainsFunc(ts, func(t Taint) bool { return Lifecycle(t.Key) })
}

// Since reads the instant an autoscaler taint carries as its value (unix seconds, as the cluster
// autoscaler writes it). Anything but a plain integer is not an instant.
func Since(t Taint) (time.Time, bool) {
	sec, err := strconv.ParseInt(t.Value, 10, 64)
	if err != nil {
		return time.Time{}, false
	}

	return time.Unix(sec, 0).UTC(), true
}

// Scheduling returns the taints that define a node's scheduling state, canonical and sorted:
// without the unschedulable mirror, the advisory autoscaler candidate, the lifecycle taints, and
// ghcrsync's own steering taint (its run put it there: not someone else's change).
func Scheduling(ts []Taint) []string {
	out := make([]string, 0, len(ts))

	for _, t := range ts {
		if t.Key == Unschedulable || t.Key == DeletionCandidate || t.Key == Steering || Lifecycle(t.Key) {
			continue
		}

		out = append(out, t.String())
	}

	slices.Sort(out)

	return slices.Compact(out)
}

// Diff lists what changed between two Scheduling results: added and removed taints.
func Diff(before, after []string) (added, removed []string) {
	for _, t := range after {
		if !slices.Contains(before, t) {
			added = append(added, t)
		}
	}

	for _, t := range before {
		if !slices.Contains(after, t) {
			removed = append(removed, t)
		}
	}

	return added, removed
}

// DescribeDiff renders a Diff as "+ a, - b" for messages.
func DescribeDiff(added, removed []string) string {
	parts := make([]string, 0, len(added)+len(removed))
	for _, a := range added {
		parts = append(parts, "+ "+a)
	}

	for _, r := range removed {
		parts = append(parts, "- "+r)
	}

	return strings.Join(parts, ", ")
}

// Find returns the taint with key.
func Find(ts []Taint, key string) (Taint, bool) {
	for _, t := range ts {
		if t.Key == key {
			return t, true
		}
	}

	return Taint{}, false
}
