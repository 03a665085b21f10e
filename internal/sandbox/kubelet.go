package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
)

var (
	getOpts    = metav1.GetOptions{}
	everything = labels.Everything()
)

// kubelet simulates a node's kubelet with the node's own identity (system:node:NAME, so the
// Node authorizer and NodeRestriction apply): it registers the Node, posts status heartbeats
// and renews its kube-node-lease Lease every heartbeat (each status write bumps the Node's
// resourceVersion, as a real kubelet's does), runs the pods bound to it by pulling their
// images from the sandbox registry with the machine's effective credential, and finalises
// graceful deletions.
type kubelet struct {
	m      *Machine
	client kubernetes.Interface

	mu      sync.Mutex
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	backoff map[types.UID]time.Time
	queue   chan string // pod names to sync

	// keyring is its node keyring's cache, empty at each start (kubelet 1.35's).
	keyring *nodeKeyring

	processes map[types.UID]*containerProcess // the process-run pods' processes (ProcessImage)
	ran       map[types.UID]bool              // process-run pods started once (restartPolicy Never)
}

func (k *kubelet) heartbeat() time.Duration { return k.m.fleet.opts.Heartbeat }

// reregister is the kubelet's registration at its start (every boot): a Node deleted while the
// machine was down is created again — a new object, a new uid, the same name — and labelled as
// Talos labels it.
func (k *kubelet) reregister(ctx context.Context) {
	if _, err := k.client.CoreV1().Nodes().Get(ctx, k.m.Name, getOpts); !apierrors.IsNotFound(err) {
		return
	}

	if err := k.register(ctx); err != nil {
		k.m.fleet.log.Debug("kubelet register", "node", k.m.Name, "error", err)

		return
	}

	if err := k.m.fleet.labelNode(ctx, k.m); err != nil {
		k.m.fleet.log.Debug("kubelet register", "node", k.m.Name, "error", err)
	}
}

// register creates the Node object with the kubelet's registration fields.
func (k *kubelet) register(ctx context.Context) error {
	m := k.m
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Name,
			Labels: map[string]string{
				"kubernetes.io/hostname": m.Name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
			},
		},
		Spec:   corev1.NodeSpec{ProviderID: fmt.Sprintf("%s%d", HcloudProviderIDPrefix, m.ServerID)},
		Status: k.status(true, ""),
	}

	if m.Role == RoleControlPlane {
		node.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
	}

	if m.Autoscaled {
		node.Labels["node.kubernetes.io/instance-type"] = "cx43"
	}

	_, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}

	return err
}

func (k *kubelet) status(ready bool, message string) corev1.NodeStatus {
	m := k.m
	now := metav1.Now()

	m.mu.Lock()
	bootID := m.bootID
	m.mu.Unlock()

	readyCond := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "kubelet is posting ready status", LastHeartbeatTime: now,
	}
	if !ready {
		readyCond.Status, readyCond.Reason, readyCond.Message = corev1.ConditionFalse, "KubeletNotReady", message
	}

	conds := []corev1.NodeCondition{readyCond}
	for c, reason := range map[corev1.NodeConditionType]string{
		corev1.NodeMemoryPressure: "KubeletHasSufficientMemory",
		corev1.NodeDiskPressure:   "KubeletHasNoDiskPressure",
		corev1.NodePIDPressure:    "KubeletHasSufficientPID",
	} {
		conds = append(conds, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, Reason: reason, LastHeartbeatTime: now})
	}

	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}

	return corev1.NodeStatus{
		Capacity:        capacity,
		Allocatable:     capacity,
		Conditions:      conds,
		Addresses:       addresses(m),
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID: strings.ReplaceAll(bootID, "-", ""), SystemUUID: m.Name, BootID: bootID,
			KernelVersion: "6.12.48-talos", OSImage: fmt.Sprintf("Talos (%s)", m.TalosTag),
			ContainerRuntimeVersion: "containerd://2.1.4", KubeletVersion: "v1.37.2",
			OperatingSystem: "linux", Architecture: "amd64",
		},
	}
}

// addresses are the Node's: its InternalIPs as the machine reports them, and its hostname.
func addresses(m *Machine) []corev1.NodeAddress {
	var out []corev1.NodeAddress
	for _, ip := range m.internalIPs() {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}

	return append(out, corev1.NodeAddress{Type: corev1.NodeHostName, Address: m.Name})
}

// admit is the kubelet's own admission of a pod bound to it (what the real kubelet's resource
// check does): its requests on top of those of the pods already admitted there (started, not
// finished) must fit the allocatable resources, or it is rejected — Failed, reason OutOfcpu,
// OutOfmemory or OutOfpods — and never started.
func admit(pod *corev1.Pod, pods []*corev1.Pod, allocatable corev1.ResourceList) (reason, message string) {
	used := corev1.ResourceList{}
	count := int64(1)

	for _, p := range pods {
		if p.UID == pod.UID || p.Status.StartTime == nil || p.DeletionTimestamp != nil ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}

		count++

		for name, q := range requests(p) {
			sum := used[name]
			sum.Add(q)
			used[name] = sum
		}
	}

	if most := allocatable[corev1.ResourcePods]; count > most.Value() {
		return "OutOfpods", fmt.Sprintf("Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: %d, capacity: %d", count-1, most.Value())
	}

	want := requests(pod)

	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, u, capacity := want[name], used[name], allocatable[name]
		total := u.DeepCopy()
		total.Add(req)

		if total.Cmp(capacity) > 0 {
			return "OutOf" + string(name), fmt.Sprintf("Pod was rejected: Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d",
				name, amount(name, req), amount(name, u), amount(name, capacity))
		}
	}

	return "", ""
}

// amount is a quantity as the kubelet's message gives it: CPU in millicores, the rest in units.
func amount(name corev1.ResourceName, q resource.Quantity) int64 {
	if name == corev1.ResourceCPU {
		return q.MilliValue()
	}

	return q.Value()
}

// requests sums a pod's container requests.
func requests(p *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{}

	for _, c := range p.Spec.Containers {
		for name, q := range c.Resources.Requests {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
	}

	return out
}

// stall reports a pod the wedged runtime cannot start: Pending, its containers waiting in
// ContainerCreating (once; a started pod is left as it is).
func (k *kubelet) stall(ctx context.Context, pod *corev1.Pod) {
	if pod.Status.StartTime != nil {
		return
	}

	now := metav1.Now()
	updated := pod.DeepCopy()
	updated.Status = corev1.PodStatus{Phase: corev1.PodPending, StartTime: &now, HostIP: k.m.IP, Conditions: podConditions(false, now)}

	for _, c := range pod.Spec.Containers {
		updated.Status.ContainerStatuses = append(updated.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		})
	}

	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		k.m.fleet.log.Debug("kubelet stall pod", "pod", pod.Namespace+"/"+pod.Name, "error", err)
	}
}

// reject records the kubelet's refusal of a pod: Failed before any container, as the real
// kubelet reports it.
func (k *kubelet) reject(ctx context.Context, pod *corev1.Pod, reason, message string) {
	updated := pod.DeepCopy()
	updated.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: reason, Message: message, StartTime: ptr.To(metav1.Now())}

	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		k.m.fleet.log.Debug("kubelet reject pod", "pod", pod.Namespace+"/"+pod.Name, "error", err)
	}
}

// postStatus patches the Node's status (strategic merge, conditions merged by type). The
// addresses replace the list, as the real kubelet's patch does (its fixup for addresses wrongly
// marked merge-by-type): two InternalIPs survive the patch.
func (k *kubelet) postStatus(ctx context.Context, ready bool, message string) error {
	st := k.status(ready, message)
	addresses := []any{map[string]string{"$patch": "replace"}}
	for _, a := range st.Addresses {
		addresses = append(addresses, a)
	}

	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"conditions": st.Conditions,
		"nodeInfo":   st.NodeInfo,
		"addresses":  addresses,
	}})
	if err != nil {
		return err
	}

	_, err = k.client.CoreV1().Nodes().PatchStatus(ctx, k.m.Name, patch)

	return err
}

// renewLease renews the node's heartbeat Lease in kube-node-lease.
func (k *kubelet) renewLease(ctx context.Context) error {
	leases := k.client.CoordinationV1().Leases("kube-node-lease")
	now := metav1.NewMicroTime(time.Now())

	lease, err := leases.Get(ctx, k.m.Name, getOpts)
	if apierrors.IsNotFound(err) {
		node, nerr := k.client.CoreV1().Nodes().Get(ctx, k.m.Name, getOpts)
		if nerr != nil {
			return nerr
		}

		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: k.m.Name,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(k.m.Name), LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &now,
			},
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})

		return err
	}

	if err != nil {
		return err
	}

	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})

	return err
}

// boot starts the kubelet's loops: Ready status, heartbeats, pods.
func (k *kubelet) boot() {
	k.mu.Lock()
	defer k.mu.Unlock()

	if k.cancel != nil {
		return
	}

	ctx, cancel := context.WithCancel(k.m.fleet.ctx)
	k.cancel = cancel
	k.backoff = map[types.UID]time.Time{}
	k.processes = map[types.UID]*containerProcess{}
	k.keyring = &nodeKeyring{}
	_ = os.MkdirAll(k.m.KubeletRootDir(), 0o700)
	if k.ran == nil {
		k.ran = map[types.UID]bool{}
	}
	k.queue = make(chan string, 1024)

	k.wg.Add(2)

	go k.heartbeatLoop(ctx)
	go k.podLoop(ctx)
}

func (k *kubelet) heartbeatLoop(ctx context.Context) {
	defer k.wg.Done()

	t := time.NewTicker(k.heartbeat())
	defer t.Stop()

	k.reregister(ctx)

	for {
		why := k.m.notReadyReason()
		if err := k.postStatus(ctx, why == "", why); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
			k.m.fleet.log.Debug("kubelet status", "node", k.m.Name, "error", err)
		}

		if err := k.renewLease(ctx); err != nil && ctx.Err() == nil {
			k.m.fleet.log.Debug("kubelet lease", "node", k.m.Name, "error", err)
		}

		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// halt stops the loops and waits for them.
func (k *kubelet) halt() {
	k.mu.Lock()
	cancel := k.cancel
	k.cancel = nil
	k.mu.Unlock()

	if cancel != nil {
		cancel()
		k.wg.Wait()
	}
}

// shutdown is a graceful node shutdown: the kubelet reports NotReady and stops.
func (k *kubelet) shutdown(ctx context.Context) {
	k.halt()

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()

	if err := k.postStatus(sctx, false, "node is shutting down"); err != nil && !apierrors.IsNotFound(err) {
		k.m.fleet.log.Debug("kubelet shutdown status", "node", k.m.Name, "error", err)
	}
}

// stop ends the kubelet without a status (the machine is gone).
func (k *kubelet) stop() { k.halt() }

func (k *kubelet) podLoop(ctx context.Context) {
	defer k.wg.Done()

	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + k.m.Name }))
	podInformer := factory.Core().V1().Pods()
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			select {
			case k.queue <- p.Namespace + "/" + p.Name:
			default:
			}
		}
	}

	_, _ = podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				k.m.fleet.notePull(p, false) // gone: no longer failing to pull
			}
		},
	})
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	if !cache.WaitForCacheSync(ctx.Done(), podInformer.Informer().HasSynced) {
		return
	}

	lister := podInformer.Lister()
	resync := time.NewTicker(k.heartbeat())
	defer resync.Stop()

	k.ensureMirrorPods(ctx, lister)

	for {
		select {
		case <-ctx.Done():
			return
		case key := <-k.queue:
			ns, name, _ := strings.Cut(key, "/")
			if pod, err := lister.Pods(ns).Get(name); err == nil {
				k.syncPod(ctx, pod, lister)
			}
		case <-resync.C:
			k.ensureMirrorPods(ctx, lister)

			pods, _ := lister.List(everything)
			for _, pod := range pods {
				k.syncPod(ctx, pod, lister)
			}
		}
	}
}

func (k *kubelet) syncPod(ctx context.Context, pod *corev1.Pod, lister corelisters.PodLister) {
	if k.runsProcess(pod) {
		k.syncProcessPod(ctx, pod)

		if pod.DeletionTimestamp == nil || k.hasProcess(pod.UID) {
			return
		}
	}

	if pod.DeletionTimestamp != nil {
		k.m.fleet.notePull(pod, false) // a pod going away is no longer failing to pull

		// Containers stopped: finalise the graceful deletion.
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
			k.m.fleet.log.Debug("kubelet delete pod", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		}

		return
	}

	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return
	case corev1.PodRunning:
		if podReady(pod) {
			return
		}
	}

	if until, ok := k.backoff[pod.UID]; ok && time.Now().Before(until) {
		return
	}

	if k.m.podsStalled() {
		k.stall(ctx, pod)

		return
	}

	if pod.Status.StartTime == nil {
		others, _ := lister.List(everything)
		if reason, message := admit(pod, others, k.status(true, "").Allocatable); reason != "" {
			k.reject(ctx, pod, reason, message)

			return
		}
	}

	creds := k.pullCredentials(ctx, pod)
	st := pod.Status.DeepCopy()
	now := metav1.Now()
	st.HostIP = k.m.IP
	st.HostIPs = []corev1.HostIP{{IP: k.m.IP}}

	if st.StartTime == nil {
		st.StartTime = &now
	}

	var pullErr error

	statuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))

	startFailed := false

	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image}

		digest, err := k.ensureImage(ctx, pod, c, creds)

		switch failure := startFailure(c); {
		case err != nil:
			pullErr = err
			cs.State.Waiting = pullWaiting(err)
		case failure != "":
			// Pulled, but nothing of it can start: what a real runtime reports.
			startFailed = true
			cs.ImageID = imageID(c.Image, digest)
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: failure, StartedAt: now, FinishedAt: now}
		case pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
			cs.ImageID = imageID(c.Image, digest)
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}
		default:
			cs.ImageID = imageID(c.Image, digest)
			cs.Ready, cs.Started = true, ptr.To(true)
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
		}

		statuses = append(statuses, cs)
	}

	st.ContainerStatuses = statuses
	k.m.fleet.notePull(pod, pullErr != nil)

	switch {
	case pullErr != nil:
		st.Phase = corev1.PodPending
		st.Conditions = podConditions(false, now)
		k.backoff[pod.UID] = time.Now().Add(2 * k.heartbeat())
	case startFailed:
		st.Phase = corev1.PodFailed
		st.Conditions = podConditions(false, now)

		if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
			st.Phase = corev1.PodRunning // restarted, forever: CrashLoopBackOff
		}
	case pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
		st.Phase = corev1.PodSucceeded
		st.Conditions = podConditions(false, now)
	default:
		st.Phase = corev1.PodRunning
		st.PodIP = podIP(pod.UID)
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
		st.Conditions = podConditions(true, now)
	}

	updated := pod.DeepCopy()
	updated.Status = *st

	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		// A stale copy: the next event or resync retries.
		k.m.fleet.log.Debug("kubelet pod status", "pod", pod.Namespace+"/"+pod.Name, "error", err)
	}
}

// pullCredentials returns the credentials a pull may use, in the order a kubelet tries them:
// the pod's image pull secrets for the registry, then its node keyring's (each sent with the
// pull: containerd then uses none of its own), else the runtime's own (the machine's effective
// credential from its Talos config).
func (k *kubelet) pullCredentials(ctx context.Context, pod *corev1.Pod) []Credential {
	var creds []Credential

	for _, ref := range pod.Spec.ImagePullSecrets {
		s, err := k.client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, getOpts)

		// The Node authorizer learns of a pod's secrets a moment after the pod is bound to this
		// node: wait for it, as the kubelet's sync loop would, rather than pull without them.
		for try := 0; apierrors.IsForbidden(err) && try < 20 && ctx.Err() == nil; try++ {
			time.Sleep(100 * time.Millisecond)
			s, err = k.client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, getOpts)
		}

		if err != nil || s.Type != corev1.SecretTypeDockerConfigJson {
			continue
		}

		if c, err := credential.Parse(s.Data[corev1.DockerConfigJsonKey], registry.RegistryHost); err == nil {
			creds = append(creds, Credential{Username: c.Username, Password: c.Password(), source: "secret " + pod.Namespace + "/" + ref.Name})
		}
	}

	k.mu.Lock()
	kr := k.keyring
	k.mu.Unlock()

	if kr != nil {
		if keyring := kr.lookup(k.m.KubeletRootDir(), k.m.fleet.opts.KeyringCache); len(keyring) > 0 {
			return append(creds, keyring...)
		}
	}

	node := k.m.Effective()
	node.source = "node"

	return append(creds, node)
}

// ensureMirrorPods gives a control plane's static pods (apiserver, controller manager,
// scheduler) their mirror pods in kube-system, as a kubelet does, recreating a deleted one.
func (k *kubelet) ensureMirrorPods(ctx context.Context, lister corelisters.PodLister) {
	if k.m.Role != RoleControlPlane {
		return
	}

	var node *corev1.Node

	for _, c := range controlPlaneComponents {
		name := c + "-" + k.m.Name
		if _, err := lister.Pods(metav1.NamespaceSystem).Get(name); err == nil {
			continue
		}

		if node == nil {
			n, err := k.client.CoreV1().Nodes().Get(ctx, k.m.Name, getOpts)
			if err != nil {
				return
			}

			node = n
		}

		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: metav1.NamespaceSystem,
				Labels: map[string]string{"k8s-app": c, "component": c, "tier": "control-plane"},
				Annotations: map[string]string{
					corev1.MirrorPodAnnotationKey: "sandbox-" + k.m.TalosTag, "kubernetes.io/config.source": "file",
				},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr.To(true)}},
			},
			Spec: corev1.PodSpec{
				NodeName: k.m.Name, PriorityClassName: "system-node-critical", HostNetwork: true,
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: c, Image: "registry.k8s.io/" + c + ":v1.37.2"}},
			},
		}

		if _, err := k.client.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, pod, metav1.CreateOptions{}); err != nil &&
			!apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
			k.m.fleet.log.Debug("kubelet mirror pod", "pod", name, "error", err)
		}
	}
}

// startFailure says why a container of a pulled image cannot start ("" if it can): its command
// names a binary the image lacks, or the image's own entrypoint is missing.
func startFailure(c corev1.Container) string {
	traits := registry.ImageTraits(c.Image)

	switch {
	case len(c.Command) > 0 && traits.NoShell:
		return fmt.Sprintf("failed to create containerd task: exec: %q: stat %s: no such file or directory", c.Command[0], c.Command[0])
	case len(c.Command) == 0 && traits.MissingEntrypoint:
		return "failed to create containerd task: exec: \"/app\": stat /app: no such file or directory"
	}

	return ""
}

// imageID is what a runtime reports for a pulled image: the reference by digest.
func imageID(image, digest string) string {
	if digest == "" {
		return image
	}

	repo := image
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		repo = image[:i]
	}

	return repo + "@" + digest
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}

	return false
}

func podConditions(ready bool, now metav1.Time) []corev1.PodCondition {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}

	return []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
	}
}

func podIP(uid types.UID) string {
	var h uint32
	for _, c := range string(uid) {
		h = h*31 + uint32(c)
	}

	return fmt.Sprintf("10.244.%d.%d", (h>>8)%250+1, h%250+1)
}
