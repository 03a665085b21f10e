package cluster

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/kubectl/pkg/drain"
)

// Drain evicts the node's pods through the Eviction API (PodDisruptionBudgets honoured,
// DaemonSet pods left alone), bounded by timeout, with progress lines on out. A drain that does
// not finish names the pods left and the PodDisruptionBudgets that hold them.
func (c *Connection) Drain(ctx context.Context, node string, timeout time.Duration, out io.Writer) error {
	prefixed := &linePrefixer{w: out, prefix: node + ": "}
	h := &drain.Helper{
		Ctx: ctx, Client: c.Client, GracePeriodSeconds: -1, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true,
		Timeout: timeout, EvictErrorRetryDelay: 2 * time.Second, Out: prefixed, ErrOut: prefixed,
	}

	list, errs := h.GetPodsForDeletion(node)
	if len(errs) > 0 {
		msgs := make([]string, 0, len(errs))
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}

		return fmt.Errorf("cannot drain %s: %s (ghcrsync does not force-delete pods)", node, strings.Join(msgs, "; "))
	}

	if err := h.DeleteOrEvictPods(list.Pods()); err != nil {
		return fmt.Errorf("drain of %s did not finish within %s%s: %w", node, timeout, c.blockers(node), err)
	}

	return nil
}

// blockers describes the evictable pods still on the node and the budgets that cover them.
func (c *Connection) blockers(node string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return ""
	}

	var parts []string

	for i := range pods.Items {
		p := &pods.Items[i]
		if !Evictable(p) {
			continue
		}

		desc := p.Namespace + "/" + p.Name

		pdbs, err := c.Client.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, pdb := range pdbs.Items {
				sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
				if err == nil && !sel.Empty() && sel.Matches(labels.Set(p.Labels)) {
					desc += fmt.Sprintf(" (held by PodDisruptionBudget %s/%s: %d disruptions allowed)", pdb.Namespace, pdb.Name, pdb.Status.DisruptionsAllowed)
				}
			}
		}

		parts = append(parts, desc)
	}

	if len(parts) == 0 {
		return ""
	}

	return "; still running: " + strings.Join(parts, ", ")
}

// Evictable reports whether a drain must evict the pod before its node may reboot: not
// finished, not owned by a DaemonSet, not a static (mirror) pod.
func Evictable(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}

	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}

	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return false
		}
	}

	return true
}

type linePrefixer struct {
	w      io.Writer
	prefix string
}

func (l *linePrefixer) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			if _, err := io.WriteString(l.w, l.prefix+line); err != nil {
				return 0, err
			}
		}
	}

	return len(b), nil
}
