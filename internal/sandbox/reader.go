package sandbox

import (
	"context"
	"fmt"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The autoscaler's Deployment. The real cluster-autoscaler reads HCLOUD_CLUSTER_CONFIG from its
// environment (a secretKeyRef to the template Secret), so once, when its pod starts: a rewritten
// template takes effect only after a rollout restart (ghcrsync's restart_deployment). The
// sandbox creates the Deployment with 0 replicas (the autoscaler runs as the sandbox's child, or
// is simulated) and treats every change of its pod template as that restart: the autoscaler
// stops, and starts again reading the Secret as it is then.
const (
	AutoscalerDeploymentNamespace = "kube-system"
	AutoscalerDeployment          = "cluster-autoscaler"
)

func (f *Fleet) createAutoscalerDeployment(ctx context.Context) error {
	labels := map[string]string{"app": AutoscalerDeployment}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: AutoscalerDeployment, Namespace: AutoscalerDeploymentNamespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			// One replica on the control planes, as the autoscaler runs: its pod's start is when
			// it read the template (the evidence of a restart is the pod, not a managedFields
			// time). The image is the registry's public one: its process is the simulation above.
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{"node-role.kubernetes.io/control-plane": ""},
					Tolerations:                   []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Containers: []corev1.Container{{
						Name: "cluster-autoscaler", Image: registry.RegistryHost + "/" + registry.PublicImage,
						Env: []corev1.EnvVar{{Name: TemplateKey, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
							LocalObjectReference: corev1.LocalObjectReference{Name: TemplateSecret}, Key: TemplateKey,
						}}}},
					}},
				},
			},
		},
	}

	_, err := f.admin.AppsV1().Deployments(AutoscalerDeploymentNamespace).Create(ctx, d, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: the autoscaler's Deployment: %w", err)
	}

	return nil
}

// watchAutoscalerDeployment calls restart after every change of the Deployment's pod template
// (its generation moves), until the fleet stops.
func (f *Fleet) watchAutoscalerDeployment(restart func()) {
	deployments := f.admin.AppsV1().Deployments(AutoscalerDeploymentNamespace)

	generation := func() int64 {
		d, err := deployments.Get(f.ctx, AutoscalerDeployment, getOpts)
		if err != nil {
			return -1
		}

		return d.Generation
	}

	seen := generation()

	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()

		for {
			select {
			case <-f.ctx.Done():
				return
			case <-t.C:
			}

			if g := generation(); g > 0 && g != seen {
				seen = g
				f.log.Info("autoscaler Deployment changed: restarting the autoscaler", "generation", g)
				restart()
			}
		}
	}()
}

// RestartAutoscaler is `kubectl rollout restart deployment/cluster-autoscaler -n kube-system`:
// the autoscaler reads the template again. It returns once the new one has read it.
func (s *Sandbox) RestartAutoscaler(ctx context.Context) error {
	before := s.AutoscalerStarts()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().UTC().Format(time.RFC3339Nano))

	if _, err := s.Kube().AppsV1().Deployments(AutoscalerDeploymentNamespace).Patch(ctx, AutoscalerDeployment, "application/strategic-merge-patch+json",
		[]byte(patch), metav1.PatchOptions{}); err != nil {
		return err
	}

	for s.AutoscalerStarts() == before {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}

	return nil
}

// AutoscalerStarts is how many times the autoscaler started (and read the template): 1, plus
// one per restart.
func (s *Sandbox) AutoscalerStarts() int {
	if s.real != nil {
		return s.real.Starts()
	}

	return s.autoscaler.Starts()
}
