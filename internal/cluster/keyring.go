package cluster

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/redact"
)

// PutKeyringSecret makes the writer's Secret hold data (a dockerconfigjson with the registry's
// entry only): created, or updated from a fresh read; a conflict is read again, and a write whose
// answer was lost is found by reading it back.
func (c *Connection) PutKeyringSecret(ctx context.Context, w keyring.Writer, data []byte) error {
	secrets := c.Client.CoreV1().Secrets(w.Namespace)

	var last error

	for range 5 {
		cur, err := secrets.Get(ctx, w.Secret, metav1.GetOptions{})

		switch {
		case apierrors.IsNotFound(err):
			_, err = secrets.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: w.Secret, Namespace: w.Namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "ghcrsync"}},
				Type:       corev1.SecretTypeDockerConfigJson,
				Data:       map[string][]byte{keyring.SecretKey: data},
			}, metav1.CreateOptions{})
		case err != nil:
		case cur.Type != corev1.SecretTypeDockerConfigJson:
			return fmt.Errorf("the keyring writer's Secret %s/%s is of type %s, not %s: delete it (ghcrsync creates it), then run apply again",
				w.Namespace, w.Secret, cur.Type, corev1.SecretTypeDockerConfigJson)
		case bytes.Equal(cur.Data[keyring.SecretKey], data) && len(cur.Data) == 1:
			return nil
		default:
			next := cur.DeepCopy()
			next.Data = map[string][]byte{keyring.SecretKey: data}
			_, err = secrets.Update(ctx, next, metav1.UpdateOptions{})
		}

		if err == nil {
			return nil
		}

		last = err

		if ctx.Err() != nil || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || answer.Lost(err)) {
			break
		}
	}

	return fmt.Errorf("write the keyring writer's Secret %s/%s: %s", w.Namespace, w.Secret, redact.Error(last))
}

// DeleteKeyringSecret removes the writer's Secret (a copy of the credential no writer needs
// once the run is over); gone already is fine.
func (c *Connection) DeleteKeyringSecret(ctx context.Context, w keyring.Writer) error {
	err := c.Client.CoreV1().Secrets(w.Namespace).Delete(ctx, w.Secret, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the keyring writer's Secret %s/%s: %w", w.Namespace, w.Secret, err)
	}

	return nil
}

// RunKeyringWriter runs ghcrsync's keyring writer on node (keyring.Pod) in mode, checked as
// admission left it, waits up to timeout for it to end, and returns its report. The pod is
// deleted afterwards, whatever came of it.
func (c *Connection) RunKeyringWriter(ctx context.Context, node string, w keyring.Writer, mode keyring.Mode, rootDir string, timeout time.Duration) (keyring.Report, error) {
	build := func(attempt string) *corev1.Pod { return keyring.Pod(node, w, mode, rootDir, attempt) }

	pod, err := c.createPod(ctx, w.Namespace, keyring.AttemptLabel, build, timeout)
	if err != nil {
		return keyring.Report{}, fmt.Errorf("create the keyring writer pod on %s: %w", node, err)
	}

	defer c.retire(pod)

	if err := keyring.Admitted(pod, w, mode, rootDir); err != nil {
		return keyring.Report{}, err
	}

	var (
		report keyring.Report
		result error
		seen   = pod
	)

	judge := func(p *corev1.Pod) bool {
		seen = p

		var done bool
		done, report, result = keyring.Outcome(p)

		return done
	}

	if err := c.await(ctx, pod, timeout, judge); err != nil {
		return keyring.Report{}, fmt.Errorf("the keyring writer %s/%s on %s did not finish: %w; last seen: phase %s", pod.Namespace, pod.Name, node, err, seen.Status.Phase)
	}

	if result != nil {
		return keyring.Report{}, fmt.Errorf("%s on %s: %w", pod.Name, node, result)
	}

	return report, nil
}

// retire deletes a finished pod at once, even while the run winds down.
func (c *Connection) retire(p *corev1.Pod) {
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_ = c.Client.CoreV1().Pods(p.Namespace).Delete(dctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
}

// KeyringWriters are the writer pods in namespace (a killed run's, for fences and release).
func (c *Connection) KeyringWriters(ctx context.Context, namespace string) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: keyring.Label})
	if err != nil {
		return nil, err
	}

	return list.Items, nil
}

// DeleteKeyringWriters deletes every writer pod in namespace; it reports how many it deleted.
func (c *Connection) DeleteKeyringWriters(ctx context.Context, namespace string) (int, error) {
	pods, err := c.KeyringWriters(ctx, namespace)
	if err != nil {
		return 0, err
	}

	for i := range pods {
		err := c.Client.CoreV1().Pods(namespace).Delete(ctx, pods[i].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		if err != nil && !apierrors.IsNotFound(err) {
			return i, err
		}
	}

	return len(pods), nil
}
