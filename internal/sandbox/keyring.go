package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
)

// nodeKeyring is a simulated kubelet's node keyring as kubelet 1.35's is read
// (credentialprovider.NewDefaultDockerKeyring): ROOT/config.json, read at a pull when what was
// read last is older than the cache's lifetime — an absent or unreadable file cached as "no
// keyring" too — and its entries for the image's registry sent with the pull. Reading the file
// moves its access time, as the real kubelet's read does (ghcrsync's writer awaits that).
type nodeKeyring struct {
	mu      sync.Mutex
	creds   []Credential
	expires time.Time
}

// lookup is the keyring's credentials for the registry the sandbox stands in for, from the
// cache or, once it expired, from the file in root.
func (k *nodeKeyring) lookup(root string, lifetime time.Duration) []Credential {
	k.mu.Lock()
	defer k.mu.Unlock()

	if time.Now().Before(k.expires) {
		return k.creds
	}

	k.creds, k.expires = nil, time.Now().Add(lifetime)

	b, err := os.ReadFile(filepath.Join(root, keyring.File))
	if err != nil || keyring.Readable(b) != nil {
		return nil // the kubelet ignores a keyring it cannot read
	}

	for _, a := range keyring.Lookup(b, registry.RegistryHost) {
		k.creds = append(k.creds, Credential{Username: a.Username, Password: a.Password, source: "keyring"})
	}

	return k.creds
}

// hostPath is where a hostPath volume of the machine's is on this host: the kubelet's root
// directory (/var/lib/kubelet on Talos, the machine's own folder here) and what is under it; no
// other host path is simulated.
func (m *Machine) hostPath(path string) (string, bool) {
	root := "/var/lib/kubelet"
	if path != root && !strings.HasPrefix(path, root+"/") {
		return "", false
	}

	dir := m.KubeletRootDir()

	m.mu.Lock()
	if m.keyringMisplaced {
		dir += "-elsewhere"
	}
	m.mu.Unlock()

	return filepath.Join(dir, strings.TrimPrefix(path, root)), true
}

// MisplaceKeyring makes the machine's hostPath of the kubelet's root directory another folder
// than the one its kubelet reads (as a --root-dir ghcrsync got wrong): a keyring written there is
// never read.
func (m *Machine) MisplaceKeyring(misplaced bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.keyringMisplaced = misplaced
}
