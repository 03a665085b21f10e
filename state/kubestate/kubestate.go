// Package kubestate stores ghcrsync's state in a Kubernetes Secret, so that a recovery can run
// from any machine (CI runners are ephemeral). Every write is a compare-and-swap on the Secret's
// resourceVersion: two writers cannot both win. The state is gzipped and split into chunks when
// large.
package kubestate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/state"
)

// chunkSize keeps each data key well under the 1 MiB object limit.
const chunkSize = 512 << 10

// Store is the Kubernetes Secret backend.
type Store struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string

	rv string // resourceVersion last read or written: the CAS precondition
}

var _ state.Store = (*Store)(nil)

// Describe names the backend.
func (s *Store) Describe() string { return fmt.Sprintf("Kubernetes Secret %s/%s", s.Namespace, s.Name) }

// Lock is a no-op: every write is a compare-and-swap, and apply holds the run Lease.
func (s *Store) Lock() error { return nil }

// Unlock is a no-op.
func (s *Store) Unlock() {}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// Read reads the state; an absent Secret is an empty state.
func (s *Store) Read() (*state.State, error) {
	c, cancel := ctx()
	defer cancel()

	sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(c, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s.rv = ""

		return &state.State{FormatVersion: state.FormatVersion}, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read state from %s: %w", s.Describe(), err)
	}

	n, err := strconv.Atoi(string(sec.Data["chunks"]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("state in %s is corrupt (no chunk count): restore it with `ghcrsync state push`", s.Describe())
	}

	var gz []byte
	for i := range n {
		gz = append(gz, sec.Data[fmt.Sprintf("state.json.gz.%d", i)]...)
	}

	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("state in %s is corrupt (%v): restore it with `ghcrsync state push`", s.Describe(), err)
	}

	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("state in %s is corrupt (%v): restore it with `ghcrsync state push`", s.Describe(), err)
	}

	var st state.State
	if err := json.Unmarshal(raw, &st); err != nil || st.FormatVersion != state.FormatVersion {
		return nil, fmt.Errorf("state in %s is corrupt or of another format: restore it with `ghcrsync state push`", s.Describe())
	}

	s.rv = sec.ResourceVersion

	return &st, nil
}

// Write stores st as the next serial, if nobody wrote since this store last read or wrote.
func (s *Store) Write(st *state.State) error {
	next := st.Clone()
	state.Advance(next)

	raw, err := json.Marshal(next)
	if err != nil {
		return err
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

	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, ResourceVersion: s.rv,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "ghcrsync"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}

	c, cancel := ctx()
	defer cancel()

	var out *corev1.Secret
	if s.rv == "" {
		out, err = s.Client.CoreV1().Secrets(s.Namespace).Create(c, sec, metav1.CreateOptions{})
	} else {
		out, err = s.Client.CoreV1().Secrets(s.Namespace).Update(c, sec, metav1.UpdateOptions{})
	}

	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("write state to %s: another ghcrsync wrote it since it was read (serial %d): stop, and run the command again", s.Describe(), st.Serial)
	}

	if err != nil {
		return fmt.Errorf("write state to %s: %w", s.Describe(), err)
	}

	s.rv = out.ResourceVersion
	*st = *next

	return nil
}
