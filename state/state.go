// Package state holds ghcrsync's state: its identity (lineage, serial), the run, and one record
// per fence. apply writes it before every mutation, so that a kill -9 at any point leaves a
// state that tells the truth about what may have been done.
package state

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// FormatVersion is the state file's format.
const FormatVersion = "1"

// Phase is where a node's transaction is: the same word in the state file, the node's
// ghcrsync.dev/phase annotation, `fences` and `release`.
type Phase string

// The phases, in order. A record's phase is the last step whose mutation may have started.
const (
	PhaseSelected   Phase = "selected"
	PhaseClaimed    Phase = "claimed"
	PhaseGuarded    Phase = "guarded"
	PhaseDrained    Phase = "drained"
	PhaseConfigured Phase = "configured"
	// PhaseKeyring: the kubelet's node keyring is being written (or emptied of the registry's
	// entry) by a writer pod on the node: the kubelet-keyring path, and a fenced node whose keyring
	// an earlier rotation wrote.
	PhaseKeyring   Phase = "keyring-written"
	PhaseRebooting Phase = "rebooting"
	PhaseReady     Phase = "ready"
	PhaseProved    Phase = "proved"
	PhaseReleased  Phase = "released"
)

// Phases lists every phase, in order.
var Phases = []Phase{PhaseSelected, PhaseClaimed, PhaseGuarded, PhaseDrained, PhaseConfigured, PhaseKeyring, PhaseRebooting, PhaseReady, PhaseProved, PhaseReleased}

// AtOrAfter reports whether p is at or past q.
func (p Phase) AtOrAfter(q Phase) bool {
	pi, qi := -1, -1

	for i, x := range Phases {
		if x == p {
			pi = i
		}

		if x == q {
			qi = i
		}
	}

	return pi >= qi && qi >= 0
}

// TalosWritten reports whether, at phase p, the node's Talos config may have been written: from
// here on, the machine may have changed, so a fence stays until the node is proved (or released
// by hand) and is never undone as if nothing happened.
func (p Phase) TalosWritten() bool { return p.AtOrAfter(PhaseConfigured) }

// Outcome is how a node's transaction ended ("" while it runs).
type Outcome string

// Outcomes of a record.
const (
	OutcomeInProgress        Outcome = ""
	OutcomeDone              Outcome = "done"
	OutcomeDeselected        Outcome = "deselected"
	OutcomeGoneAfterMutation Outcome = "gone-after-mutation"
	OutcomeFailed            Outcome = "failed"
	// OutcomeReleased is a fence undone by `ghcrsync release` (or apply's reclaim).
	OutcomeReleased Outcome = "released"
	// OutcomeCancelled is a transaction stopped by a signal: before its Talos write the claim was
	// undone; after it, the fence stays, recorded at its phase.
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeSkipped is a node never started (the run was cancelled, or its failure budget spent).
	OutcomeSkipped Outcome = "skipped"
	// OutcomeDeferred is a node not started because its estimate did not fit in what was left of
	// the run's time budget: the next run rotates it (a continuation, not a failure).
	OutcomeDeferred Outcome = "deferred"
)

// ActionApplyLive is a record's action when the node's Talos reloads the credential live: no
// claim, no cordon, no reboot (plan.ActionApplyLive).
const ActionApplyLive = "apply-live"

// ActionKeyring is a record's action when the node's Talos cannot reload the credential live and
// its kubelet's node keyring takes it instead: the Talos config written live, the keyring written
// by a pod on the node, the runtime proved — no claim, no cordon, no drain, no reboot, no restart
// (plan.ActionKeyring).
const ActionKeyring = "kubelet-keyring"

// Store is a state backend.
type Store interface {
	Read() (*State, error)
	Write(*State) error
	Lock() error
	Unlock()
	Describe() string
}

// State is the whole state.
type State struct {
	FormatVersion string         `json:"format_version"`
	Lineage       string         `json:"lineage"`
	Serial        int64          `json:"serial"`
	Run           *Run           `json:"run,omitempty"`
	Records       []Record       `json:"records"`
	Secrets       []SecretRecord `json:"secrets,omitempty"`
	// Steered are the nodes that may carry a run's steering taint (taints.Steering).
	Steered []Steer `json:"steered,omitempty"`
	// Suspended are the Flux Kustomizations a run may have suspended (the flux block).
	Suspended []Suspension `json:"suspended,omitempty"`
	// Rotation is the rotation to a credential revision that one run or several carry out (a run
	// stopped by its time budget leaves the rest to the next).
	Rotation *Rotation `json:"rotation,omitempty"`
	// Samples are how long the last rotated nodes took, step by step: the estimate's record.
	Samples []Sample `json:"samples,omitempty"`
}

// Rotation is a rotation to one credential revision, across the runs that carry it out.
type Rotation struct {
	Revision  string     `json:"revision"`
	Started   time.Time  `json:"started"`
	StartedBy string     `json:"started_by"` // the first run's holder id
	Runs      int        `json:"runs"`
	Done      []string   `json:"done,omitempty"` // the nodes rotated in it so far
	Finished  *time.Time `json:"finished,omitempty"`
}

// Begin records that a run (holder) carries out the rotation to revision: a new rotation, or
// the next run of the one in progress.
func (s *State) Begin(revision, holder string, now time.Time) {
	if r := s.Rotation; r != nil && r.Revision == revision && r.Finished == nil {
		r.Runs++

		return
	}

	s.Rotation = &Rotation{Revision: revision, Started: now.UTC(), StartedBy: holder, Runs: 1}
}

// Rotated records that node was rotated in the rotation in progress.
func (s *State) Rotated(node string) {
	if r := s.Rotation; r != nil && r.Finished == nil && !slices.Contains(r.Done, node) {
		r.Done = append(r.Done, node)
	}
}

// Sample is how long one node's rotation took: in all and by step (seconds).
type Sample struct {
	Node     string             `json:"node"`
	Class    string             `json:"class"`
	Run      string             `json:"run"`
	Finished time.Time          `json:"finished"`
	Seconds  float64            `json:"seconds"`
	Steps    map[string]float64 `json:"steps,omitempty"`
}

// MaxSamples bounds the record: the estimate reads the latest ones of each class.
const MaxSamples = 200

// AddSample records a finished rotation's durations, keeping the latest MaxSamples.
func (s *State) AddSample(x Sample) {
	s.Samples = append(s.Samples, x)
	if n := len(s.Samples); n > MaxSamples {
		s.Samples = slices.Clone(s.Samples[n-MaxSamples:])
	}
}

// Suspension records a run's suspension of one Flux Kustomization: written before the
// suspension, dropped once it is confirmed resumed (or found not to be the run's). A run killed
// meanwhile leaves it to `ghcrsync release`, which resumes it.
type Suspension struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       string    `json:"uid,omitempty"`
	Owner     string    `json:"owner"`
	Added     time.Time `json:"added"`
}

// PutSuspension records that owner may have suspended the Kustomization.
func (s *State) PutSuspension(x Suspension) {
	s.DropSuspension(x.Namespace, x.Name, x.Owner)
	s.Suspended = append(s.Suspended, x)
}

// DropSuspension forgets owner's suspension of the Kustomization (it is confirmed lifted).
func (s *State) DropSuspension(namespace, name, owner string) {
	s.Suspended = slices.DeleteFunc(s.Suspended, func(x Suspension) bool {
		return x.Namespace == namespace && x.Name == name && x.Owner == owner
	})
}

// Steer records ghcrsync's steering taint on one node: written before the taint is put on, and
// dropped once it is confirmed off. Like a cordon, a run killed meanwhile leaves it to release.
type Steer struct {
	Node   string    `json:"node"`
	UID    string    `json:"uid"`
	Owner  string    `json:"owner"`
	Effect string    `json:"effect"`
	Added  time.Time `json:"added"`
}

// TakeSteer records x as the only steering of its node: a run's steering taint replaces any
// other on the node (one taint per key), an earlier run's left by its death included.
func (s *State) TakeSteer(x Steer) {
	s.Steered = slices.DeleteFunc(s.Steered, func(y Steer) bool { return y.Node == x.Node })
	s.Steered = append(s.Steered, x)
}

// DropSteer forgets owner's steering taint on node (it is confirmed off).
func (s *State) DropSteer(node, owner string) {
	s.Steered = slices.DeleteFunc(s.Steered, func(x Steer) bool { return x.Node == node && x.Owner == owner })
}

// SecretRecord is what the fan-out wrote, or is writing, to one pull secret (digests only). A
// half-done fan-out is not a fence, but the state says what was written.
type SecretRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	// Credential is the tenant credential it receives ("": the cluster credential).
	Credential      string    `json:"credential,omitempty"`
	DesiredRevision string    `json:"desired_revision"`
	Outcome         string    `json:"outcome"` // SecretWriting, then what the write became
	Updated         time.Time `json:"updated"`
}

// SecretWriting is a pull secret's record while its write is in flight (written before the
// write, like a node's phase): left by a run that died mid-write.
const SecretWriting = "writing"

// PutSecret replaces or appends a pull secret's record.
func (s *State) PutSecret(r SecretRecord) {
	for i := range s.Secrets {
		if s.Secrets[i].Namespace == r.Namespace && s.Secrets[i].Name == r.Name {
			s.Secrets[i] = r

			return
		}
	}

	s.Secrets = append(s.Secrets, r)
}

// Run describes the last apply.
type Run struct {
	Holder             string     `json:"holder"`
	CredentialRevision string     `json:"credential_revision"`
	Started            time.Time  `json:"started"`
	Finished           *time.Time `json:"finished,omitempty"`
	Outcome            string     `json:"outcome,omitempty"`
}

// Fence is what it takes to undo a fence without asking anyone: the node's identity, its
// scheduling state before the claim, and whether the autoscaler's scale-down guard is ghcrsync's.
// The same JSON is the node's recovery annotation and part of the state's record.
type Fence struct {
	UID                string   `json:"uid"`
	WasCordoned        bool     `json:"was_cordoned"`
	InitialTaints      []string `json:"initial_taints"`
	DesiredRevision    string   `json:"desired_revision"`
	ScaleDownGuardOurs bool     `json:"scale_down_guard_ours"`
	// HeldUnproven: the node was cordoned by an earlier run's unproven hold when claimed (its
	// Talos config written, its runtime never proved): the cordon is ghcrsync's, and it stays
	// until a proof (WasCordoned is false for it).
	HeldUnproven bool `json:"held_unproven,omitempty"`
	// KuredLock: ghcrsync took (or was about to take) kured's lock for this node's reboot
	// (maintenance.kured); recorded before the write, given back when the fence is.
	KuredLock bool `json:"kured_lock,omitempty"`
}

// Unproven reports whether a fence undone at phase may return a node to service with no proof
// that its runtime pulls with the credential its Talos config holds: its config was written (by
// this fence, or before it: HeldUnproven). Whether a proof followed is the node's to say (its
// verified marker for DesiredRevision on its current boot: cluster.ReleasePatch checks it; the
// phase "proved" is recorded before the proof, so a failed proof carries it too). Such a node
// keeps its cordon (an unproven hold) until a run proves it or a person says otherwise.
func (f Fence) Unproven(phase Phase) bool {
	return phase.TalosWritten() || f.HeldUnproven
}

// Record is what ghcrsync did, or is doing, to one node.
type Record struct {
	Node   string `json:"node"`
	Owner  string `json:"owner"`
	Action string `json:"action"`
	Phase  Phase  `json:"phase"`
	Fence
	BootBefore string     `json:"boot_id_before,omitempty"`
	BootAfter  string     `json:"boot_id_after,omitempty"`
	Started    time.Time  `json:"started"`
	Updated    time.Time  `json:"updated"`
	Outcome    Outcome    `json:"outcome,omitempty"`
	Reason     string     `json:"reason,omitempty"` // the reason code of a deselection or refusal
	LastError  string     `json:"last_error,omitempty"`
	Finished   *time.Time `json:"finished,omitempty"`
}

// Terminal reports whether the record's transaction has ended.
func (r Record) Terminal() bool { return r.Outcome != OutcomeInProgress }

// Holds reports whether the record may still hold a fence on the cluster: a transaction still in
// progress (or killed), or one that ended failed or cancelled after its claim landed and before
// its release. A node whose claim never landed (refused at selection) holds nothing.
func (r Record) Holds() bool {
	switch {
	case r.Action == ActionApplyLive || r.Action == ActionKeyring:
		return false // a live or keyring rotation claims and cordons nothing
	case !r.Terminal():
		return true
	case r.Phase == PhaseReleased:
		return false
	}

	return (r.Outcome == OutcomeFailed || r.Outcome == OutcomeCancelled) && r.Phase.AtOrAfter(PhaseClaimed)
}

// Record returns the record for node, or nil.
func (s *State) Record(node string) *Record {
	for i := range s.Records {
		if s.Records[i].Node == node {
			return &s.Records[i]
		}
	}

	return nil
}

// Put replaces node's record, or appends it.
func (s *State) Put(r Record) {
	if cur := s.Record(r.Node); cur != nil {
		*cur = r

		return
	}

	s.Records = append(s.Records, r)
}

// Clone deep-copies the state.
func (s *State) Clone() *State {
	b, _ := json.Marshal(s)

	var out State
	_ = json.Unmarshal(b, &out)

	return &out
}

// Local is the local-file backend: one JSON file, written atomically (temp file, fsync,
// rename, fsync of the folder), 0600, with an exclusive lock while a command holds it.
type Local struct {
	Path string
	lock *os.File
}

// Read reads the state. A missing file is an empty state (no lineage yet).
func (l *Local) Read() (*State, error) { return ReadLocal(l.Path) }

// Describe names the backend.
func (l *Local) Describe() string { return "local file " + l.Path }

// ReadLocal reads a local state file. A missing file is an empty state.
func ReadLocal(path string) (*State, error) {
	data, err := readlimit.File(path, readlimit.State)
	if errors.Is(err, fs.ErrNotExist) {
		return &State{FormatVersion: FormatVersion}, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}

	s, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("state file %s %w", path, err)
	}

	return s, nil
}

// UnreadableError is a state this ghcrsync cannot read: corrupt, or of another format (Newer).
// The commands that repair a wedge (fences, release, state push) carry on without it.
type UnreadableError struct {
	Newer bool
	msg   string
}

func (e *UnreadableError) Error() string { return e.msg }

// Decode reads a state's JSON. Its errors (UnreadableError) read after "state file PATH ".
func Decode(data []byte) (*State, error) {
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, &UnreadableError{msg: fmt.Sprintf("is corrupt (%s): restore it from a backup, or inspect the cluster with `ghcrsync fences`", jsonErr(err))}
	}

	if s.FormatVersion != FormatVersion {
		return nil, &UnreadableError{Newer: true,
			msg: fmt.Sprintf("has format_version %q; this ghcrsync reads %q: use the ghcrsync version that wrote it", s.FormatVersion, FormatVersion)}
	}

	for i, r := range s.Records {
		switch {
		case r.Node == "":
			return nil, &UnreadableError{msg: fmt.Sprintf("is corrupt (record %d names no node): restore it from a backup, or inspect the cluster with `ghcrsync fences`", i)}
		case r.UID == "" && r.Holds():
			// Without the uid a fence's node cannot be told from a new Node of the same name: its
			// removal could never be proved, nor its release be known to touch the right object.
			return nil, &UnreadableError{msg: fmt.Sprintf("is corrupt (record %d, node %q, holds a fence but has no uid): restore it from a backup, or inspect the cluster with `ghcrsync fences`", i, r.Node)}
		}
	}

	for i, x := range s.Steered {
		if x.Node == "" || x.UID == "" || x.Owner == "" {
			return nil, &UnreadableError{msg: fmt.Sprintf("is corrupt (steering record %d lacks its node, uid or owner): restore it from a backup, or inspect the cluster with `ghcrsync fences`", i)}
		}
	}

	for i, x := range s.Suspended {
		if x.Namespace == "" || x.Name == "" || x.Owner == "" {
			return nil, &UnreadableError{msg: fmt.Sprintf("is corrupt (Flux suspension record %d lacks its namespace, name or owner): restore it from a backup, or inspect the cluster with `ghcrsync fences`", i)}
		}
	}

	return &s, nil
}

// Corrupt is an UnreadableError saying what is wrong.
func Corrupt(msg string) error { return &UnreadableError{msg: msg} }

// Unreadable reports err's UnreadableError, if it is one.
func Unreadable(err error) (*UnreadableError, bool) {
	var u *UnreadableError

	return u, errors.As(err, &u)
}

// jsonErr describes a JSON error by position, not by quoting the input.
func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}

	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q has the wrong type", te.Field)
	}

	return "not JSON"
}

// Advance makes s the next serial of its lineage (assigning a lineage on the first write).
// Backends call it as they write.
func Advance(s *State) {
	if s.Lineage == "" {
		s.Lineage = newUUID()
	}

	s.FormatVersion = FormatVersion
	s.Serial++
}

// Write stores s as the next serial (assigning a lineage on the first write).
func (l *Local) Write(s *State) error {
	Advance(s)

	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}

	if err := atomicfile.Write(l.Path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}

	return nil
}

// Lock takes the exclusive lock (PATH.lock) or fails at once naming the holder's process.
func (l *Local) Lock() error {
	f, err := os.OpenFile(l.Path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lock state %s: %w", l.Path, err)
	}

	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := readlimit.File(l.Path+".lock", 256)
		f.Close()

		return fmt.Errorf("state %s is locked by another ghcrsync command (%s): wait for it to finish", l.Path, string(holder))
	}

	_ = f.Truncate(0)
	_, _ = fmt.Fprintf(f, "pid %d", os.Getpid())
	l.lock = f

	return nil
}

// Unlock releases the lock.
func (l *Local) Unlock() {
	if l.lock != nil {
		_ = syscall.Flock(int(l.lock.Fd()), syscall.LOCK_UN)
		l.lock.Close()
		l.lock = nil
	}
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80

	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Remove forgets node's record and writes the state (the cluster is not touched).
func Remove(store Store, st *State, node string) error {
	kept := st.Records[:0]
	found := false

	for _, rec := range st.Records {
		if rec.Node == node {
			found = true

			continue
		}

		kept = append(kept, rec)
	}

	if !found {
		return fmt.Errorf("the state (%s) has no record of %s: see `ghcrsync state list`", store.Describe(), node)
	}

	st.Records = kept

	return store.Write(st)
}

// Push writes src into store, whose current state is cur (migration, e.g. local → kubernetes).
// A backend that already holds another lineage is refused unless forced; the serial never goes
// backwards.
func Push(store Store, cur, src *State, force bool) error {
	if src.Lineage == "" {
		return errors.New("the state to push holds no lineage: nothing to push")
	}

	if cur.Lineage != "" && cur.Lineage != src.Lineage && !force {
		return fmt.Errorf("%s already holds state lineage %s (serial %d), not %s: pushing would replace another history; pass --force if that is intended",
			store.Describe(), cur.Lineage, cur.Serial, src.Lineage)
	}

	src.Serial = max(src.Serial, cur.Serial)

	return store.Write(src)
}
