package keyring

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Writer is where and how ghcrsync's keyring writer pods run (nodes.kubelet_keyring).
type Writer struct {
	// Image is the writer's image — ghcrsync's own, by digest, from a registry whose pulls never
	// need the credential being rotated (a keyring that holds a revoked credential must still be
	// rewritable).
	Image string
	// Namespace holds the writer pods and the Secret they read the credential from, nothing else.
	Namespace string
	// Secret is that Secret (a dockerconfigjson with the registry's entry only).
	Secret string
	// Registry is the registry whose entry is written.
	Registry string
	// Window is how long after the write the kubelet may take to read the keyring.
	Window time.Duration
}

// AwaitStep is how long one writer pod in ModeAwait waits for the kubelet's read: between two,
// a probe pull makes the kubelet read its keyring once its cache has expired.
const AwaitStep = 20 * time.Second

// What a writer pod does to the keyring.
type Mode string

const (
	ModeWrite  Mode = "write"
	ModeRead   Mode = "read"
	ModeRemove Mode = "remove"
	// ModeAwait waits, up to the keyring's window, for the kubelet to read the keyring after its
	// last change: the file's access time passing its change time (the kubelet reads it at a
	// pull, at most CacheLifetime after its last read). It reads nothing that would count.
	ModeAwait Mode = "await"
)

// The writer pod's fixed shape, which the admission policy ghcrsync-keyring-writers pins.
const (
	// Label marks writer pods (its value: the node); AttemptLabel tells one create from another.
	Label        = "ghcrsync.dev/keyring-node"
	AttemptLabel = "ghcrsync.dev/keyring-attempt"
	// Binary is the ghcrsync binary in its image (the shipped image's entrypoint, release.ImageBinary).
	Binary = "/usr/local/bin/ghcrsync"
	// Command is the writer's subcommand.
	Command = "node-keyring"
	// MountPath is where the kubelet's root directory is mounted in the writer.
	MountPath = "/kubelet"
	// EntryEnv carries the credential into the writer, from the Secret (never in the spec).
	EntryEnv = "GHCRSYNC_KEYRING_ENTRY"
	// SecretKey is the Secret's key the writer reads.
	SecretKey = corev1.DockerConfigJsonKey
	// ServiceAccount runs the writer pods, with no token.
	ServiceAccount = "default"
	volume         = "kubelet"
)

// DefaultRootDir is the kubelet's root directory on Talos (the kubelet's default; Talos sets no
// --root-dir unless machine.kubelet.extraArgs does).
const DefaultRootDir = "/var/lib/kubelet"

// Args are the writer's arguments for mode on a node whose kubelet root directory is rootDir.
func Args(w Writer, mode Mode, rootDir string) []string {
	args := []string{Command, string(mode), "--root", MountPath, "--registry", w.Registry, "--node-path", path.Join(rootDir, File)}
	if mode == ModeAwait {
		args = append(args, "--within", AwaitStep.String())
	}

	return args
}

// Pod is the one writer pod: pinned to node, tolerating everything, root (the kubelet's root
// directory is root's, mode 0700) with every capability dropped, no privilege escalation, a
// read-only root file system and the runtime's default seccomp profile; one volume, the
// kubelet's root directory; no service-account token; the credential from the Secret in an
// environment variable (write mode only), never in the spec.
func Pod(node string, w Writer, mode Mode, rootDir, attempt string) *corev1.Pod {
	c := corev1.Container{
		Name: "writer", Image: w.Image, ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{Binary}, Args: Args(w, mode, rootDir),
		VolumeMounts: []corev1.VolumeMount{{Name: volume, MountPath: MountPath}},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser: ptr.To(int64(0)), RunAsNonRoot: ptr.To(false), Privileged: ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: memory},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: memoryLimit},
		},
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}

	if mode == ModeWrite {
		c.Env = []corev1.EnvVar{{Name: EntryEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: w.Secret}, Key: SecretKey,
		}}}}
	}

	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "ghcrsync-keyring-",
			Namespace:    w.Namespace,
			Labels:       map[string]string{Label: node, AttemptLabel: attempt, "app.kubernetes.io/managed-by": "ghcrsync"},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			ServiceAccountName:            ServiceAccount,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Volumes: []corev1.Volume{{Name: volume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: rootDir, Type: ptr.To(corev1.HostPathDirectory),
			}}}},
			Containers: []corev1.Container{c},
		},
	}
}

// Admitted checks the writer pod as admission left it: another image, command, volume, account
// or a token would make it something else than the writer the policy bounds.
func Admitted(pod *corev1.Pod, w Writer, mode Mode, rootDir string) error {
	var changed []string

	if len(pod.Spec.InitContainers)+len(pod.Spec.EphemeralContainers) > 0 || len(pod.Spec.Containers) != 1 {
		changed = append(changed, "containers")
	} else if c := pod.Spec.Containers[0]; c.Image != w.Image || !slices.Equal(c.Command, []string{Binary}) || !slices.Equal(c.Args, Args(w, mode, rootDir)) {
		changed = append(changed, fmt.Sprintf("the container (image %s, command %s)", c.Image, strings.Join(append(slices.Clone(c.Command), c.Args...), " ")))
	}

	if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].HostPath == nil || pod.Spec.Volumes[0].HostPath.Path != rootDir {
		changed = append(changed, "the volumes")
	}

	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		changed = append(changed, "the service-account token")
	}

	if len(changed) == 0 {
		return nil
	}

	return fmt.Errorf("admission changed the keyring writer pod in %s (%s): exempt ghcrsync's writer (namespace %s) from the mutation",
		w.Namespace, strings.Join(changed, "; "), w.Namespace)
}

// The writer's resources: it reads and writes one small file.
var (
	cpu         = resource.MustParse("10m")
	memory      = resource.MustParse("16Mi")
	memoryLimit = resource.MustParse("64Mi")
)

// Outcome judges one sight of a writer pod: done when its container ended (its report, or what
// failed) or when the kubelet cannot start it (a pull that failed, a config error such as a
// missing Secret); not done while it waits to start or runs.
func Outcome(pod *corev1.Pod) (done bool, r Report, err error) {
	if pod.Status.Phase == corev1.PodFailed && len(pod.Status.ContainerStatuses) == 0 {
		return true, Report{}, fmt.Errorf("the kubelet rejected the keyring writer pod: %s %s", pod.Status.Reason, pod.Status.Message)
	}

	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			r, err := ParseReport(cs.State.Terminated.Message)

			return true, r, err
		case cs.State.Terminated != nil:
			t := cs.State.Terminated

			return true, Report{}, fmt.Errorf("the keyring writer exited %d (%s): %s", t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
		case cs.State.Waiting != nil && cannotStart(cs.State.Waiting.Reason):
			return true, Report{}, fmt.Errorf("the keyring writer cannot start: %s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
		}
	}

	return false, Report{}, nil
}

// cannotStart reports a waiting reason the kubelet will not get past on its own.
func cannotStart(reason string) bool {
	switch reason {
	case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
		return true
	}

	return false
}
