package keyring

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
)

func TestDo(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, File)
	cfg := []byte(`{"auths":{"ghcr.io":{"auth":"` + b64("bot:ghp_new") + `"}}}`)
	other := `{"auths":{"quay.io":{"auth":"` + b64("q:pw") + `"}}}`

	if err := os.WriteFile(path, []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}

	r, err := Do(root, ModeWrite, "ghcr.io", cfg, "/var/lib/kubelet/config.json")
	if err != nil || r.After != authdigest.Of("bot", "ghp_new") || r.Kept != 1 || !r.Changed || r.Path != "/var/lib/kubelet/config.json" {
		t.Fatalf("write: %+v %v", r, err)
	}

	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}

	if r, err := Do(root, ModeWrite, "ghcr.io", cfg, "p"); err != nil || r.Changed || len(r.Before) != 1 {
		t.Fatalf("write again: %+v %v", r, err)
	}

	if r, err := Do(root, ModeRead, "ghcr.io", nil, "p"); err != nil || r.Before[0] != authdigest.Of("bot", "ghp_new") || r.Changed {
		t.Fatalf("read: %+v %v", r, err)
	}

	if _, err := Do(root, ModeRemove, "ghcr.io", nil, "p"); err != nil {
		t.Fatal(err)
	}

	if b, _ := os.ReadFile(path); string(b) != other+"\n" {
		t.Fatalf("after remove: %s", b)
	}

	entries, _ := os.ReadDir(root)
	if len(entries) != 1 {
		t.Fatalf("a temporary file was left: %v", entries)
	}

	// A file the kubelet cannot read is not written into, and left as it was.
	bad := []byte(`{"auths":{"quay.io":{"auth":"%%%"}}}`)
	_ = os.WriteFile(path, bad, 0o600)

	if _, err := Do(root, ModeWrite, "ghcr.io", cfg, "p"); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("write into an unreadable file: %v", err)
	}

	if b, _ := os.ReadFile(path); string(b) != string(bad) {
		t.Fatal("the unreadable file was changed")
	}

	// No credential given.
	if _, err := Do(t.TempDir(), ModeWrite, "ghcr.io", nil, "p"); err == nil {
		t.Fatal("a write with no credential")
	}

	// Nothing to remove: no file is created.
	empty := t.TempDir()
	if _, err := Do(empty, ModeRemove, "ghcr.io", nil, "p"); err != nil {
		t.Fatal(err)
	}

	if _, err := os.Stat(filepath.Join(empty, File)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("remove created a file")
	}
}

// Await sees the first read after the write, and only that: its own read of the file does not
// count (O_NOATIME), and a file nobody reads is reported unread when the window ends.
func TestAwait(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the kubelet keyring is awaited on Linux only")
	}

	root := t.TempDir()
	cfg := []byte(`{"auths":{"ghcr.io":{"auth":"` + b64("bot:ghp_new") + `"}}}`)

	if _, err := Do(root, ModeWrite, "ghcr.io", cfg, "p"); err != nil {
		t.Fatal(err)
	}

	// A writer's own reads (a write that changes nothing, a read) do not count either: the proof
	// took one such for the kubelet's once (a run after a killed one found its keyring written).
	for _, mode := range []Mode{ModeWrite, ModeRead} {
		if _, err := Do(root, mode, "ghcr.io", cfg, "p"); err != nil {
			t.Fatal(err)
		}
	}

	r, err := Await(root, "ghcr.io", "p", 300*time.Millisecond, 10*time.Millisecond)
	if err != nil || !r.ReadAt.IsZero() || r.Written.IsZero() || len(r.Before) != 1 || r.Before[0] != authdigest.Of("bot", "ghp_new") {
		t.Fatalf("unread: %+v %v", r, err)
	}

	done := make(chan Report, 1)

	go func() {
		r, _ := Await(root, "ghcr.io", "p", 10*time.Second, 10*time.Millisecond)
		done <- r
	}()

	time.Sleep(100 * time.Millisecond)

	if _, err := os.ReadFile(filepath.Join(root, File)); err != nil { // the kubelet's read
		t.Fatal(err)
	}

	if r := <-done; r.ReadAt.IsZero() || !r.ReadAt.After(r.Written) {
		t.Fatalf("read: %+v", r)
	}
}
