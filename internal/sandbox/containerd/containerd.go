// Package containerd runs a real container runtime for a sandbox node: Debian's containerd
// (1.6) with its CRI plugin and runc, its own root, state and socket, configured from the
// node's Talos machine config the way Talos renders it, and a real kubelet on it. Nothing here
// simulates a pull: the registry sees containerd's own requests.
//
// How a machine's config becomes containerd's (Talos's internal/pkg/containers/cri/containerd:
// GenerateCRIConfig and GenerateHosts; FromTalos here):
//
//   - each RegistryAuthConfig (or machine.registries.config.HOST.auth) becomes the CRI plugin's
//     registry.configs."HOST".auth (username and password, or its base64 auth);
//   - each RegistryMirrorConfig becomes a hosts.toml under registry.config_path, one
//     [host."ENDPOINT"] per endpoint with capabilities pull and resolve, the registry itself as
//     server unless skipFallback.
//
// containerd looks a credential up by the host it contacts, so with ghcr.io mirrored to the
// sandbox registry (which stands in for ghcr.io on loopback) the credential is also keyed by
// the mirror's address, where Talos, reaching ghcr.io itself, needs only ghcr.io. That is the
// one place the sandbox's rendering adds to Talos's.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/child"
)

// Auth is a registry credential: the node's (its Talos config) or a pull secret's.
type Auth struct {
	Username, Password string
}

// Available says why a real containerd cannot run here, or nil: the binaries (apt-get install
// containerd runc) and root (containerd mounts snapshots).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("a real containerd needs root (it mounts overlayfs snapshots); run the tests as root")
	}

	for _, bin := range []string{"containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s is not installed: make runtime installs Debian's containerd and runc (apt-get install containerd runc)", bin)
		}
	}

	return nil
}

// Node is one machine's containerd.
type Node struct {
	spec Spec
	proc *child.Process
	// rendered is the config.toml and hosts files of the running containerd.
	rendered map[string]string
}

// Spec is where a node's containerd lives and the pod network it gives a kubelet.
type Spec struct {
	Dir string
	// Bridge and Subnet are the pod network (a bridge CNI network, the plugins of Debian's
	// containernetworking-plugins), one bridge per node; "" for none: a node that only pulls.
	Bridge, Subnet string
	// SandboxImage is the pod sandbox ("pause") image: Talos's is registry.k8s.io/pause.
	SandboxImage string
}

// path is a node's PATH: containerd finds runc in /usr/sbin, its shims in /usr/bin.
const path = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// Socket is where its CRI and containerd APIs listen.
func (n *Node) Socket() string { return filepath.Join(n.spec.Dir, "containerd.sock") }

// Pid is containerd's process id (0 when stopped), for leak checks.
func (n *Node) Pid() int {
	if n.proc == nil {
		return 0
	}

	return n.proc.Pid()
}

// LogPath is containerd's own log.
func (n *Node) LogPath() string { return filepath.Join(n.spec.Dir, "containerd.log") }

// Start renders containerd's config from the machine's registries and starts it.
func Start(ctx context.Context, spec Spec, reg Registries) (*Node, error) {
	n := &Node{spec: spec}

	return n, n.start(ctx, reg)
}

// RemoveBridge deletes the node's pod network bridge (it outlives containerd).
func (n *Node) RemoveBridge() {
	if n.spec.Bridge != "" {
		_ = exec.Command("ip", "link", "del", n.spec.Bridge).Run()
	}
}

// Reboot is what a machine's reboot does to its runtime: every pod and container ends, and
// containerd starts again with the config reg renders (a Talos 1.13 node loads registry auth
// only at boot). Its image store stays, as /var does.
func (n *Node) Reboot(ctx context.Context, reg Registries) error {
	n.Shutdown(ctx)

	return n.start(ctx, reg)
}

// Reload restarts containerd if the config reg renders differs from the running one, as
// Talos 1.14 restarts its CRI when the rendered registry config changes; the containers keep
// running under their shims. It reports whether it restarted.
func (n *Node) Reload(ctx context.Context, reg Registries) (bool, error) {
	if maps.Equal(n.files(reg), n.rendered) {
		return false, nil
	}

	n.Stop()

	return true, n.start(ctx, reg)
}

func (n *Node) start(ctx context.Context, reg Registries) error {
	files := n.files(reg)
	if err := n.write(files); err != nil {
		return err
	}

	n.rendered = files

	proc, err := child.Start("containerd", "containerd", []string{"--config", filepath.Join(n.spec.Dir, "config.toml")}, []string{path}, n.spec.Dir)
	if err != nil {
		return err
	}

	n.proc = proc

	// Ready when the CRI image service answers.
	deadline := time.Now().Add(30 * time.Second)

	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.images(func(c runtimeapi.ImageServiceClient) (any, error) {
			return c.ImageFsInfo(cctx, &runtimeapi.ImageFsInfoRequest{})
		})

		cancel()

		if err == nil {
			return nil
		}

		if exited := n.proc.Exited(); exited != nil || time.Now().After(deadline) || ctx.Err() != nil {
			n.Stop()
			out, _ := os.ReadFile(n.LogPath())

			return fmt.Errorf("containerd did not serve CRI within 30s: %w\n%s", err, tail(string(out), 20))
		}

		time.Sleep(200 * time.Millisecond)
	}
}

// files renders config.toml and a hosts.toml per mirrored registry (paths relative to the
// node's folder), as Talos renders a machine's registry documents (see the package doc). The
// passwords go to the config file only (mode 0600), as on a Talos machine; never to argv or a log.
func (n *Node) files(reg Registries) map[string]string {
	dir := n.spec.Dir
	files := map[string]string{}

	for _, name := range slices.Sorted(maps.Keys(reg.Mirrors)) {
		files[filepath.Join("hosts", name, "hosts.toml")] = hostsToml(name, reg.Mirrors[name], reg.NoFallback[name])
	}

	var b strings.Builder

	fmt.Fprintf(&b, "version = 2\nroot = %q\nstate = %q\n\n[grpc]\n  address = %q\n\n", filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.Socket())
	// restrict_oom_score_adj: root on these machines (Firecracker VMs, as CI) lacks
	// CAP_SYS_RESOURCE, so no process may lower its oom_score_adj; the kubelet asks -998 for a pod
	// sandbox and runc's nsexec fails ("can't get final child's PID from pipe: EOF"). Restricted,
	// containerd never asks below its own score, as for a rootless containerd.
	fmt.Fprintf(&b, "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = %q\n  restrict_oom_score_adj = true\n", n.spec.SandboxImage)
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"overlayfs\"\n")

	cniBin, cniConf := filepath.Join(dir, "cni", "bin"), filepath.Join(dir, "cni", "conf")
	if n.spec.Subnet != "" {
		cniBin = "/usr/lib/cni"
		files[filepath.Join("cni", "conf", "10-bridge.conflist")] = n.network()
	}

	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = %q\n    conf_dir = %q\n", cniBin, cniConf)
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = %q\n", filepath.Join(dir, "hosts"))

	for _, host := range slices.Sorted(maps.Keys(reg.Auths)) {
		a := reg.Auths[host]
		fmt.Fprintf(&b, "    [plugins.\"io.containerd.grpc.v1.cri\".registry.configs.%q.auth]\n      username = %q\n      password = %q\n", host, a.Username, a.Password)
	}

	files["config.toml"] = b.String()

	return files
}

// write puts the rendered files in place, and removes the hosts.toml of a registry no longer
// mirrored.
func (n *Node) write(files map[string]string) error {
	_ = os.RemoveAll(filepath.Join(n.spec.Dir, "hosts"))

	for _, rel := range slices.Sorted(maps.Keys(files)) {
		p := filepath.Join(n.spec.Dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}

		if err := os.WriteFile(p, []byte(files[rel]), 0o600); err != nil {
			return err
		}
	}

	return nil
}

// network is the pod network: a bridge with host-local addresses, no masquerade.
func (n *Node) network() string {
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "ghcrsync-sandbox", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "loopback"}
]}
`, n.spec.Bridge, n.spec.Subnet, filepath.Join(n.spec.Dir, "cni", "ipam"))
}

// Pull asks containerd's CRI image service to pull image as the kubelet does: with the pull
// secret's credential when pullSecret is set, else with what the node's config holds. It returns
// the image's id (its config digest).
func (n *Node) Pull(ctx context.Context, image string, pullSecret *Auth) (string, error) {
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}
	if pullSecret != nil {
		req.Auth = &runtimeapi.AuthConfig{Username: pullSecret.Username, Password: pullSecret.Password}
	}

	resp, err := n.images(func(c runtimeapi.ImageServiceClient) (any, error) { return c.PullImage(ctx, req) })
	if err != nil {
		return "", err
	}

	return resp.(*runtimeapi.PullImageResponse).ImageRef, nil
}

// Remove deletes image from the node (a pull after it goes to the registry again).
func (n *Node) Remove(ctx context.Context, image string) error {
	_, err := n.images(func(c runtimeapi.ImageServiceClient) (any, error) {
		return c.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	})

	return err
}

// Has reports whether image is on the node.
func (n *Node) Has(ctx context.Context, image string) (bool, error) {
	resp, err := n.images(func(c runtimeapi.ImageServiceClient) (any, error) {
		return c.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	})
	if err != nil {
		return false, err
	}

	return resp.(*runtimeapi.ImageStatusResponse).Image != nil, nil
}

// images and runtime call the node's CRI image and runtime services over its socket.
func (n *Node) images(call func(runtimeapi.ImageServiceClient) (any, error)) (any, error) {
	return n.cri(func(conn *grpc.ClientConn) (any, error) { return call(runtimeapi.NewImageServiceClient(conn)) })
}

func (n *Node) runtime(call func(runtimeapi.RuntimeServiceClient) (any, error)) (any, error) {
	return n.cri(func(conn *grpc.ClientConn) (any, error) { return call(runtimeapi.NewRuntimeServiceClient(conn)) })
}

func (n *Node) cri(call func(*grpc.ClientConn) (any, error)) (any, error) {
	conn, err := grpc.NewClient("unix://"+n.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()

	return call(conn)
}

// Stop stops containerd (SIGTERM, then SIGKILL after 10 s); its containers run on under their
// shims.
func (n *Node) Stop() {
	if n.proc != nil {
		_ = n.proc.Stop(10 * time.Second)
		n.proc = nil
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}

	return strings.Join(l, "\n")
}

// Shutdown is a machine going down: every pod sandbox (and so every container) the node runs
// is removed, containerd stops, any shim it left ends, and what it mounted under its folder is
// unmounted. Its image store stays for the next start.
func (n *Node) Shutdown(ctx context.Context) {
	if n.proc != nil {
		_, _ = n.runtime(func(c runtimeapi.RuntimeServiceClient) (any, error) {
			list, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			if err != nil {
				return nil, err
			}

			for _, s := range list.Items {
				_, _ = c.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id})
				_, _ = c.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id})
			}

			return nil, nil
		})
	}

	n.Stop()
	killShimsOf(n.Socket())
	UnmountUnder(n.spec.Dir)
}

// Teardown is Shutdown and the pod network's bridge removed: nothing of the node outlives it.
func (n *Node) Teardown(ctx context.Context) {
	n.Shutdown(ctx)
	n.RemoveBridge()
}

// killShimsOf kills the containerd shims serving the containerd at socket.
func killShimsOf(socket string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "containerd-shim") || !strings.Contains(string(b), socket) {
			continue
		}

		var pid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// UnmountUnder unmounts every mount point under dir, deepest first (lazily: a mount still busy
// goes when its last user does).
func UnmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}

	var points []string

	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}

	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })

	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
