package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/child"
)

// KubeletConfig is one real node's kubelet: the binary (scripts/build-kubelet.sh), its folder,
// the Node's name and address, a kubeconfig of its node identity (system:node:NAME), the port
// it serves on, and the node's containerd.
type KubeletConfig struct {
	Binary, Dir, NodeName, NodeIP, Kubeconfig string
	// RootDir is its --root-dir (Dir/root when unset).
	RootDir string
	Port    int
	Runtime *Node
	// BootID, when set, is the boot id the kubelet reports (status.nodeInfo.bootID): it runs in
	// a mount namespace of its own where a file holding it is bind-mounted over
	// /proc/sys/kernel/random/boot_id, so a machine's reboot shows a new boot as a real one does.
	BootID string
	// ProviderID is the Node's spec.providerID (the cloud's name for the machine), "" none.
	ProviderID string
	// Heartbeat is how often it reports the Node's status and renews its Lease (the sandbox's
	// node-monitor grace period is four of them); 0 for 5 s.
	Heartbeat time.Duration
}

// Kubelet is a running kubelet.
type Kubelet struct {
	cfg  KubeletConfig
	proc *child.Process
}

// Pid is the kubelet's process id, for leak checks.
func (k *Kubelet) Pid() int { return k.proc.Pid() }

// LogPath is the kubelet's log.
func (k *Kubelet) LogPath() string { return filepath.Join(k.cfg.Dir, "kubelet.log") }

// StartKubelet starts a kubelet that registers cfg.NodeName with the API server and runs pods
// on cfg.Runtime. It is told what this machine is: cgroup v1 with the cgroupfs driver (allowed
// explicitly, failCgroupV1: false), no QoS cgroups or node allocatable enforcement (the
// machine's resources are shared with the other sandbox nodes), no eviction thresholds and no
// image garbage collection (a test decides what is on the node).
func StartKubelet(cfg KubeletConfig) (*Kubelet, error) {
	for _, d := range []string{"root", "certs", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}

	// The Lease is renewed every quarter of its duration: one heartbeat.
	heartbeat := cfg.Heartbeat
	if heartbeat <= 0 {
		heartbeat = 5 * time.Second
	}

	leaseSeconds := max(1, int((4*heartbeat+time.Second-1)/time.Second))

	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %q
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: "unix://%s"
podLogsDir: %q
resolvConf: ""
registerNode: true
serializeImagePulls: false
evictionHard: {"memory.available": "0%%", "nodefs.available": "0%%", "imagefs.available": "0%%", "nodefs.inodesFree": "0%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
nodeStatusUpdateFrequency: %s
nodeStatusReportFrequency: %s
nodeLeaseDurationSeconds: %d
syncFrequency: 5s
providerID: %q
`, cfg.NodeIP, cfg.Port, cfg.Runtime.Socket(), filepath.Join(cfg.Dir, "logs"), heartbeat, heartbeat, leaseSeconds, cfg.ProviderID)

	confPath := filepath.Join(cfg.Dir, "kubelet.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}

	root := cfg.RootDir
	if root == "" {
		root = filepath.Join(cfg.Dir, "root")
	}

	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}

	args := []string{cfg.Binary, "--config", confPath, "--kubeconfig", cfg.Kubeconfig,
		"--root-dir", root, "--cert-dir", filepath.Join(cfg.Dir, "certs"),
		"--hostname-override", cfg.NodeName, "--node-ip", cfg.NodeIP, "--v", "2"}

	if cfg.BootID != "" {
		bootFile := filepath.Join(cfg.Dir, "boot_id")
		if err := os.WriteFile(bootFile, []byte(cfg.BootID+"\n"), 0o444); err != nil {
			return nil, err
		}

		args = append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
			`mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@"`, bootFile}, args...)
	}

	proc, err := child.Start("kubelet", args[0], args[1:], []string{path}, cfg.Dir)
	if err != nil {
		return nil, err
	}

	return &Kubelet{cfg: cfg, proc: proc}, nil
}

// Stop stops the kubelet (SIGTERM, then SIGKILL after 10 s). Its pods' containers stay, as on
// a kubelet restart.
func (k *Kubelet) Stop() {
	_ = k.proc.Stop(10 * time.Second)
	UnmountUnder(k.cfg.Dir) // the volumes it mounted for pods
}
