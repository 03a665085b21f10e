package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"

	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/containerd"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
)

// agent is what runs on a machine while it is up: the simulated kubelet, or a real node's
// containerd and kubelet. The machine's Talos API, boot and reboot stay the sandbox's.
type agent interface {
	boot()                        // the machine booted: start, report the new boot
	shutdown(ctx context.Context) // the machine goes down for a reboot
	stop()                        // the machine is gone, or the sandbox stops
	// reload is Talos 1.14 rendering the active config's registries for a live runtime: the
	// runtime restarts if the rendered config changed. It reports whether it restarted.
	reload(ctx context.Context) bool
}

// reload on the simulated kubelet: the rendered config changed when the configured credential
// differs from the one its runtime pulls with (which it reads at every pull).
func (k *kubelet) reload(context.Context) bool { return k.m.Configured() != k.m.Effective() }

// KubeletVersion is the real kubelet real nodes run: 1.35, the last release that supports
// containerd 1.x (Debian's), and within the skew policy of the 1.37 control plane (a kubelet
// may be three minor versions older). scripts/build-kubelet.sh builds it.
const KubeletVersion = "v1.35.4"

// RealNodeBinaries are what a real node runs besides Debian's containerd and runc: the kubelet
// and the static binary of the runnable images (pause), both from `make kubelet`.
func RealNodeBinaries() (kubelet, pause string, err error) {
	if err := containerd.Available(); err != nil {
		return "", "", err
	}

	kubelet = CachePath("GHCRSYNC_KUBELET", "kubelet", KubeletVersion, "kubelet")
	pause = CachePath("GHCRSYNC_PAUSE", "pause", "pause")

	for _, p := range []string{kubelet, pause} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Errorf("%s is missing: make kubelet builds the real node's kubelet and pause binary", p)
		}
	}

	return kubelet, pause, nil
}

// CachePath is where a built binary is cached: the environment variable env when set, else
// ~/.cache/ghcrsync/ELEMS… (XDG_CACHE_HOME honoured), outside any clone.
func CachePath(env string, elems ...string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}

	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}

	return filepath.Join(append([]string{cache, "ghcrsync"}, elems...)...)
}

// The sandbox's runnable images for real nodes: the pod sandbox image Talos configures, served
// through its mirror of registry.k8s.io, and the entrypoints of the seeded private images.
const (
	PauseImage       = "registry.k8s.io/pause:3.10"
	k8sRegistry      = "registry.k8s.io"
	realNodeNetFirst = 198 // real nodes' addresses: 198.18.SLOT.1, pods 198.19.SLOT.0/24 (RFC 2544)
)

// realNodes readies the sandbox for real nodes: the binaries they run, and images a real
// runtime can run in the registry.
func (s *Sandbox) realNodes() error {
	kubelet, pause, err := RealNodeBinaries()
	if err != nil {
		return fmt.Errorf("sandbox: real nodes: %w", err)
	}

	s.realKubelet = kubelet

	return runnableImages(s.registry, s.public, pause)
}

// runnableImages makes the registry's images runnable by a real runtime: the private images
// (a probe exits 0, an app runs until stopped; the distroless probe stays without an
// entrypoint), and the pause image in the public registry (registry.k8s.io's stand-in).
func runnableImages(reg, public *registry.Registry, pause string) error {
	for _, image := range registry.PrivateImages {
		if image == registry.DistrolessImage {
			continue
		}

		entry := []string{"/pause", "true"}
		if !strings.Contains(image, "probe") {
			entry = []string{"/pause"}
		}

		if _, err := reg.PushRunnable(image, pause, entry, false); err != nil {
			return fmt.Errorf("sandbox: runnable image %s: %w", image, err)
		}
	}

	if _, err := public.PushRunnable(strings.TrimPrefix(PauseImage, k8sRegistry+"/"), pause, []string{"/pause"}, true); err != nil {
		return fmt.Errorf("sandbox: runnable image %s: %w", PauseImage, err)
	}

	return nil
}

// mirrorDocuments are the RegistryMirrorConfig documents of a real node's machine config: ghcr.io
// served by the sandbox registry, registry.k8s.io by the public one (another host, as on the
// internet: no ghcr.io credential is sent there), without fallback (a real node here has no way
// out).
func mirrorDocuments(ghcrURL, k8sURL string) string {
	var b strings.Builder

	for _, m := range []struct{ name, url string }{{registry.RegistryHost, ghcrURL}, {k8sRegistry, k8sURL}} {
		fmt.Fprintf(&b, "---\napiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: %s\nendpoints:\n  - url: %s\nskipFallback: true\n", m.name, m.url)
	}

	return b.String()
}

// slot is a real node's place on this host: an address of its own on lo (198.18.N.1: not
// loopback, as the kubelet requires of a node IP, and routable here only), a bridge
// (ghcrsyncN) and a pod subnet (198.19.N.0/24). Adding the address is the lock: a slot another
// sandbox holds answers "exists".
type slot int

func claimSlot() (slot, error) {
	for n := range 256 {
		addr := fmt.Sprintf("198.18.%d.1", n)
		out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput()

		if err == nil {
			return slot(n), nil
		}

		if !strings.Contains(string(out), "exists") && !strings.Contains(string(out), "already assigned") {
			return 0, fmt.Errorf("sandbox: a real node's address %s on lo: %v: %s", addr, err, strings.TrimSpace(string(out)))
		}
	}

	return 0, errors.New("sandbox: every real node address 198.18.0-255.1 is taken")
}

func (s slot) ip() string     { return fmt.Sprintf("198.18.%d.1", int(s)) }
func (s slot) bridge() string { return "ghcrsync" + strconv.Itoa(int(s)) }
func (s slot) subnet() string { return fmt.Sprintf("198.19.%d.0/24", int(s)) }
func (s slot) release()       { _ = exec.Command("ip", "addr", "del", s.ip()+"/32", "dev", "lo").Run() }

// realNode is a real machine's runtime: Debian's containerd with runc, configured from the
// machine's active Talos config as Talos renders it, and a real kubelet registering the Node.
type realNode struct {
	m          *Machine
	slot       slot
	dir        string // a short path of its own (see newRealNode)
	link       string // where the sandbox's folder shows it
	binary     string // the kubelet
	kubeconfig string
	port       int

	mu      sync.Mutex
	runtime *containerd.Node
	kubelet *containerd.Kubelet
	stopped bool
}

// newRealNode prepares machine m's real runtime: its folder, its node identity's kubeconfig
// and its kubelet's port. boot starts it.
func (f *Fleet) newRealNode(m *Machine, sl slot, dir, kubeletBinary string, kubeconfig func(path string) error) (*realNode, error) {
	link := filepath.Join(f.opts.Dir, "real-nodes", m.Name)
	_ = os.MkdirAll(filepath.Dir(link), 0o700)
	_ = os.RemoveAll(link)

	r := &realNode{m: m, slot: sl, dir: dir, link: link, binary: kubeletBinary, kubeconfig: filepath.Join(dir, "kubeconfig")}
	if err := os.Symlink(dir, link); err != nil {
		_ = os.RemoveAll(dir)

		return nil, err
	}

	if err := kubeconfig(r.kubeconfig); err != nil {
		r.removeFiles()

		return nil, err
	}

	port, err := freePort(sl.ip())
	if err != nil {
		return nil, err
	}

	r.port = port

	return r, nil
}

// pids are its containerd's and kubelet's process ids, while they run.
func (r *realNode) pids() []int {
	r.mu.Lock()
	defer r.mu.Unlock()

	var out []int

	if r.runtime != nil && r.runtime.Pid() != 0 {
		out = append(out, r.runtime.Pid())
	}

	if r.kubelet != nil {
		out = append(out, r.kubelet.Pid())
	}

	return out
}

// registries is what the machine's active config gives containerd.
func (r *realNode) registries(ctx context.Context) (containerd.Registries, error) {
	mc, err := r.m.config(ctx, talosconfig.ActiveID)
	if err != nil {
		return containerd.Registries{}, err
	}

	return containerd.FromTalos(mc.Config()), nil
}

// boot is the machine's boot: containerd starts on the config the machine loaded, then the
// kubelet, reporting the machine's new boot id.
func (r *realNode) boot() {
	if err := r.start(r.m.fleet.ctx); err != nil && r.m.fleet.ctx.Err() == nil {
		r.m.fleet.log.Error("real node did not boot", "node", r.m.Name, "error", err)
	}
}

func (r *realNode) start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()

	if r.stopped {
		return nil
	}

	reg, err := r.registries(ctx)
	if err != nil {
		return err
	}

	if r.runtime == nil {
		r.runtime, err = containerd.Start(ctx, containerd.Spec{Dir: filepath.Join(r.dir, "containerd"), Bridge: r.slot.bridge(), Subnet: r.slot.subnet(), SandboxImage: PauseImage}, reg)
	} else {
		err = r.runtime.Reboot(ctx, reg)
	}

	if err != nil {
		return fmt.Errorf("containerd: %w", err)
	}

	mc, err := r.m.config(ctx, talosconfig.ActiveID)
	if err != nil {
		return err
	}

	r.kubelet, err = containerd.StartKubelet(containerd.KubeletConfig{
		Binary: r.binary, Dir: filepath.Join(r.dir, "kubelet"), RootDir: keyring.RootDir(mc.Config()), NodeName: r.m.Name, NodeIP: r.slot.ip(),
		Kubeconfig: r.kubeconfig, Port: r.port, Runtime: r.runtime, BootID: r.m.BootID(),
		ProviderID: fmt.Sprintf("%s%d", HcloudProviderIDPrefix, r.m.ServerID), Heartbeat: r.m.fleet.opts.Heartbeat,
	})
	if err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}

	return nil
}

// shutdown is the machine going down: the kubelet stops (as a machine's power does, without a
// last status: the node controller marks the Node NotReady), every container ends, containerd
// stops. The image store stays.
func (r *realNode) shutdown(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()

	if r.kubelet != nil {
		r.kubelet.Stop()
		r.kubelet = nil
	}

	if r.runtime != nil {
		r.runtime.Shutdown(ctx)
	}
}

// stop ends the machine for good: shutdown, the pod network's bridge and the node's address
// removed.
func (r *realNode) stop() {
	r.shutdown(context.Background())

	r.mu.Lock()
	defer r.mu.Unlock()

	if r.stopped {
		return
	}

	r.stopped = true

	if r.runtime != nil {
		r.runtime.RemoveBridge()
	}

	r.slot.release()
	r.removeFiles()
}

// removeFiles removes the node's files, keeping its containerd and kubelet logs in the
// sandbox's folder in their place.
func (r *realNode) removeFiles() {
	_ = os.Remove(r.link)

	if err := os.MkdirAll(r.link, 0o700); err == nil {
		for _, log := range []string{"containerd/containerd.log", "kubelet/kubelet.log"} {
			if b, err := os.ReadFile(filepath.Join(r.dir, log)); err == nil {
				_ = os.WriteFile(filepath.Join(r.link, filepath.Base(log)), b, 0o600)
			}
		}
	}

	containerd.UnmountUnder(r.dir)
	_ = os.RemoveAll(r.dir)
}

// reload is Talos 1.14's live reload: containerd restarted when the rendered config changed.
func (r *realNode) reload(ctx context.Context) bool {
	r.mu.Lock()
	defer r.mu.Unlock()

	if r.runtime == nil || r.stopped {
		return false
	}

	reg, err := r.registries(ctx)
	if err != nil {
		r.m.fleet.log.Error("real node's registry config", "node", r.m.Name, "error", err)

		return false
	}

	restarted, err := r.runtime.Reload(ctx, reg)
	if err != nil {
		r.m.fleet.log.Error("real node's containerd did not restart", "node", r.m.Name, "error", err)
	}

	return restarted
}

// KubeletRootDir is the folder the machine's kubelet runs in (its --root-dir: /var/lib/kubelet
// on Talos), where the kubelet looks for its node keyring, config.json.
func (m *Machine) KubeletRootDir() string {
	if m.real != nil {
		return filepath.Join(m.real.dir, "kubelet", "root")
	}

	return filepath.Join(m.fleet.opts.Dir, "kubelets", m.Name)
}

// RuntimePull asks a real node's containerd to pull image as a CRI client with no credential of
// its own (as the kubelet does when it has none for the image): containerd answers with the
// credential its config holds — what it loaded at its last start — and nothing of the kubelet's.
func (m *Machine) RuntimePull(ctx context.Context, image string) (string, error) {
	if m.real == nil {
		return "", errors.New(m.Name + " is not a real node")
	}

	m.real.mu.Lock()
	rt := m.real.runtime
	m.real.mu.Unlock()

	if rt == nil {
		return "", errors.New(m.Name + "'s containerd is not running")
	}

	return rt.Pull(ctx, image, nil)
}

// RuntimePIDs are a real node's containerd's and kubelet's process ids while they run: a
// restart of either shows as a new pid.
func (m *Machine) RuntimePIDs() []int {
	if m.real == nil {
		return nil
	}

	return m.real.pids()
}
