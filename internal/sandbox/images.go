package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pulledImage is an image in a machine's runtime store, and who pulled it: the credential's
// source ("node": the runtime's own, from Talos; "secret NS/NAME": a pod's pull secret) and,
// for a secret, the credential itself — what the kubelet records to verify a later pod's access
// (KEP-2535, "ensure secret pulled images").
type pulledImage struct {
	digest string
	source string
	secret Credential
}

func (m *Machine) presentImage(image string) (pulledImage, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	p, ok := m.images[image]

	return p, ok
}

func (m *Machine) recordImage(image string, p pulledImage) {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.images == nil {
		m.images = map[string]pulledImage{}
	}

	m.images[image] = p
}

// errNeverPull is the kubelet's ErrImageNeverPull.
var errNeverPull = errors.New("image is not present with pull policy of Never")

// pullWaiting is the container's waiting state for ensureImage's error, as the kubelet reports it.
func pullWaiting(err error) *corev1.ContainerStateWaiting {
	reason := "ErrImagePull"
	if errors.Is(err, errNeverPull) {
		reason = "ErrImageNeverPull"
	}

	return &corev1.ContainerStateWaiting{Reason: reason, Message: err.Error()}
}

// ensureImage is the kubelet's image manager for one container: Always pulls (the registry is
// asked every time, with the credentials in the kubelet's order); IfNotPresent and Never start
// from an image already in the store — for IfNotPresent, as Kubernetes 1.35's default
// verification policy allows, when it was pulled with the node's own credential (any pod may
// use it) or with a pull secret holding the same credential as this pod's; otherwise it pulls
// again to verify. Each outcome is an Event, worded as the kubelet words it: "Successfully
// pulled image" only for a pull.
func (k *kubelet) ensureImage(ctx context.Context, pod *corev1.Pod, c corev1.Container, creds []Credential) (string, error) {
	present, ok := k.m.presentImage(c.Image)

	reuse := ok && c.ImagePullPolicy != corev1.PullAlways
	if reuse && c.ImagePullPolicy == corev1.PullIfNotPresent && !nodeWide(present.source) {
		reuse = false

		for _, cr := range creds {
			if !nodeWide(cr.source) && cr.Username == present.secret.Username && cr.Password == present.secret.Password {
				reuse = true
			}
		}
	}

	switch {
	case reuse:
		k.event(ctx, pod, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("Container image %q already present on machine", c.Image))

		return present.digest, nil
	case c.ImagePullPolicy == corev1.PullNever:
		k.event(ctx, pod, corev1.EventTypeWarning, "ErrImageNeverPull", fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image))

		return "", errNeverPull
	}

	k.event(ctx, pod, corev1.EventTypeNormal, "Pulling", fmt.Sprintf("Pulling image %q", c.Image))

	start := time.Now()

	digest, used, err := k.m.fleet.pullImage(ctx, k.m, pod.Namespace+"/"+pod.Name, c.Image, creds)
	if err != nil {
		k.event(ctx, pod, corev1.EventTypeWarning, "Failed", fmt.Sprintf("Failed to pull image %q: %v", c.Image, err))

		return "", err
	}

	rec := pulledImage{digest: digest, source: used.source}
	if !nodeWide(used.source) {
		rec.secret = used
	}

	k.m.recordImage(c.Image, rec)

	took := time.Since(start).Round(time.Millisecond)
	k.event(ctx, pod, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("Successfully pulled image %q in %s (%s including waiting). Image size: 512 bytes.", c.Image, took, took))

	return digest, nil
}

// event records an Event on the pod as its kubelet does (source kubelet, host the node).
func (k *kubelet) event(ctx context.Context, pod *corev1.Pod, typ, reason, message string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1",
			FieldPath: "spec.containers{" + pod.Spec.Containers[0].Name + "}",
		},
		Reason: reason, Message: message, Type: typ,
		Source:         corev1.EventSource{Component: "kubelet", Host: k.m.Name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "kubelet", ReportingInstance: k.m.Name,
	}

	if _, err := k.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		k.m.fleet.log.Debug("kubelet event", "pod", pod.Namespace+"/"+pod.Name, "reason", reason, "error", err)
	}
}

// nodeWide reports whether a credential is the node's (containerd's own, or its kubelet's
// keyring): an image pulled with it is any pod's to use (KEP-2535 verifies pod pull secrets only).
func nodeWide(source string) bool { return source == "node" || source == "keyring" }
