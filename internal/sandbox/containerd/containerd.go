// Package containerd runs a real container runtime for a sandbox node: Debian's containerd
// (1.6) with its CRI plugin, its own root, state and socket, configured from the node's Talos
// registry auth the way Talos renders it, and asked to pull through the CRI image service as the
// kubelet asks. Nothing here simulates a pull: the registry sees containerd's own requests.
//
// How a machine's config becomes containerd's (Talos's internal/pkg/containers/cri/containerd:
// GenerateCRIConfig and GenerateHosts):
//
//   - each RegistryAuthConfig (machine.registries.config.HOST.auth) becomes the CRI plugin's
//     registry.configs."HOST".auth (username, password, auth, identitytoken), HOST as
//     containerd's docker.DefaultHost gives it (docker.io → registry-1.docker.io);
//   - each mirror becomes a hosts.toml under registry.config_path (/etc/cri/conf.d/hosts/NAME),
//     one [host."ENDPOINT"] per endpoint with capabilities pull and resolve.
//
// containerd looks the credential up by the host it contacts, so with ghcr.io mirrored to the
// sandbox registry (which stands in for ghcr.io on loopback) the credential is keyed by the
// mirror's address here, where Talos, reaching ghcr.io itself, keys it ghcr.io. That is the one
// place the sandbox's rendering differs, and only in the key.
package containerd

import (
	"context"
	"errors"
	"fmt"
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
	dir      string
	registry string // the sandbox registry's host:port, the mirror of ghcr.io
	// subnet is the pod network's (a bridge CNI network), "" for none: a node that only pulls.
	subnet string
	proc   *child.Process
}

// path is a node's PATH: containerd finds runc in /usr/sbin, its shims in /usr/bin.
const path = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// Bridge is the pod network's bridge on this machine (StartWithPods): one per machine, removed
// by RemoveBridge.
const Bridge = "ghcrsync0"

// Socket is where its CRI and containerd APIs listen.
func (n *Node) Socket() string { return filepath.Join(n.dir, "containerd.sock") }

// LogPath is containerd's own log.
func (n *Node) LogPath() string { return filepath.Join(n.dir, "containerd.log") }

// Start renders the config from auth (nil: the machine's config holds no credential for the
// registry) and starts containerd.
func Start(ctx context.Context, dir, registry string, auth *Auth) (*Node, error) {
	n := &Node{dir: dir, registry: registry}

	return n, n.start(ctx, auth)
}

// StartWithPods is Start with a pod network (a bridge CNI network on subnet, the plugins of
// Debian's containernetworking-plugins), for a kubelet to run pods on.
func StartWithPods(ctx context.Context, dir, registry, subnet string, auth *Auth) (*Node, error) {
	n := &Node{dir: dir, registry: registry, subnet: subnet}

	return n, n.start(ctx, auth)
}

// RemoveBridge deletes the pod network's bridge (it outlives containerd).
func RemoveBridge() { _ = exec.Command("ip", "link", "del", Bridge).Run() }

// Reboot stops containerd and starts it again with the config auth renders: what a Talos 1.13
// node does at boot (it loads registry auth only then).
func (n *Node) Reboot(ctx context.Context, auth *Auth) error {
	n.Stop()

	return n.start(ctx, auth)
}

func (n *Node) start(ctx context.Context, auth *Auth) error {
	if err := n.render(auth); err != nil {
		return err
	}

	proc, err := child.Start("containerd", "containerd", []string{"--config", filepath.Join(n.dir, "config.toml")}, []string{path}, n.dir)
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

// render writes config.toml and the ghcr.io mirror's hosts.toml, as Talos renders a machine's
// registry auth and mirrors (see the package doc). The password is written to the config file
// only (mode 0600), as on a Talos machine; never to argv or a log.
func (n *Node) render(auth *Auth) error {
	// ghcr.io's mirror, and the registry under its own address (plain HTTP on loopback).
	mirror := "http://" + n.registry
	for _, name := range []string{"ghcr.io", n.registry} {
		hosts := filepath.Join(n.dir, "hosts", name)
		if err := os.MkdirAll(hosts, 0o700); err != nil {
			return err
		}

		hostsToml := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", mirror, mirror)

		if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(hostsToml), 0o600); err != nil {
			return err
		}
	}

	var b strings.Builder

	fmt.Fprintf(&b, "version = 2\nroot = %q\nstate = %q\n\n[grpc]\n  address = %q\n\n", filepath.Join(n.dir, "root"), filepath.Join(n.dir, "state"), n.Socket())
	// restrict_oom_score_adj: root on these machines (Firecracker VMs, as CI) lacks
	// CAP_SYS_RESOURCE, so no process may lower its oom_score_adj; the kubelet asks -998 for a pod
	// sandbox and runc's nsexec fails ("can't get final child's PID from pipe: EOF"). Restricted,
	// containerd never asks below its own score, as for a rootless containerd.
	fmt.Fprintf(&b, "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"ghcr.io/ghcrsync/pause:v1\"\n  restrict_oom_score_adj = true\n")
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"overlayfs\"\n")

	cniBin, cniConf := filepath.Join(n.dir, "cni", "bin"), filepath.Join(n.dir, "cni", "conf")
	if n.subnet != "" {
		cniBin = "/usr/lib/cni"
		if err := n.writeNetwork(cniConf); err != nil {
			return err
		}
	}

	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = %q\n    conf_dir = %q\n", cniBin, cniConf)
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = %q\n", filepath.Join(n.dir, "hosts"))

	if auth != nil {
		fmt.Fprintf(&b, "    [plugins.\"io.containerd.grpc.v1.cri\".registry.configs.%q.auth]\n      username = %q\n      password = %q\n",
			n.registry, auth.Username, auth.Password)
	}

	return os.WriteFile(filepath.Join(n.dir, "config.toml"), []byte(b.String()), 0o600)
}

// writeNetwork is the pod network: a bridge with host-local addresses, no masquerade.
func (n *Node) writeNetwork(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "ghcrsync-sandbox", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "loopback"}
]}
`, Bridge, n.subnet, filepath.Join(n.dir, "cni", "ipam"))

	return os.WriteFile(filepath.Join(dir, "10-bridge.conflist"), []byte(conf), 0o600)
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

// Stop stops containerd (SIGTERM, then SIGKILL after 10 s).
func (n *Node) Stop() {
	_ = n.proc.Stop(10 * time.Second)
	n.proc = nil
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}

	return strings.Join(l, "\n")
}

// Teardown removes every pod sandbox (and so every container) the node runs, stops containerd,
// ends any shim it left, and unmounts what it mounted under its folder: nothing of the node
// outlives the test.
func (n *Node) Teardown(ctx context.Context) {
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
	UnmountUnder(n.dir)
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
