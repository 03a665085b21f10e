// Package kubestate stores ghcrsync's state in a Kubernetes Secret, so that a recovery can run
// from any machine (CI runners are ephemeral). Every write is a compare-and-swap on the Secret's
// resourceVersion: two writers cannot both win. After a conflict or a lost response the Secret is
// re-read: a write of ours that committed is recognised, another writer's change of the same
// lineage (a `state rm`, a `release`) is kept and ours applied over it, and only another lineage
// or another run stops the writer. The state is gzipped and split into chunks when large; reads
// are bounded.
package kubestate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
	"github.com/ghcrsync/ghcrsync/state"
)

const (
	// chunkSize keeps each data key well under the 1 MiB object limit.
	chunkSize = 512 << 10

	// KeyPattern is every key the state Secret holds (RE2): its chunk count and its chunks. The
	// admission policy admits no other key in it (internal/permission).
	KeyPattern = `^(chunks|state[.]json[.]gz[.][0-9]+)$`

	// maxChunks and maxStateSize bound what a read accepts (a Secret is at most 1 MiB anyway; a
	// tampered chunk count or a gzip bomb must not exhaust memory).
	maxChunks    = 64
	maxStateSize = 32 << 20
)

// Store is the Kubernetes Secret backend.
type Store struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	Clock     clock.Clock // the pause between conflicting writes (nil: clock.System)

	rv   string       // resourceVersion last read or written: the CAS precondition
	base *state.State // the state last read or written: what a write's change is measured from
}

var _ state.Store = (*Store)(nil)

// Describe names the backend.
func (s *Store) Describe() string { return fmt.Sprintf("Kubernetes Secret %s/%s", s.Namespace, s.Name) }

// Lock is a no-op: every write is a compare-and-swap, and apply holds the run Lease.
func (s *Store) Lock() error { return nil }

// Unlock is a no-op.
func (s *Store) Unlock() {}

func timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// Read reads the state; an absent Secret is an empty state.
func (s *Store) Read() (*state.State, error) {
	st, rv, err := s.fetch()
	if err != nil {
		return nil, err
	}

	s.rv, s.base = rv, st.Clone()

	return st, nil
}

// fetch reads the Secret and decodes the state in it.
func (s *Store) fetch() (*state.State, string, error) {
	ctx, cancel := timeout()
	defer cancel()

	sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return &state.State{FormatVersion: state.FormatVersion}, "", nil
	}

	if err != nil {
		return nil, "", fmt.Errorf("read state from %s: %w", s.Describe(), err)
	}

	st, err := Decode(sec.Data)
	if err != nil {
		s.rv = sec.ResourceVersion // a push may still replace it (compare-and-swap on what is there)

		if _, ok := state.Unreadable(err); !ok {
			err = state.Corrupt(err.Error())
		}

		return nil, "", fmt.Errorf("state in %s: %w", s.Describe(), err)
	}

	return st, sec.ResourceVersion, nil
}

// Decode reads a state from a Secret's data: the chunk count, the gzipped chunks, the JSON.
func Decode(data map[string][]byte) (*state.State, error) {
	const restore = "restore it with `ghcrsync state push FILE`"

	n, err := strconv.Atoi(string(data["chunks"]))
	if err != nil || n < 1 || n > maxChunks {
		return nil, fmt.Errorf("its chunk count is not a number between 1 and %d: %s", maxChunks, restore)
	}

	var gz []byte
	for i := range n {
		gz = append(gz, data[fmt.Sprintf("state.json.gz.%d", i)]...)
	}

	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("its chunks are not gzip (%v): %s", err, restore)
	}

	raw, err := readlimit.Reader(zr, maxStateSize, "the state uncompressed")
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, restore)
	}

	st, err := state.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("the state it holds %w", err)
	}

	return st, nil
}

// encode is the Secret's data for a state.
func encode(st *state.State) (map[string][]byte, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}

	var gz bytes.Buffer

	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(raw)
	_ = zw.Close()

	data := map[string][]byte{}
	b := gz.Bytes()
	chunks := 0

	for len(b) > 0 || chunks == 0 {
		end := min(len(b), chunkSize)
		data[fmt.Sprintf("state.json.gz.%d", chunks)] = b[:end]
		b = b[end:]
		chunks++
	}

	data["chunks"] = []byte(strconv.Itoa(chunks))

	return data, nil
}

// Write stores st as the next serial, a compare-and-swap on what this store last read or wrote;
// on a conflict or a lost response it re-reads and reconciles (see the package comment).
func (s *Store) Write(st *state.State) error {
	next := st.Clone()
	state.Advance(next)

	for attempt := range 5 {
		rv, err := s.put(next)
		if err == nil {
			s.rv, s.base = rv, next.Clone()
			*st = *next

			return nil
		}

		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !lostResponse(err) {
			return fmt.Errorf("write state to %s: %w", s.Describe(), err)
		}

		if next, err = s.reconcile(st, next); err != nil {
			return err
		}

		if next == nil { // our write had committed
			*st = *s.base.Clone()

			return nil
		}

		_ = clock.Sleep(context.Background(), clock.Or(s.Clock), time.Duration(attempt*100)*time.Millisecond)
	}

	return fmt.Errorf("write state to %s: it kept changing under concurrent writers (serial %d): stop, and run the command again", s.Describe(), st.Serial)
}

// lostResponse is an error after which the write may or may not have committed: no status from
// the server (a connection cut, a client timeout), or a server-side timeout or internal error.
func lostResponse(err error) bool {
	var status apierrors.APIStatus

	return !errors.As(err, &status) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsInternalError(err)
}

// reconcile re-reads after a failed write of next (made from st). It returns nil when next is
// what is stored (the write committed and its response was lost), a new next (the stored state
// with this writer's change applied over it) when another writer of this lineage got in between,
// or an error when the state is not this lineage's or another run wrote it.
func (s *Store) reconcile(st, next *state.State) (*state.State, error) {
	cur, rv, err := s.fetch()
	if err != nil {
		return nil, err
	}

	s.rv = rv

	switch {
	case cur.Lineage != "" && cur.Lineage != next.Lineage && s.base != nil && s.base.Lineage != "":
		return nil, fmt.Errorf("write state to %s: it now holds another lineage (%s, not %s): stop, and inspect it with `ghcrsync state pull`", s.Describe(), cur.Lineage, next.Lineage)
	case sameState(cur, next):
		s.base = cur

		return nil, nil
	case s.base != nil && cur.Run != nil && s.base.Run != nil && cur.Run.Holder != s.base.Run.Holder && (st.Run == nil || cur.Run.Holder != st.Run.Holder):
		return nil, fmt.Errorf("write state to %s: another run (%s) wrote it since it was read: stop, and run the command again", s.Describe(), cur.Run.Holder)
	}

	merged := rebase(cur, s.base, st)
	merged.Serial = cur.Serial
	state.Advance(merged)
	s.base = cur

	return merged, nil
}

// sameState reports whether two states are the same document.
func sameState(a, b *state.State) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)

	return bytes.Equal(ja, jb)
}

// rebase applies this writer's change (from base to mine) over cur: the run record, and every node
// and pull-secret record it changed, added or removed; other writers' changes to the rest stay.
func rebase(cur, base, mine *state.State) *state.State {
	out := cur.Clone()
	if base == nil {
		base = &state.State{}
	}

	if !sameJSON(base.Run, mine.Run) {
		out.Run = mine.Run
	}

	for _, r := range mine.Records {
		if b := base.Record(r.Node); b == nil || !sameJSON(*b, r) {
			out.Put(r)
		}
	}

	for _, b := range base.Records {
		if mine.Record(b.Node) == nil {
			out.Records = removeRecord(out.Records, b.Node)
		}
	}

	for _, sr := range mine.Secrets {
		out.PutSecret(sr)
	}

	return out
}

func removeRecord(records []state.Record, node string) []state.Record {
	kept := records[:0]

	for _, r := range records {
		if r.Node != node {
			kept = append(kept, r)
		}
	}

	return kept
}

func sameJSON(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)

	return bytes.Equal(ja, jb)
}

// put creates the Secret, or updates it carrying the last known resourceVersion.
func (s *Store) put(st *state.State) (string, error) {
	data, err := encode(st)
	if err != nil {
		return "", err
	}

	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, ResourceVersion: s.rv,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "ghcrsync"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}

	ctx, cancel := timeout()
	defer cancel()

	var out *corev1.Secret
	if s.rv == "" {
		out, err = s.Client.CoreV1().Secrets(s.Namespace).Create(ctx, sec, metav1.CreateOptions{})
	} else {
		out, err = s.Client.CoreV1().Secrets(s.Namespace).Update(ctx, sec, metav1.UpdateOptions{})
	}

	if err != nil {
		return "", err
	}

	return out.ResourceVersion, nil
}
