package kubestate_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/state"
	"github.com/ghcrsync/ghcrsync/state/kubestate"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, NoWorkloads: true, AutoscalerPaused: true})
}

var secretSeq int

// newStore is a store on a Secret of its own in the sandbox's real API server, whose client can
// drop the response of its next write (after the write committed).
func newStore(t *testing.T) (*kubestate.Store, *dropper) {
	t.Helper()

	secretSeq++

	d := &dropper{}
	cfg := sandboxtest.Get(t).AdminRESTConfig()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { d.next = rt; return d })

	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	return &kubestate.Store{Client: c, Namespace: "default", Name: fmt.Sprintf("ghcrsync-state-%d", secretSeq)}, d
}

// other is a second writer of the same Secret (another ghcrsync command).
func other(t *testing.T, s *kubestate.Store) *kubestate.Store {
	t.Helper()

	return &kubestate.Store{Client: sandboxtest.Get(t).Kube(), Namespace: s.Namespace, Name: s.Name}
}

// dropper loses the response of the next PUT: the server commits it, the client gets an error.
type dropper struct {
	mu   sync.Mutex
	next http.RoundTripper
	drop bool
}

func (d *dropper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(req)

	d.mu.Lock()
	defer d.mu.Unlock()

	if d.drop && req.Method == http.MethodPut && err == nil {
		d.drop = false
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()

		return nil, errors.New("http2: client connection lost")
	}

	return resp, err
}

var _ = rest.CopyConfig

func record(node string, phase state.Phase) state.Record {
	return state.Record{Node: node, Owner: "h1", Phase: phase, Fence: state.Fence{UID: "u-" + node, InitialTaints: []string{}}}
}

// A write whose response is lost after it committed is recognised on the re-read: the writer
// goes on, with no duplicate serial.
func TestLostResponseRecognised(t *testing.T) {
	s, d := newStore(t)
	st, _ := s.Read()
	st.Records = []state.Record{record("w1", state.PhaseClaimed)}

	if err := s.Write(st); err != nil {
		t.Fatal(err)
	}

	d.drop = true
	st.Records[0].Phase = state.PhaseGuarded
	if err := s.Write(st); err != nil {
		t.Fatalf("a committed write with a lost response: %v", err)
	}

	if d.drop {
		t.Fatal("no write response was dropped")
	}

	got, _ := other(t, s).Read()
	if got.Serial != st.Serial || got.Serial != 2 || got.Record("w1").Phase != state.PhaseGuarded {
		t.Fatalf("stored serial %d phase %s, writer at %d", got.Serial, got.Record("w1").Phase, st.Serial)
	}

	st.Records[0].Phase = state.PhaseDrained
	if err := s.Write(st); err != nil {
		t.Fatalf("the next write: %v", err)
	}
}

// Another writer of the same lineage (a `state rm` of another node) is kept, and this writer's
// change applied over it. Negative controls: another lineage, or another run, stops the writer.
func TestConcurrentWriters(t *testing.T) {
	s, _ := newStore(t)
	st, _ := s.Read()
	st.Run = &state.Run{Holder: "h1"}
	st.Records = []state.Record{record("w1", state.PhaseClaimed), record("old", state.PhaseReleased)}

	if err := s.Write(st); err != nil {
		t.Fatal(err)
	}

	o := other(t, s)
	ost, _ := o.Read()

	if err := state.Remove(o, ost, "old"); err != nil {
		t.Fatal(err)
	}

	st.Records[0].Phase = state.PhaseGuarded
	if err := s.Write(st); err != nil {
		t.Fatalf("over a concurrent state rm: %v", err)
	}

	got, _ := o.Read()
	if got.Record("old") != nil || got.Record("w1").Phase != state.PhaseGuarded || got.Serial != 3 || st.Serial != 3 {
		t.Fatalf("merged state: serial %d (writer %d), records %+v", got.Serial, st.Serial, got.Records)
	}

	for name, spoil := range map[string]func(*state.State){
		"other_lineage": func(x *state.State) { x.Lineage = "another-lineage" },
		"other_run":     func(x *state.State) { x.Run = &state.Run{Holder: "h2"} },
	} {
		t.Run(name, func(t *testing.T) {
			cur, _ := o.Read()
			spoil(cur)

			if err := o.Write(cur); err != nil {
				t.Fatal(err)
			}

			st.Records[0].Phase = state.PhaseDrained
			if err := s.Write(st); err == nil || !strings.Contains(err.Error(), "another") {
				t.Fatalf("want a refusal, got %v", err)
			}

			_, _ = s.Read()
			st, _ = s.Read()
		})
	}
}

// A read is bounded: a chunk count out of range, a gzip bomb, or another format is refused.
func TestDecodeBounds(t *testing.T) {
	for name, data := range map[string]map[string][]byte{
		"no_chunks":     {},
		"huge_count":    {"chunks": []byte("100000")},
		"not_gzip":      {"chunks": []byte("1"), "state.json.gz.0": []byte("plain")},
		"negative":      {"chunks": []byte("-1")},
		"future_format": mustEncode(t, &state.State{FormatVersion: "9"}),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := kubestate.Decode(data); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func mustEncode(t *testing.T, st *state.State) map[string][]byte {
	t.Helper()

	d, err := kubestate.Encode(st)
	if err != nil {
		t.Fatal(err)
	}

	return d
}
