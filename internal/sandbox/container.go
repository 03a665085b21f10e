package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/containerd"
)

// ProcessImage is an image the simulated kubelets really run: its process starts on the host,
// chrooted into a root file system holding the image's one binary and the pod's volumes as a
// kubelet lays them out (secret, ConfigMap, projected service-account token, downward API and
// emptyDir volumes, with their modes and fsGroup ownership), as the pod's user and groups, with
// the pod's environment. What a container adds beyond that (namespaces, cgroups, seccomp,
// capabilities) is not simulated: a non-root process holds none of root's privileges anyway.
// It needs the sandbox to run as root (chroot, setuid); otherwise the pod fails to start and
// says so.
type ProcessImage struct {
	Binary     string   // host path of a static binary: the image's content
	Entrypoint string   // where the image has it (its ENTRYPOINT), e.g. /usr/local/bin/ghcrsync
	User       int64    // the image's USER
	Group      int64    // the image's USER group
	Env        []string // the image's ENV
}

// RunImage makes the kubelets run pods of image as processes (ProcessImage).
func (f *Fleet) RunImage(image string, p ProcessImage) {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()

	if f.processImages == nil {
		f.processImages = map[string]ProcessImage{}
	}

	f.processImages[image] = p
}

func (f *Fleet) processImage(image string) (ProcessImage, bool) {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()

	p, ok := f.processImages[image]

	return p, ok
}

// ContainerLog is what a process-run pod wrote to stdout and stderr (kubectl logs).
func (f *Fleet) ContainerLog(uid types.UID) (string, error) {
	b, err := os.ReadFile(filepath.Join(f.opts.Dir, "containers", string(uid)+".log"))

	return string(b), err
}

// KillContainer kills the process of the pod uid with SIGKILL, as the kernel's OOM killer
// does: no chance to wind down. Its kubelet then reports the container terminated (exit 137)
// and the pod Failed. It reports whether such a process was running.
func (f *Fleet) KillContainer(uid types.UID) bool {
	for _, m := range f.Machines() {
		k := m.kubelet // set before the machine joins the fleet
		if k == nil {
			continue
		}

		k.mu.Lock()
		p := k.processes[uid]
		k.mu.Unlock()

		if p != nil {
			return p.cmd.Process.Signal(syscall.SIGKILL) == nil
		}
	}

	return false
}

// containerProcess is one running container process.
type containerProcess struct {
	cmd      *exec.Cmd
	done     chan struct{}
	stopping bool // SIGTERM sent (the kubelet's lock)
}

// runsProcess reports whether the pod is one the kubelet runs as a process.
func (k *kubelet) runsProcess(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if _, ok := k.m.fleet.processImage(c.Image); ok {
			return true
		}
	}

	return false
}

// start lays the container out and starts its process. An executable another process of the
// sandbox holds open for writing as it forks (ETXTBSY: the binary just copied into the layout,
// its descriptor inherited by a concurrent fork — golang/go#22315) is laid out and started again,
// a few times: the host's race, not the pod's failure. The reason names a failure as the
// kubelet would.
func (k *kubelet) start(ctx context.Context, pod *corev1.Pod, c corev1.Container, img ProcessImage) (*exec.Cmd, string, error) {
	dir := filepath.Join(k.m.fleet.opts.Dir, "containers", string(pod.UID))

	for attempt := 0; ; attempt++ {
		cmd, err := k.container(ctx, pod, c, img)
		if err != nil {
			containerd.UnmountUnder(dir)

			return nil, "CreateContainerConfigError", err
		}

		err = cmd.Start()
		if err == nil {
			return cmd, "", nil
		}

		if f, ok := cmd.Stdout.(io.Closer); ok {
			_ = f.Close()
		}

		containerd.UnmountUnder(dir)

		if !errors.Is(err, syscall.ETXTBSY) || attempt >= 10 {
			return nil, "StartError", err
		}

		time.Sleep(100 * time.Millisecond)
	}
}

// syncProcessPod is syncPod for a pod the kubelet runs as a process: pull, lay out, start, and
// report the exit as a real kubelet does for a restartPolicy Never pod.
func (k *kubelet) syncProcessPod(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	running, ran := k.processes[pod.UID], k.ran[pod.UID]
	k.mu.Unlock()

	if pod.DeletionTimestamp != nil && running != nil {
		k.terminate(pod, running)

		return
	}

	// A restartPolicy Never pod runs once: a resync may still show it Running from the cache.
	if running != nil || ran || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}

	c := pod.Spec.Containers[0]
	img, _ := k.m.fleet.processImage(c.Image)
	now := metav1.Now()

	fail := func(reason, message string) {
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image}
		st.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: reason, Message: message, StartedAt: now, FinishedAt: now}
		k.postPod(ctx, pod, corev1.PodFailed, st, now)
	}

	switch {
	case len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) > 0:
		fail("StartError", "the sandbox runs process images only in single-container pods")
		return
	case pod.Spec.RestartPolicy != corev1.RestartPolicyNever:
		fail("StartError", "the sandbox runs process images only in restartPolicy Never pods")
		return
	case os.Geteuid() != 0:
		fail("StartError", "the sandbox runs container processes only as root (chroot, setuid)")
		return
	}

	// A failed pull backs off as syncPod's do (its status write would otherwise wake the next).
	if until, ok := k.backoff[pod.UID]; ok && time.Now().Before(until) {
		return
	}

	digest, err := k.ensureImage(ctx, pod, c, k.pullCredentials(ctx, pod))
	if err != nil {
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image}
		st.State.Waiting = pullWaiting(err)
		k.postPod(ctx, pod, corev1.PodPending, st, now)
		k.backoff[pod.UID] = time.Now().Add(2 * k.heartbeat())

		return
	}

	cmd, reason, err := k.start(ctx, pod, c, img)
	if err != nil {
		fail(reason, err.Error())

		return
	}

	p := &containerProcess{cmd: cmd, done: make(chan struct{})}

	k.mu.Lock()
	k.processes[pod.UID] = p
	k.ran[pod.UID] = true
	k.mu.Unlock()

	st := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: imageID(c.Image, digest), Started: ptr.To(true), Ready: true}
	st.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
	k.postPod(ctx, pod, corev1.PodRunning, st, now)

	k.wg.Add(1)

	go func() {
		defer k.wg.Done()

		err := cmd.Wait()
		close(p.done)

		if f, ok := cmd.Stdout.(io.Closer); ok {
			_ = f.Close()
		}

		code := cmd.ProcessState.ExitCode()
		if code < 0 || err != nil && !errors.As(err, new(*exec.ExitError)) {
			code = 137 // killed: the node went down under it
		}

		root := filepath.Join(k.m.fleet.opts.Dir, "containers", string(pod.UID))
		message := readTerminationMessage(filepath.Join(root, terminationLog(c)))
		containerd.UnmountUnder(root) // the pod's hostPath mounts

		end := st.DeepCopy()
		end.Ready, end.Started = false, ptr.To(false)
		end.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: int32(code), Reason: map[bool]string{true: "Completed", false: "Error"}[code == 0],
			StartedAt: now, FinishedAt: metav1.Now(), Message: message,
		}}

		phase := corev1.PodSucceeded
		if code != 0 {
			phase = corev1.PodFailed
		}

		// The node's own context may be gone (a reboot): report with the fleet's.
		if latest, err := k.client.CoreV1().Pods(pod.Namespace).Get(k.m.fleet.ctx, pod.Name, getOpts); err == nil && latest.UID == pod.UID {
			k.postPod(k.m.fleet.ctx, latest, phase, *end, now)
		}

		k.mu.Lock()
		delete(k.processes, pod.UID)
		k.mu.Unlock()

		select {
		case k.queue <- pod.Namespace + "/" + pod.Name: // a deletion waiting on the exit
		default:
		}
	}()
}

// terminate stops a pod's process as a kubelet does on deletion: SIGTERM, then SIGKILL once the
// grace period is over.
func (k *kubelet) terminate(pod *corev1.Pod, p *containerProcess) {
	k.mu.Lock()
	again := p.stopping
	p.stopping = true
	k.mu.Unlock()

	if again {
		return
	}

	_ = p.cmd.Process.Signal(syscall.SIGTERM)

	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}

	go func() {
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
		}
	}()
}

func (k *kubelet) postPod(ctx context.Context, pod *corev1.Pod, phase corev1.PodPhase, cs corev1.ContainerStatus, start metav1.Time) {
	updated := pod.DeepCopy()
	updated.Status.Phase = phase
	updated.Status.HostIP, updated.Status.HostIPs = k.m.IP, []corev1.HostIP{{IP: k.m.IP}}
	updated.Status.StartTime = &start
	updated.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	updated.Status.Conditions = podConditions(phase == corev1.PodRunning, metav1.Now())

	if phase == corev1.PodRunning {
		updated.Status.PodIP = podIP(pod.UID)
		updated.Status.PodIPs = []corev1.PodIP{{IP: updated.Status.PodIP}}
	}

	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		k.m.fleet.log.Debug("kubelet process pod status", "pod", pod.Namespace+"/"+pod.Name, "error", err)
	}
}

// container lays out the pod's root file system and returns its process, not started.
func (k *kubelet) container(ctx context.Context, pod *corev1.Pod, c corev1.Container, img ProcessImage) (*exec.Cmd, error) {
	sc := effectiveSecurity(pod, c, img)
	if sc.nonRoot && sc.uid == 0 {
		return nil, errors.New("container has runAsNonRoot and image will run as root")
	}

	dir := filepath.Join(k.m.fleet.opts.Dir, "containers")
	root := filepath.Join(dir, string(pod.UID))

	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}

	// The image: its binary, and the directories a distroless image has. A read-only root file
	// system is root's and not writable; otherwise /tmp and the home directory are.
	writable := os.FileMode(0o1777)
	if sc.readOnlyRoot {
		writable = 0o555
	}

	for _, d := range []string{"tmp", "home/nonroot"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}

		if err := os.Chmod(filepath.Join(root, d), writable); err != nil {
			return nil, err
		}
	}

	if err := copyFile(img.Binary, filepath.Join(root, img.Entrypoint), 0o755); err != nil {
		return nil, fmt.Errorf("image %s: %w", c.Image, err)
	}

	for _, vm := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 {
			return nil, fmt.Errorf("volume %q not found", vm.Name)
		}

		if err := k.mountVolume(ctx, pod, pod.Spec.Volumes[i], filepath.Join(root, vm.MountPath), sc); err != nil {
			return nil, fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", vm.Name, err)
		}
	}

	env, err := k.environment(ctx, pod, c, img)
	if err != nil {
		return nil, err
	}

	// The container's message to its kubelet (terminationMessagePath, /dev/termination-log by
	// default): read when it ends.
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		return nil, err
	}

	if err := os.WriteFile(filepath.Join(root, terminationLog(c)), nil, 0o666); err != nil {
		return nil, err
	}

	argv := append([]string{img.Entrypoint}, c.Args...)
	if len(c.Command) > 0 {
		argv = append(slices.Clone(c.Command), c.Args...)
	}

	log, err := os.OpenFile(filepath.Join(dir, string(pod.UID)+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}

	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Path = argv[0] // resolved inside the chroot, not on the host
	cmd.Env = env
	cmd.Dir = "/"

	if c.WorkingDir != "" {
		cmd.Dir = c.WorkingDir
	}

	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     root,
		Setpgid:    true,
		Credential: &syscall.Credential{Uid: uint32(sc.uid), Gid: uint32(sc.gid), Groups: sc.groups},
	}

	return cmd, nil
}

// security is what a container runs as.
type security struct {
	uid, gid     int64
	groups       []uint32
	fsGroup      *int64
	nonRoot      bool
	readOnlyRoot bool
}

// effectiveSecurity resolves the container's identity as the kubelet does: the container's
// securityContext over the pod's over the image's USER; fsGroup and supplementalGroups are
// the process's supplementary groups.
func effectiveSecurity(pod *corev1.Pod, c corev1.Container, img ProcessImage) security {
	s := security{uid: img.User, gid: img.Group}
	psc, csc := pod.Spec.SecurityContext, c.SecurityContext

	if psc != nil {
		s.uid, s.gid = deref(psc.RunAsUser, s.uid), deref(psc.RunAsGroup, s.gid)
		s.nonRoot = deref(psc.RunAsNonRoot, false)
		s.fsGroup = psc.FSGroup

		for _, g := range psc.SupplementalGroups {
			s.groups = append(s.groups, uint32(g))
		}

		if psc.FSGroup != nil {
			s.groups = append(s.groups, uint32(*psc.FSGroup))
		}
	}

	if csc != nil {
		s.uid, s.gid = deref(csc.RunAsUser, s.uid), deref(csc.RunAsGroup, s.gid)
		s.nonRoot = deref(csc.RunAsNonRoot, s.nonRoot)
		s.readOnlyRoot = deref(csc.ReadOnlyRootFilesystem, false)
	}

	return s
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}

	return *p
}

// mountVolume writes a volume's files as the kubelet does: each file with its item mode or the
// volume's defaultMode (0644 if unset), root's, and with an fsGroup group-owned by it and made
// group-readable (the kubelet's SetVolumeOwnership for a read-only volume).
func (k *kubelet) mountVolume(ctx context.Context, pod *corev1.Pod, v corev1.Volume, dir string, sc security) error {
	files := map[string][]byte{}
	modes := map[string]*int32{}
	mode := ptr.To(int32(0o644))

	switch {
	case v.HostPath != nil:
		src, ok := k.m.hostPath(v.HostPath.Path)
		if !ok {
			return fmt.Errorf("hostPath %s: the sandbox's kubelet mounts only the kubelet's root directory (/var/lib/kubelet) from the machine", v.HostPath.Path)
		}

		if err := os.MkdirAll(src, 0o700); err != nil {
			return err
		}

		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}

		return syscall.Mount(src, dir, "", syscall.MS_BIND, "") // unmounted when the process ends
	case v.EmptyDir != nil:
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}

		return os.Chmod(dir, 0o777)
	case v.Secret != nil:
		s, err := k.secret(ctx, pod.Namespace, v.Secret.SecretName)
		if err != nil {
			return err
		}

		mode = ptr.To(deref(v.Secret.DefaultMode, *mode))
		if err := project(files, modes, s.Data, v.Secret.Items); err != nil {
			return err
		}
	case v.Projected != nil:
		mode = ptr.To(deref(v.Projected.DefaultMode, *mode))

		for _, src := range v.Projected.Sources {
			if err := k.projectSource(ctx, pod, src, files, modes); err != nil {
				return err
			}
		}
	default:
		return errors.New("the sandbox's kubelet mounts only secret, projected and emptyDir volumes")
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}

		m := os.FileMode(deref(modes[name], *mode)) & 0o777
		gid := 0

		if sc.fsGroup != nil {
			m |= 0o440
			gid = int(*sc.fsGroup)
		}

		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}

		if err := os.Chown(path, 0, gid); err != nil {
			return err
		}

		if err := os.Chmod(path, m); err != nil {
			return err
		}
	}

	return nil
}

// project adds a Secret's or ConfigMap's keys (all, or the listed items) to files.
func project(files map[string][]byte, modes map[string]*int32, data map[string][]byte, items []corev1.KeyToPath) error {
	if len(items) == 0 {
		for key, b := range data {
			files[key] = b
		}

		return nil
	}

	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("configmap or secret has no key %q", it.Key)
		}

		files[it.Path], modes[it.Path] = b, it.Mode
	}

	return nil
}

func (k *kubelet) projectSource(ctx context.Context, pod *corev1.Pod, src corev1.VolumeProjection, files map[string][]byte, modes map[string]*int32) error {
	switch {
	case src.ServiceAccountToken != nil:
		// A token bound to the pod, requested with the node's identity (NodeRestriction).
		tok, err := k.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				Audiences:         slices.DeleteFunc([]string{src.ServiceAccountToken.Audience}, func(s string) bool { return s == "" }),
				ExpirationSeconds: ptr.To(deref(src.ServiceAccountToken.ExpirationSeconds, 3607)),
				BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("service account token: %w", err)
		}

		files[src.ServiceAccountToken.Path] = []byte(tok.Status.Token)
	case src.ConfigMap != nil:
		cm, err := k.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, src.ConfigMap.Name, getOpts)
		if err != nil {
			return fmt.Errorf("configmap %q: %w", src.ConfigMap.Name, err)
		}

		data := map[string][]byte{}
		for key, v := range cm.Data {
			data[key] = []byte(v)
		}

		return project(files, modes, data, src.ConfigMap.Items)
	case src.Secret != nil:
		s, err := k.secret(ctx, pod.Namespace, src.Secret.Name)
		if err != nil {
			return err
		}

		return project(files, modes, s.Data, src.Secret.Items)
	case src.DownwardAPI != nil:
		for _, it := range src.DownwardAPI.Items {
			if it.FieldRef == nil {
				return fmt.Errorf("downward API item %q: the sandbox resolves only fieldRef", it.Path)
			}

			v, err := fieldValue(pod, it.FieldRef.FieldPath)
			if err != nil {
				return err
			}

			files[it.Path], modes[it.Path] = []byte(v), it.Mode
		}
	}

	return nil
}

// secret reads a Secret with the node's identity: the Node authorizer allows it once the pod
// that references it is bound here, which it learns a moment after the binding.
func (k *kubelet) secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	s, err := k.client.CoreV1().Secrets(namespace).Get(ctx, name, getOpts)
	for try := 0; apierrors.IsForbidden(err) && try < 20 && ctx.Err() == nil; try++ {
		time.Sleep(100 * time.Millisecond)
		s, err = k.client.CoreV1().Secrets(namespace).Get(ctx, name, getOpts)
	}

	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}

	return s, nil
}

// environment is the process's environment: the image's, the API's service variables (the
// apiserver's address itself: the sandbox has no kube-proxy to route the Service's IP), then the
// container's own, with the downward API resolved.
func (k *kubelet) environment(ctx context.Context, pod *corev1.Pod, c corev1.Container, img ProcessImage) ([]string, error) {
	u, err := url.Parse(k.m.fleet.endpoint.url())
	if err != nil {
		return nil, err
	}

	env := append(slices.Clone(img.Env), "HOSTNAME="+pod.Name, "KUBERNETES_SERVICE_HOST="+u.Hostname(), "KUBERNETES_SERVICE_PORT="+u.Port())

	for _, e := range c.Env {
		v := e.Value

		switch from := e.ValueFrom; {
		case from == nil:
		case from.FieldRef != nil:
			if v, err = fieldValue(pod, from.FieldRef.FieldPath); err != nil {
				return nil, err
			}
		case from.SecretKeyRef != nil:
			s, err := k.secret(ctx, pod.Namespace, from.SecretKeyRef.Name)
			if err != nil {
				return nil, err
			}

			v = string(s.Data[from.SecretKeyRef.Key])
		default:
			return nil, fmt.Errorf("env %s: the sandbox resolves only value, fieldRef and secretKeyRef", e.Name)
		}

		env = append(env, e.Name+"="+v)
	}

	return env, nil
}

// fieldValue is a downward-API field of the pod.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	}

	return "", fmt.Errorf("downward API field %q is not resolved by the sandbox", path)
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}

	return os.WriteFile(dst, b, mode)
}

func (k *kubelet) hasProcess(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()

	return k.processes[uid] != nil
}

// terminationLog is the container's terminationMessagePath, relative to its root.
func terminationLog(c corev1.Container) string {
	p := c.TerminationMessagePath
	if p == "" {
		p = corev1.TerminationMessagePathDefault
	}

	return filepath.Clean("." + p)
}

// readTerminationMessage is what the container left in its termination log, at most 4096 bytes
// as the kubelet reads it.
func readTerminationMessage(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}

	if len(b) > 4096 {
		b = b[:4096]
	}

	return string(b)
}
