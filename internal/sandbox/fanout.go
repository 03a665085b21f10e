package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
)

// What the sandbox's fan-out targets are called (config/examples/sandbox.hcl names them too).
const (
	ConsumerLabel  = "ghcrsync.dev/pull-secret"
	ConsumerSecret = "ghcr-pull"
	RootNamespace  = "flux-system"
	RootSecret     = "ghcr-auth"
	OCIRepository  = "flux-system"
	// Kustomization is the sandbox's Flux Kustomization (config/examples/sandbox.hcl suspends it
	// for the run).
	Kustomization    = "flux-system"
	consumerSelector = ConsumerLabel + "=ghcr"
)

// ConsumerNamespaces are created labelled for the fan-out: team-a with a pull secret holding the
// fleet's credential, team-b without one.
var ConsumerNamespaces = []string{"team-a", "team-b"}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// OCIRepositoryGVR is the sandbox's stand-in for Flux's OCIRepository.
var OCIRepositoryGVR = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "ocirepositories"}

// KustomizationGVR is Flux's Kustomization, as its CRD serves it (with the status subresource
// kustomize-controller writes).
var KustomizationGVR = schema.GroupVersionResource{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Resource: "kustomizations"}

// seedFanOut creates the Flux root secret and OCIRepository (with its CRD), and the consumer
// namespaces with their pull secrets and workloads.
func (s *Sandbox) seedFanOut(ctx context.Context, kube kubernetes.Interface, cred Credential, workloads bool) error {
	dyn, err := dynamic.NewForConfig(s.cp.admin)
	if err != nil {
		return err
	}

	if err := s.installFlux(ctx, dyn); err != nil {
		return err
	}

	ks := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
		"metadata": map[string]any{"name": Kustomization, "namespace": RootNamespace},
		"spec": map[string]any{
			"interval": "10m", "path": "./clusters/sandbox", "prune": true, "suspend": false,
			"sourceRef": map[string]any{"kind": "OCIRepository", "name": OCIRepository},
		},
	}}
	if _, err := dyn.Resource(KustomizationGVR).Namespace(RootNamespace).Create(ctx, ks, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create Kustomization: %w", err)
	}

	repo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
		"metadata": map[string]any{"name": OCIRepository, "namespace": RootNamespace},
		"spec":     s.fluxRootSpec(),
	}}
	if _, err := dyn.Resource(OCIRepositoryGVR).Namespace(RootNamespace).Create(ctx, repo, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create OCIRepository: %w", err)
	}

	if err := putPullSecret(ctx, kube, RootNamespace, RootSecret, cred); err != nil {
		return err
	}

	for i, ns := range ConsumerNamespaces {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{ConsumerLabel: "ghcr"},
		}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}

		if i == 0 || s.opts.InSync {
			if err := putPullSecret(ctx, kube, ns, ConsumerSecret, cred); err != nil {
				return err
			}
		}

		if s.opts.InSync {
			if err := s.referenceFromDefaultSA(ctx, kube, ns); err != nil {
				return err
			}
		}

		if workloads {
			if err := pullingDeployment(ctx, kube, ns); err != nil {
				return err
			}
		}
	}

	return nil
}

// installFlux installs Flux's kinds: stand-ins of any shape (FluxSim), or Flux's own CRDs and the
// root's artifact in the registry (FluxReal).
func (s *Sandbox) installFlux(ctx context.Context, dyn dynamic.Interface) error {
	if s.opts.Flux == FluxReal {
		if err := installFluxCRDs(ctx, dyn); err != nil {
			return err
		}

		_, err := s.registry.PushFluxArtifact(FluxRootArtifact, "https://github.com/ghcrsync/sandbox", fluxRootFiles)

		return err
	}

	for _, crd := range []struct {
		gvr    schema.GroupVersionResource
		kind   string
		status bool
	}{{OCIRepositoryGVR, "OCIRepository", false}, {KustomizationGVR, "Kustomization", true}} {
		if err := installCRD(ctx, dyn, crd.gvr, crd.kind, crd.status); err != nil {
			return err
		}
	}

	return nil
}

// InstallCRD installs a CRD for gvr (any fields; with the status subresource when status) and
// waits until it is served: another tool's resource, as a test needs it.
func InstallCRD(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, kind string, status bool) error {
	return installCRD(ctx, dyn, gvr, kind, status)
}

// installCRD installs a Flux CRD (any fields; with the status subresource when status) and
// waits until it is served.
func installCRD(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, kind string, status bool) error {
	version := map[string]any{
		"name": gvr.Version, "served": true, "storage": true,
		"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
	}
	if status {
		version["subresources"] = map[string]any{"status": map[string]any{}}
	}

	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": gvr.Resource + "." + gvr.Group},
		"spec": map[string]any{
			"group": gvr.Group, "scope": "Namespaced",
			"names":    map[string]any{"kind": kind, "listKind": kind + "List", "plural": gvr.Resource, "singular": strings.ToLower(kind)},
			"versions": []any{version},
		},
	}}

	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: install %s CRD: %w", kind, err)
	}

	deadline := time.Now().Add(30 * time.Second)

	for {
		if _, err := dyn.Resource(gvr).Namespace(RootNamespace).List(ctx, metav1.ListOptions{}); err == nil {
			return nil
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: the %s CRD is not served after 30s", kind)
		}

		time.Sleep(200 * time.Millisecond)
	}
}

func putPullSecret(ctx context.Context, kube kubernetes.Interface, ns, name string, cred Credential) error {
	_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: DockerConfigJSON(cred)},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create secret %s/%s: %w", ns, name, err)
	}

	return nil
}

func (s *Sandbox) referenceFromDefaultSA(ctx context.Context, kube kubernetes.Interface, ns string) error {
	deadline := time.Now().Add(60 * time.Second)

	for {
		sa, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			sa.ImagePullSecrets = append(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: ConsumerSecret})
			if _, err = kube.CoreV1().ServiceAccounts(ns).Update(ctx, sa, metav1.UpdateOptions{}); err == nil {
				return nil
			}
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: default service account of %s: %v", ns, err)
		}

		time.Sleep(200 * time.Millisecond)
	}
}

// pullingDeployment runs a pod that pulls a private image through the namespace's pull secret,
// every start.
func pullingDeployment(ctx context.Context, kube kubernetes.Interface, ns string) error {
	labels := map[string]string{"app": "puller"}
	_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "puller"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					ImagePullSecrets:              []corev1.LocalObjectReference{{Name: ConsumerSecret}},
					// Always: the pull is the witness that the secret works (IfNotPresent would start
					// from the node's copy).
					Containers: []corev1.Container{{Name: "app", Image: registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1", ImagePullPolicy: corev1.PullAlways}},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	return nil
}
