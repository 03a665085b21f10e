package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
)

// The shape of every Event ghcrsync records: the admission policy ghcrsync-events admits
// ghcrsync's identities no other (internal/permission).
const (
	// EventSource is the component Events name as their source (and their reporting instance).
	EventSource = "ghcrsync"
	// EventReportingController is their reporting component.
	EventReportingController = "ghcrsync.dev/ghcrsync"
	// EventReasonPrefix begins every reason.
	EventReasonPrefix = "Ghcrsync"
)

// Record writes a Kubernetes Event about ref (in the default namespace for a cluster-scoped
// object): the cluster's own audit trail of what ghcrsync did, readable with `kubectl
// describe`. reason is CamelCase; message holds no secret (digests and holder ids only).
// Best effort: a failed Event never stops a run; the error is returned for the log.
func (c *Connection) Record(ctx context.Context, ref object.Ref, reason, message string, warning bool) error {
	if !strings.HasPrefix(reason, EventReasonPrefix) {
		return fmt.Errorf("record event %s on %s %s: a reason of ghcrsync's begins %s", reason, ref.Kind, ref.Name, EventReasonPrefix)
	}

	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}

	kind := corev1.EventTypeNormal
	if warning {
		kind = corev1.EventTypeWarning
	}

	now := metav1.NewTime(c.Clock.Now())

	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()

	client := c.events
	if client == nil {
		client = c.Client
	}

	_, err := client.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/managed-by": EventSource}},
		InvolvedObject: corev1.ObjectReference{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID, APIVersion: ref.APIVersion},
		Reason:         reason,
		Message:        message,
		Type:           kind,
		Source:         corev1.EventSource{Component: EventSource},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: EventReportingController, ReportingInstance: EventSource,
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("record event %s on %s %s: %w", reason, ref.Kind, ref.Name, err)
	}

	return nil
}
