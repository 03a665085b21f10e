package rbac

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// writerImage is the configured keyring writer's image in these tests (never pulled: every write
// here is a server-side dry run).
const writerImage = "registry.example.com/platform/ghcrsync@sha256:1111111111111111111111111111111111111111111111111111111111111111"

// keyringConfig is the configuration at base with nodes.kubelet_keyring configured, beside it.
func keyringConfig(t *testing.T, base string) string {
	t.Helper()

	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}

	text := strings.Replace(string(b), "nodes {", "nodes {\n  kubelet_keyring {\n    image = \""+writerImage+"\"\n  }", 1)
	if text == string(b) {
		t.Fatalf("%s has no nodes block", base)
	}

	path := filepath.Join(filepath.Dir(base), "keyring.hcl")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}

	return path
}

// The kubelet keyring's writer pod is bounded by its admission policy (ghcrsync-keyring-writers):
// with the apply identity's own token, ghcrsync's writer pod is admitted, and a pod that differs
// from it in any one way is refused — another image, another hostPath, a privileged container, a
// second volume, a service-account token, the credential in the spec, another namespace; and in
// the writer's namespace no Secret but the writer's. The negative control: with the policy's
// binding removed, the other hostPath is admitted — it is the policy that refuses it.
func TestKeyringWriterIsBounded(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	create(t, kube, manifests(t, "namespace.yaml")...)

	cfg := keyringConfig(t, adminConfig(t, sb))
	objs := rendered(t, sb, cfg)
	install(t, sb, objs...)

	if !containsPolicy(objs, permission.KeyringPolicy) {
		t.Fatalf("ghcrsync rbac renders no %s with nodes.kubelet_keyring configured", permission.KeyringPolicy)
	}

	applier := newIdentity(t, sb, "ghcrsync-apply")
	as := clientsOf(t, applier)
	node := aWorker(t, kube)
	w := keyring.Writer{Image: writerImage, Namespace: config.DefaultKeyringNamespace, Secret: config.DefaultKeyringSecret, Registry: "ghcr.io"}

	try := func(mutate func(*corev1.Pod)) error {
		pod := keyring.Pod(node, w, keyring.ModeWrite, config.DefaultKubeletRootDir, "bounds")
		if mutate != nil {
			mutate(pod)
		}

		_, err := as.kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

		return err
	}

	// ghcrsync's own writer, in each mode, is admitted, and apply's containment preflight (the
	// writer's escape among its canaries) passes — once the API server enforces this rendering:
	// install waited for the policies an earlier rendering shares with it, but this one changes
	// ghcrsync-pods (the writer's namespace left to its own policy), which loads a moment later
	// (run straight after install, the writer was refused by the old ghcrsync-pods, once in a
	// clean make test).
	applyCfg := keyringConfig(t, applier.cfg)

	sandboxtest.Eventually(t, inForceTimeout, "the keyring rendering's policies in force", func() error {
		for _, mode := range []keyring.Mode{keyring.ModeWrite, keyring.ModeRead, keyring.ModeRemove, keyring.ModeAwait} {
			pod := keyring.Pod(node, w, mode, config.DefaultKubeletRootDir, "own")
			if _, err := as.kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				return fmt.Errorf("ghcrsync's own writer pod (%s) is refused: %w", mode, err)
			}
		}

		return contained(applyCfg, permission.CommandApply)
	})

	otherHostPath := func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/etc" }

	escapes := []struct {
		name   string
		mutate func(*corev1.Pod)
		policy string // "" : refused, by whatever refuses it
	}{
		{"other_image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "attacker.example/shell:1" }, permission.KeyringPolicy},
		{"other_host_path", otherHostPath, permission.KeyringPolicy},
		{"privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Privileged, p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true), nil
		}, permission.KeyringPolicy},
		{"second_volume", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, permission.KeyringPolicy},
		{"service_account_token", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }, permission.KeyringPolicy},
		{"credential_in_the_spec", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env[0].ValueFrom, p.Spec.Containers[0].Env[0].Value = nil, "ghp_x"
		},
			permission.KeyringPolicy},
		{"other_command", func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "cat /kubelet/pki/*"} }, permission.KeyringPolicy},
		{"other_arguments", func(p *corev1.Pod) { p.Spec.Containers[0].Args[5] = "quay.io" }, permission.KeyringPolicy},
		{"host_network", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, permission.KeyringPolicy},
		{"added_capability", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}, permission.KeyringPolicy},
		{"not_pinned_to_a_node", func(p *corev1.Pod) { p.Spec.NodeName = "" }, permission.KeyringPolicy},
		{"other_namespace", func(p *corev1.Pod) { p.Namespace = sandbox.ConsumerNamespaces[0] }, ""},
		{"probe_namespace", func(p *corev1.Pod) { p.Namespace = sandbox.ProbeNamespace }, ""},
	}

	for _, e := range escapes {
		t.Run(e.name, func(t *testing.T) {
			err := try(e.mutate)

			switch {
			case err == nil:
				t.Fatal("admitted")
			case e.policy != "" && !refusedBy(err, e.policy):
				t.Fatalf("refused, but not by %s: %v", e.policy, err)
			}
		})
	}

	// The writer's namespace holds its Secret and nothing else.
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: w.Namespace}, Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte("{}")}},
		{ObjectMeta: metav1.ObjectMeta{Name: w.Secret, Namespace: w.Namespace}, Type: corev1.SecretTypeOpaque},
	} {
		if _, err := as.kube.CoreV1().Secrets(w.Namespace).Create(ctx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !refusedBy(err, permission.SecretsPolicy) {
			t.Errorf("Secret %s (%s) in the writer's namespace: want a refusal by %s, got %v", s.Name, s.Type, permission.SecretsPolicy, err)
		}
	}

	own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: w.Secret, Namespace: w.Namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}
	if _, err := as.kube.CoreV1().Secrets(w.Namespace).Create(ctx, own, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the writer's own Secret is refused: %v", err)
	}

	// apply's own containment preflight, as the apply identity, tries the writer's escape too.
	if err := contained(applyCfg, permission.CommandApply); err != nil {
		t.Fatalf("apply's preflight with the policies in force: %v", err)
	}

	// The negative control: without the binding, the other hostPath is admitted, and apply's
	// preflight refuses to run, naming the policy.
	_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, permission.KeyringPolicy, metav1.DeleteOptions{})
	t.Cleanup(func() { install(t, sb, permissionPolicy(objs)...) })

	sandboxtest.Eventually(t, inForceTimeout, "without its binding, the writer's policy admits another hostPath", func() error {
		return try(otherHostPath)
	})

	if err := contained(applyCfg, permission.CommandApply); err == nil || !strings.Contains(err.Error(), permission.KeyringPolicy) {
		t.Fatalf("apply's preflight without %s: %v", permission.KeyringPolicy, err)
	}
}

func containsPolicy(objs []runtime.Object, name string) bool {
	for _, b := range policyBindings(objs) {
		if b == name {
			return true
		}
	}

	return false
}
