package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
)

// Flux modes (Options.Flux, `ghcrsync-sandbox up --flux`).
const (
	// FluxSim is the default: Flux's two kinds as CRDs of any shape, and nothing that reads them.
	FluxSim = "sim"
	// FluxReal runs Flux's own source-controller and kustomize-controller (FluxVersion) against
	// the sandbox's API server, with Flux's CRDs: the root OCIRepository is pulled from the
	// sandbox registry with the root secret, and the root Kustomization applies what it holds.
	FluxReal = "real"
)

// FluxVersion is the release of both controllers scripts/build-flux.sh builds.
const FluxVersion = "v1.9.6"

// FluxDir is where scripts/build-flux.sh caches the controllers and their CRDs (crds/).
func FluxDir() string { return CachePath("GHCRSYNC_FLUX", "flux", FluxVersion) }

// The root's source with real Flux: a private Flux artifact in the sandbox registry, holding
// one ConfigMap the root Kustomization applies (FluxRootConfigMap in the apps namespace).
const (
	FluxRootArtifact  = registry.PrivateOrg + "/cluster:v1"
	FluxRootConfigMap = "flux-root"
	fluxRootPath      = "./clusters/sandbox"
)

// The controllers' identities towards the API server (client certificates).
const (
	FluxSourceUser    = "flux:source-controller"
	FluxKustomizeUser = "flux:kustomize-controller"
)

// fluxRootFiles are the root artifact's files.
var fluxRootFiles = registry.FluxArtifact{
	"clusters/sandbox/flux-root.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + FluxRootConfigMap +
		"\n  namespace: apps\ndata:\n  source: " + registry.RegistryHost + "/" + FluxRootArtifact + "\n",
}

// installFluxCRDs installs Flux's own CRDs (every kind source-controller watches) and waits until
// the root's two kinds are served.
func installFluxCRDs(ctx context.Context, dyn dynamic.Interface) error {
	files, err := filepath.Glob(filepath.Join(FluxDir(), "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("sandbox: Flux's CRDs in %s: none (build them with `make flux`)", filepath.Join(FluxDir(), "crds"))
	}

	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}

		var crd unstructured.Unstructured
		if err := yaml.Unmarshal(b, &crd.Object); err != nil {
			return fmt.Errorf("sandbox: %s: %w", f, err)
		}

		if _, err := dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("sandbox: install %s: %w", filepath.Base(f), err)
		}
	}

	for _, gvr := range []struct {
		r    string
		list func() error
	}{
		{"ocirepositories", func() error {
			_, err := dyn.Resource(OCIRepositoryGVR).Namespace(RootNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"kustomizations", func() error {
			_, err := dyn.Resource(KustomizationGVR).Namespace(RootNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		if err := servedWithin(30*time.Second, gvr.list); err != nil {
			return fmt.Errorf("sandbox: Flux's %s are not served: %w", gvr.r, err)
		}
	}

	return nil
}

// servedWithin asks list until it answers, for up to d.
func servedWithin(d time.Duration, list func() error) error {
	deadline := time.Now().Add(d)

	for {
		err := list()
		if err == nil {
			return nil
		}

		if time.Now().After(deadline) {
			return err
		}

		time.Sleep(200 * time.Millisecond)
	}
}

// fluxRootSpec is the root OCIRepository's spec: the stand-in's (a name the registry serves,
// nothing reads it), or with real Flux the root artifact, pulled over plain HTTP (the sandbox
// registry serves no TLS; source-controller reaches "ghcr.io" through its HTTP proxy, the
// registry itself) with the root secret.
func (s *Sandbox) fluxRootSpec() map[string]any {
	if s.opts.Flux == FluxReal {
		repo, tag, _ := strings.Cut(FluxRootArtifact, ":")

		return map[string]any{
			"url": "oci://" + registry.RegistryHost + "/" + repo, "ref": map[string]any{"tag": tag},
			"interval": "1m", "timeout": "20s", "insecure": true, "secretRef": map[string]any{"name": RootSecret},
		}
	}

	return map[string]any{
		"url": "oci://" + registry.RegistryHost + "/" + registry.PrivateOrg + "/app", "ref": map[string]any{"tag": "v1"},
		"interval": "1m", "secretRef": map[string]any{"name": RootSecret},
	}
}

// realFlux is Flux's two controllers, run as the sandbox's children as their Deployments run
// them in flux-system: each with its own identity, no leader election, source-controller's
// artifacts served on a loopback port kustomize-controller fetches them from.
type realFlux struct {
	source, kustomize *process
}

// FluxBinary is where scripts/build-flux.sh caches one controller.
func FluxBinary(name string) string { return filepath.Join(FluxDir(), name) }

func startRealFlux(ctx context.Context, s *Sandbox) (*realFlux, error) {
	for _, c := range []string{"source-controller", "kustomize-controller"} {
		if _, err := os.Stat(FluxBinary(c)); err != nil {
			return nil, fmt.Errorf("sandbox: Flux's %s: %w (build it with `make flux`)", c, err)
		}
	}

	if err := grantFlux(ctx, s.fleet.admin); err != nil {
		return nil, err
	}

	storage, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}

	artifacts := "127.0.0.1:" + strconv.Itoa(storage)
	f := &realFlux{}

	// Each controller's flags and environment: its identity's kubeconfig (KUBECONFIG: their
	// pflag command lines carry no --kubeconfig), no leader election, no metrics.
	common := func(user string) (args, env []string, err error) {
		kc, err := s.fluxKubeconfig(user)
		if err != nil {
			return nil, nil, err
		}

		health, err := freePort("127.0.0.1")
		if err != nil {
			return nil, nil, err
		}

		return []string{
			"--enable-leader-election=false", "--watch-all-namespaces=true", "--metrics-addr=0",
			"--health-addr=127.0.0.1:" + strconv.Itoa(health), "--log-encoding=json", "--log-level=info",
		}, []string{"KUBECONFIG=" + kc, "RUNTIME_NAMESPACE=" + RootNamespace}, nil
	}

	args, env, err := common(FluxSourceUser)
	if err != nil {
		return nil, err
	}

	store := filepath.Join(s.opts.Dir, "flux-artifacts")
	if err := os.MkdirAll(store, 0o700); err != nil {
		return nil, err
	}

	args = append(args, "--storage-path="+store, "--storage-addr="+artifacts, "--storage-adv-addr="+artifacts)
	// Requests to ghcr.io go to the registry standing in for it: a plain-HTTP proxy request
	// ("GET http://ghcr.io/v2/…") is served by the registry's own handler. Loopback is never
	// proxied (the API server, the token realm).
	env = append(env, "HTTP_PROXY=http://"+s.registry.Addr(), "HTTPS_PROXY=http://"+s.registry.Addr())

	if f.source, err = startProcess("source-controller", FluxBinary("source-controller"), args, env, s.opts.Dir+"/logs"); err != nil {
		return nil, err
	}

	if args, env, err = common(FluxKustomizeUser); err != nil {
		f.stop()

		return nil, err
	}

	if f.kustomize, err = startProcess("kustomize-controller", FluxBinary("kustomize-controller"), args, env, s.opts.Dir+"/logs"); err != nil {
		f.stop()

		return nil, err
	}

	return f, nil
}

// fluxKubeconfig writes a kubeconfig for user (a client certificate of the sandbox's CA) and
// returns its path: the API server's own address, as an in-cluster Service reaches it.
func (s *Sandbox) fluxKubeconfig(user string) (string, error) {
	kp, err := s.cp.kubeCA.client(user)
	if err != nil {
		return "", err
	}

	kc, err := kubeconfigBytes("https://"+s.cp.apiAddr, s.cp.kubeCA.certPEM(), kp.CrtPEM, kp.KeyPEM)
	if err != nil {
		return "", err
	}

	path := filepath.Join(s.opts.Dir, strings.ReplaceAll(user, ":", "-")+".kubeconfig")

	return path, os.WriteFile(path, kc, 0o600)
}

func (f *realFlux) stop() {
	for _, p := range []*process{f.kustomize, f.source} {
		if p != nil {
			_ = p.Stop(10 * time.Second)
		}
	}
}

// grantFlux gives the controllers Flux's own rights: source-controller its kinds, the Secrets it
// reads credentials from and Events; kustomize-controller cluster-admin, as Flux installs it
// (it applies whatever the cluster's source holds).
func grantFlux(ctx context.Context, kube kubernetes.Interface) error {
	rule := func(groups, resources, verbs []string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs}
	}
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	read := []string{"get", "list", "watch"}

	source := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "flux-source-controller"}, Rules: []rbacv1.PolicyRule{
		rule([]string{"source.toolkit.fluxcd.io"}, []string{"*"}, all),
		rule([]string{""}, []string{"secrets", "configmaps", "serviceaccounts"}, read),
		rule([]string{""}, []string{"events"}, []string{"create", "patch"}),
		rule([]string{"events.k8s.io"}, []string{"events"}, []string{"create", "patch"}),
	}}

	bind := func(user, role string) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(user, ":", "-")},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		}
	}

	rbac := kube.RbacV1()

	for _, create := range []func() error{
		func() error { _, err := rbac.ClusterRoles().Create(ctx, source, metav1.CreateOptions{}); return err },
		func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, bind(FluxSourceUser, source.Name), metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, bind(FluxKustomizeUser, "cluster-admin"), metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("sandbox: Flux's RBAC: %w", err)
		}
	}

	return nil
}

// RealFlux reports whether the sandbox runs Flux's controllers.
func (s *Sandbox) RealFlux() bool { return s.flux != nil }
