// Package maintenance is what the other tools that drain and reboot nodes say about a node, and
// how ghcrsync shares their locks (pure, no client): kured's lock on its DaemonSet (both the
// single-holder and the multi-holder form kured writes, read as kured's own
// pkg/daemonsetlock reads it), kured's reboot-in-progress mark on a Node, a
// system-upgrade-controller Plan applying to a node (its status.applying), and a Talos machine
// in a stage that is someone else's maintenance (upgrading, rebooting, …). A hold by another
// tool defers a node: it is never ghcrsync's to break, and never a failure.
package maintenance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Tools, as a Hold names them.
const (
	ToolKured = "kured"
	ToolSUC   = "system-upgrade-controller"
	ToolTalos = "talos"
	ToolDrain = "drain"
)

// Hold is one other maintenance that keeps ghcrsync off a node now.
type Hold struct {
	Tool   string `json:"tool"`
	Reason string `json:"reason"`
}

func (h Hold) String() string { return h.Tool + ": " + h.Reason }

// Sentence joins holds into the sentence a deferred node's message carries.
func Sentence(hs []Hold) string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Reason
	}

	return strings.Join(out, "; ")
}

// kured's lock, as kured's pkg/daemonsetlock writes it on its DaemonSet.
const (
	// KuredLockAnnotation is the DaemonSet annotation kured's lock lives in (kured's
	// --lock-annotation default).
	KuredLockAnnotation = "weave.works/kured-node-lock"
	// KuredRebootInProgressAnnotation is what kured (--annotate-nodes) puts on a Node it is about
	// to reboot, and takes off when the reboot is done.
	KuredRebootInProgressAnnotation = "weave.works/kured-reboot-in-progress"
	// kuredIDPrefix marks ghcrsync's own lock entries. It is never a node name: kured treats a
	// lock whose nodeID is its own node's as its own, and would uncordon the node and release
	// the lock in the middle of ghcrsync's reboot.
	kuredIDPrefix = "ghcrsync/"
)

// KuredID is the nodeID ghcrsync holds kured's lock under for its reboot of node.
func KuredID(node string) string { return kuredIDPrefix + node }

// KuredNode is the node of a lock entry ghcrsync holds ("" for anyone else's).
func KuredNode(id string) string {
	n, ok := strings.CutPrefix(id, kuredIDPrefix)
	if !ok {
		return ""
	}

	return n
}

// KuredHolder is one entry of kured's lock. Metadata is kept as written, so an entry of another
// holder goes back exactly as it came.
type KuredHolder struct {
	NodeID   string          `json:"nodeID"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	Created  time.Time       `json:"created"`
	TTL      time.Duration   `json:"TTL"`
}

// expired is kured's own rule: a TTL of 0 never expires.
func (h KuredHolder) expired(now time.Time) bool { return h.TTL > 0 && now.Sub(h.Created) >= h.TTL }

// KuredLock is kured's lock annotation read: one holder (kured's default, --concurrency 1) or
// up to MaxOwners (the multi-holder form, --concurrency > 1).
type KuredLock struct {
	Multi     bool
	MaxOwners int
	Holders   []KuredHolder
}

type multiLock struct {
	MaxOwners int           `json:"maxOwners"`
	Locks     []KuredHolder `json:"locks"`
}

// ParseKuredLock reads the annotation's value ("" or absent: no holder). A value in neither form
// is an error: a lock ghcrsync cannot read is a lock it does not take or ignore.
func ParseKuredLock(value string) (KuredLock, error) {
	if strings.TrimSpace(value) == "" {
		return KuredLock{}, nil
	}

	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(value), &keys); err != nil {
		return KuredLock{}, fmt.Errorf("kured's lock annotation %s is not JSON: %w", KuredLockAnnotation, err)
	}

	if _, ok := keys["locks"]; ok {
		var m multiLock
		if err := json.Unmarshal([]byte(value), &m); err != nil {
			return KuredLock{}, fmt.Errorf("kured's multi-holder lock annotation %s: %w", KuredLockAnnotation, err)
		}

		return KuredLock{Multi: true, MaxOwners: m.MaxOwners, Holders: m.Locks}, nil
	}

	if _, ok := keys["nodeID"]; !ok {
		return KuredLock{}, fmt.Errorf("kured's lock annotation %s holds neither a nodeID nor locks", KuredLockAnnotation)
	}

	var h KuredHolder
	if err := json.Unmarshal([]byte(value), &h); err != nil {
		return KuredLock{}, fmt.Errorf("kured's lock annotation %s: %w", KuredLockAnnotation, err)
	}

	return KuredLock{Holders: []KuredHolder{h}}, nil
}

// Live are the holders whose TTL has not expired.
func (l KuredLock) Live(now time.Time) []KuredHolder {
	return slices.DeleteFunc(slices.Clone(l.Holders), func(h KuredHolder) bool { return h.expired(now) })
}

// Others are the live holders other than ghcrsync's entry for node.
func (l KuredLock) Others(node string, now time.Time) []KuredHolder {
	return slices.DeleteFunc(l.Live(now), func(h KuredHolder) bool { return h.NodeID == KuredID(node) })
}

// Holds is kured's lock as a hold on node, or nil when ghcrsync may take it: in the single form,
// any live holder but ghcrsync's entry for node holds it; in the multi form, as kured judges,
// only when every one of its MaxOwners places is taken by a live holder (ghcrsync's entry for
// node, once taken, is its place).
func (l KuredLock) Holds(node string, now time.Time) *Hold {
	others := l.Others(node, now)
	if len(others) == 0 || l.Multi && (len(others) < len(l.Live(now)) || len(others) < l.MaxOwners) {
		return nil // free, or ghcrsync holds a place for node already
	}

	ids := make([]string, len(others))
	for i, h := range others {
		ids[i] = h.NodeID
	}

	return &Hold{Tool: ToolKured, Reason: fmt.Sprintf("kured's reboot lock (%s) is held by %s: kured is rebooting %s, and ghcrsync waits for it "+
		"as kured waits for ghcrsync", KuredLockAnnotation, strings.Join(ids, ", "), strings.Join(ids, ", "))}
}

// Take is the annotation's value with ghcrsync's entry for node added (created now, no TTL, its
// metadata saying whether the node was cordoned, as kured's does, and which run holds it): nil
// when the lock holds node (Holds), the value unchanged when the entry is there already.
// Expired entries are dropped.
func (l KuredLock) Take(node, holder string, cordoned bool, now time.Time) (*string, error) {
	if l.Holds(node, now) != nil {
		return nil, nil
	}

	meta, _ := json.Marshal(kuredMeta{Unschedulable: cordoned, Holder: holder})
	mine := KuredHolder{NodeID: KuredID(node), Metadata: meta, Created: now.UTC().Truncate(time.Second)}

	live := l.Live(now)
	if i := slices.IndexFunc(live, func(h KuredHolder) bool { return h.NodeID == mine.NodeID }); i >= 0 {
		return l.value(live)
	}

	return l.value(append(live, mine))
}

// Drop is the annotation's value without ghcrsync's entry for node (nil: it has none, nothing to
// write); "" means the annotation is removed (the single form, as kured's Release does).
func (l KuredLock) Drop(node string) (*string, error) {
	i := slices.IndexFunc(l.Holders, func(h KuredHolder) bool { return h.NodeID == KuredID(node) })
	if i < 0 {
		return nil, nil
	}

	return l.value(slices.Delete(slices.Clone(l.Holders), i, i+1))
}

// kuredMeta is an entry's metadata as ghcrsync writes it: kured's NodeMeta, and the run.
type kuredMeta struct {
	Unschedulable bool   `json:"unschedulable"`
	Holder        string `json:"ghcrsync_holder,omitempty"`
}

// OurEntry is one of ghcrsync's entries in kured's lock: the node rebooted, the run holding it.
type OurEntry struct {
	Node, Holder string
	Created      time.Time
}

// Ours are ghcrsync's entries in the lock.
func (l KuredLock) Ours() []OurEntry {
	var out []OurEntry

	for _, h := range l.Holders {
		if n := KuredNode(h.NodeID); n != "" {
			var m kuredMeta
			_ = json.Unmarshal(h.Metadata, &m) // an entry without its run is judged as one whose run is unknown

			out = append(out, OurEntry{Node: n, Holder: m.Holder, Created: h.Created})
		}
	}

	return out
}

// value renders holders in the lock's own form.
func (l KuredLock) value(holders []KuredHolder) (*string, error) {
	var (
		b   []byte
		err error
	)

	switch {
	case l.Multi:
		b, err = json.Marshal(multiLock{MaxOwners: l.MaxOwners, Locks: orEmpty(holders)})
	case len(holders) == 0:
		empty := ""

		return &empty, nil
	default:
		b, err = json.Marshal(holders[0])
	}

	if err != nil {
		return nil, err
	}

	s := string(bytes.TrimSpace(b))

	return &s, nil
}

func orEmpty(hs []KuredHolder) []KuredHolder {
	if hs == nil {
		return []KuredHolder{}
	}

	return hs
}

// KuredRebooting is kured's reboot-in-progress mark on a Node (annotations), as a hold.
func KuredRebooting(annotations map[string]string) *Hold {
	since, ok := annotations[KuredRebootInProgressAnnotation]
	if !ok {
		return nil
	}

	return &Hold{Tool: ToolKured, Reason: fmt.Sprintf("kured marked the node as rebooting (%s since %s)", KuredRebootInProgressAnnotation, since)}
}

// UpgradePlan is a system-upgrade-controller Plan (upgrade.cattle.io/v1) as read: the nodes its
// status says it is applying to now.
type UpgradePlan struct {
	Namespace, Name string
	Applying        []string
}

// Upgrading is the hold of the Plans applying to node.
func Upgrading(plans []UpgradePlan, node string) *Hold {
	var names []string

	for _, p := range plans {
		if slices.Contains(p.Applying, node) {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}

	if len(names) == 0 {
		return nil
	}

	return &Hold{Tool: ToolSUC, Reason: fmt.Sprintf("system-upgrade-controller Plan %s is applying to the node (status.applying): its upgrade job cordons, "+
		"drains and may reboot it", strings.Join(names, ", "))}
}

// busyStages are the Talos machine stages (MachineStatus .stage) of maintenance: a machine in one
// of them before ghcrsync claimed it is someone else's (talosctl upgrade or reboot, an upgrade
// controller, a reset).
var busyStages = []string{"installing", "upgrading", "rebooting", "shutting down", "resetting", "booting", "maintenance"}

// Staged is the hold of a machine in stage (as Talos names it: "upgrading", "rebooting", …).
func Staged(stage string) *Hold {
	s := strings.ToLower(strings.ReplaceAll(stage, "_", " "))
	if !slices.Contains(busyStages, s) {
		return nil
	}

	return &Hold{Tool: ToolTalos, Reason: fmt.Sprintf("its Talos machine is %s (someone else's maintenance: talosctl upgrade or reboot, an upgrade controller)", s)}
}
