// Package verdict tests that the verdict — exit 0, "it is safe to revoke the old credential" —
// covers the whole cluster, on the sandbox: nodes outside nodes.selector, every pool of a node
// template, the machine that really answers at a Node's address, pull secrets ghcrsync does not
// manage, machines still being provisioned, and a restart of the template's reader proved by
// its pods, not by a managedFields time. Each test rotates the credential and applies; each has
// its negative control.
package verdict

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"

	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 2, Autoscaled: 1, AutoscalerPaused: true, NoWorkloads: true,
		Reboot: 2 * time.Second, Heartbeat: time.Second, Seed: 40})
}

// config is the sandbox's configuration (with one control plane, the sandbox allows its reboot)
// in a folder of the test's, with edit applied.
func config(t *testing.T, sb *sandbox.Sandbox, edit func(string) string) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		s = strings.Replace(s, `ready_timeout         = "2m"`, `ready_timeout         = "60s"`, 1)

		if edit != nil {
			s = edit(s)
		}

		return s
	})
}

type result struct {
	code           int
	stdout, stderr string
}

func ghcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) result {
	t.Helper()

	var r result
	r.code, r.stdout, r.stderr = sandboxtest.Run(t, sb, args...)

	return r
}

func apply(t *testing.T, sb *sandbox.Sandbox, cfg string) result {
	t.Helper()

	return ghcrsync(t, sb, "apply", "--auto-approve", "--config", cfg)
}

func rotate(t *testing.T, sb *sandbox.Sandbox, user string) sandbox.Credential {
	t.Helper()

	c, err := sb.RotateSecret(user)
	if err != nil {
		t.Fatal(err)
	}

	return c
}

// converge rotates the whole fleet to the secret file's credential (the other tests' control).
func converge(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	if r := apply(t, sb, config(t, sb, nil)); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("a rotation of every node: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// A selector that leaves the control plane out rotates the workers only, and the verdict does
// not claim the control plane stopped using the old credential: exit 5, naming it as outside
// nodes.selector. With nodes.verdict = "selected" the narrowing is explicit and said. The
// control: a selector covering every node finishes the rotation, exit 0.
func TestVerdictJudgesNodesOutsideTheSelector(t *testing.T) {
	sb := sandboxtest.Get(t)
	rotate(t, sb, "outside-selector")

	workers := config(t, sb, func(s string) string {
		return strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"!"+object.ControlPlaneLabel+"\"\n", 1)
	})

	r := apply(t, sb, workers)
	if r.code != 5 || !strings.Contains(r.stdout, "prod-control-plane-1: outside nodes.selector") || strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("a selector leaving the control plane out: exit %d, want 5 naming it\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	narrowed := config(t, sb, func(s string) string {
		return strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"!"+object.ControlPlaneLabel+"\"\n  verdict  = \"selected\"\n", 1)
	})

	if r := apply(t, sb, narrowed); r.code != 0 || !strings.Contains(r.stdout, "nodes outside nodes.selector were not judged") {
		t.Fatalf("the explicitly narrowed verdict: exit %d, want 0 saying what it left out\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	converge(t, sb)
}

// A pool of the node template that node_template.pools leaves out still boots machines with
// the old credential: it is judged (exit 5, naming the pool), though not written. The control:
// with every pool selected, the rotation writes it and ends safe, exit 0.
func TestVerdictJudgesEveryPool(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	// A second pool, carrying the credential the first carries now.
	editTemplate(t, kube, func(cfg map[string]any) {
		pools := cfg["nodeConfigs"].(map[string]any)
		pools["gpu-pool"] = pools[sandbox.TemplatePool]
	})
	t.Cleanup(func() {
		editTemplate(t, kube, func(cfg map[string]any) { delete(cfg["nodeConfigs"].(map[string]any), "gpu-pool") })
	})

	rotate(t, sb, "second-pool")

	r := apply(t, sb, config(t, sb, nil)) // pools = ["autoscale-cx43"]
	if r.code != 5 || !strings.Contains(r.stdout, "pool gpu-pool") || !strings.Contains(r.stdout, `add "gpu-pool" to the pools`) {
		t.Fatalf("a second pool on the old credential: exit %d, want 5 naming it\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	all := config(t, sb, func(s string) string {
		return regexp.MustCompile(`pools\s*=\s*\["autoscale-cx43"\]`).ReplaceAllString(s, "pools = []")
	})
	if r := apply(t, sb, all); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("every pool written: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

}

// editTemplate edits the node template's JSON (the Hetzner cluster config) in place.
func editTemplate(t *testing.T, kube kubernetes.Interface, edit func(map[string]any)) {
	t.Helper()

	ctx := context.Background()
	secrets := kube.CoreV1().Secrets(sandbox.TemplateNamespace)

	s, err := secrets.Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	js, err := base64.StdEncoding.DecodeString(string(s.Data[sandbox.TemplateKey]))
	if err != nil {
		t.Fatal(err)
	}

	var cfg map[string]any
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}

	edit(cfg)

	js, _ = json.Marshal(cfg)
	s.Data[sandbox.TemplateKey] = []byte(base64.StdEncoding.EncodeToString(js))

	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The facts of a Node are read from the machine at its address only when that machine says it
// is that Node: a Node whose address another machine answers (an address reused, a server
// replaced) is unknown to the verdict, exit 5, with the machine's answer. The control: the
// address back, the rotation ends safe.
func TestVerdictAsksTheMachineItsName(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	rotate(t, sb, "moved-address")

	// The autoscaled machine goes on running, its Node object deleted (as after a replacement
	// whose Node has not registered yet): no Node reports its address. Then prod-worker-2's
	// kubelet reports that address: the machine answering there is another, and no other Node
	// shares the address to give it away.
	other := autoscaled(t, sb)
	if err := sb.Kube().CoreV1().Nodes().Delete(ctx, other, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := sb.Do(ctx, "move-address", sandbox.Request{Node: "prod-worker-2", To: other}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_, _ = sb.Do(ctx, "move-address", sandbox.Request{Node: "prod-worker-2"})
	})

	sandboxtest.Eventually(t, 30*time.Second, "the Node reports the other machine's address", func() error {
		return reportsAddressOf(ctx, sb, "prod-worker-2", other)
	})

	want := `says it is node "` + other + `", not "prod-worker-2"`

	r := ghcrsync(t, sb, "plan", "--config", config(t, sb, nil))
	if r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Fatalf("plan with a Node whose address another machine answers: exit %d, want %q\n%s\n%s", r.code, want, r.stdout, r.stderr)
	}

	r = apply(t, sb, config(t, sb, nil))
	if r.code != 5 || !strings.Contains(r.stdout, "? node prod-worker-2") || !strings.Contains(r.stdout, want) {
		t.Fatalf("apply with a Node whose address another machine answers: exit %d, want 5\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Back: the address, and the other machine's Node (its kubelet registers it at boot).
	if _, err := sb.Do(ctx, "move-address", sandbox.Request{Node: "prod-worker-2"}); err != nil {
		t.Fatal(err)
	}

	if _, err := sb.Do(ctx, "reboot", sandbox.Request{Node: other}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 60*time.Second, "both Nodes back, each with its own address", func() error {
		if err := reportsAddressOf(ctx, sb, "prod-worker-2", "prod-worker-2"); err != nil {
			return err
		}

		return reportsAddressOf(ctx, sb, other, other)
	})

	if err := sb.WaitNodesReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}

	converge(t, sb)
}

// autoscaled is the autoscaled machine's name.
func autoscaled(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()

	for _, m := range sb.Fleet().Machines() {
		if m.Autoscaled {
			return m.Name
		}
	}

	t.Fatal("no autoscaled machine")

	return ""
}

// reportsAddressOf: the Node node reports machine's address as its InternalIP.
func reportsAddressOf(ctx context.Context, sb *sandbox.Sandbox, node, machine string) error {
	n, err := sb.Kube().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}

	m, ok := sb.Fleet().Machine(machine)
	if !ok {
		return fmt.Errorf("no machine %s", machine)
	}

	if ip := object.InternalIP(n); ip != m.IP {
		return fmt.Errorf("%s reports %s, not %s's %s", node, ip, machine, m.IP)
	}

	return nil
}

// A pod in a namespace ghcrsync does not manage pulls a private image through its own pull
// secret: ghcrsync cannot read that Secret (and is not granted to), but sees the pod reference
// it, so the verdict names it as unknown, exit 5 (and the root stays held back). The control:
// without the pod, the next apply ends safe, exit 0.
func TestVerdictNamesAPullSecretItDoesNotManage(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	const ns, secret = "team-z", "own-pull"

	c := sb.OldCredential()
	objs := []func() error{
		func() error {
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret}, Type: corev1.SecretTypeDockerConfigJson,
				Data: map[string][]byte{corev1.DockerConfigJsonKey: sandbox.DockerConfigJSON(c)}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			labels := map[string]string{"app": "api"}
			_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "api"}, Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					ImagePullSecrets:              []corev1.LocalObjectReference{{Name: secret}},
					Containers:                    []corev1.Container{{Name: "api", Image: sandbox.RegistryHost + "/ghcrsync/private-probe:v1"}},
				}},
			}}, metav1.CreateOptions{})
			return err
		},
	}

	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })

	rotate(t, sb, "unmanaged-secret")

	r := apply(t, sb, config(t, sb, nil))
	if r.code != 5 || !strings.Contains(r.stdout, "unmanaged pull secret team-z/own-pull") || !strings.Contains(r.stdout, "used by 1 pod pulling from ghcr.io (api-") {
		t.Fatalf("a pod pulling through a pull secret ghcrsync does not manage: exit %d, want 5 naming it\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if err := kube.AppsV1().Deployments(ns).Delete(ctx, "api", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 60*time.Second, "its pods are gone", func() error {
		if pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) > 0 {
			return fmt.Errorf("still there: %v", err)
		}

		return nil
	})

	// The root was held back by the verdict: the next apply switches it, and ends safe.
	if r := apply(t, sb, config(t, sb, nil)); r.code != 0 || strings.Contains(r.stdout, "team-z/own-pull") || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("apply once no pod uses it: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// The template's reader has restarted since the template was written only if its pods were
// created since: a Helm-style re-apply of the Deployment (another field manager, a new label,
// the same pod template), which moves that manager's managedFields time, restarts nothing, and
// plan still says the reader must restart (verdict unknown). The control: apply restarts it,
// and the next plan finds the template and its reader done.
func TestALabelChangeIsNotARestart(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	// Helm owns the Deployment's fields, pod template included (a first install).
	helmApply := func(label string) {
		t.Helper()

		d, err := kube.AppsV1().Deployments("kube-system").Get(ctx, sandbox.AutoscalerDeployment, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}

		obj := &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace, Labels: map[string]string{"helm.sh/chart": label}},
			Spec:       appsv1.DeploymentSpec{Selector: d.Spec.Selector, Template: d.Spec.Template}}
		body, _ := json.Marshal(obj)

		if _, err := kube.AppsV1().Deployments("kube-system").Patch(ctx, d.Name, types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: "helm", Force: ptr.To(true)}); err != nil {
			t.Fatal(err)
		}
	}

	helmApply("cluster-autoscaler-9.46.0")

	// The credential is rotated while the reader's pods stay as they are: the template written
	// with the new one by a writer that restarts nothing.
	c := rotate(t, sb, "helm-label")
	writeTemplateCredential(t, sb, c)

	time.Sleep(1100 * time.Millisecond) // managedFields times are whole seconds
	helmApply("cluster-autoscaler-9.46.1")

	r := ghcrsync(t, sb, "plan", "--config", config(t, sb, nil))
	if r.code != 0 || !strings.Contains(r.stdout, "has a pod running since") || !strings.Contains(r.stdout, "its reader will be restarted") {
		t.Fatalf("plan after a label change of the reader: exit %d, want the reader still to restart\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	converge(t, sb)

	if r := ghcrsync(t, sb, "plan", "--config", config(t, sb, nil)); r.code != 0 || strings.Contains(r.stdout, "its reader will be restarted") {
		t.Fatalf("plan after apply restarted the reader: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// writeTemplateCredential writes c into the node template's pool as another writer would.
func writeTemplateCredential(t *testing.T, sb *sandbox.Sandbox, c sandbox.Credential) {
	t.Helper()

	ctx := context.Background()
	secrets := sb.Kube().CoreV1().Secrets(sandbox.TemplateNamespace)

	s, err := secrets.Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	next, err := nodetemplate.Rewrite("hcloud-cluster-config", s.Data[sandbox.TemplateKey], []string{sandbox.TemplatePool}, "ghcr.io", c.Username, c.Password)
	if err != nil {
		t.Fatal(err)
	}

	s.Data[sandbox.TemplateKey] = next

	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// An operator pushes the new credential into every node's Talos config without a reboot, then
// revokes the old one — on Talos 1.13, whose runtimes keep the credential they booted with. The
// configs all look new; the runtimes all pull with the revoked one. plan says emergency (the
// pull secrets still hold the revoked credential) and, judging the runtimes, not the configs,
// steers hard: every node not yet rotated takes no evicted pod, and the pods wait Pending for the
// first rotated node (--allow-pending). No pod spends a second unable to pull. The negative
// control: a pod pulling on such a node, with the node's own credential, cannot.
func TestEmergencyJudgesTheRuntimeNotTheConfig(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	converge(t, sb) // every node on the secret file's credential, proved
	old := sb.NewCredential()
	next := rotate(t, sb, "operator-push")

	// Workloads that pull at every start, with the node's own credential.
	labels := map[string]string{"app": "web"}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(ctx, "shop", metav1.DeleteOptions{}) })

	if _, err := kube.AppsV1().Deployments("shop").Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers:                    []corev1.Container{{Name: "web", Image: sandbox.RegistryHost + "/ghcrsync/app:v1", ImagePullPolicy: corev1.PullAlways}},
		}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, time.Minute, "the workloads run", func() error {
		d, err := kube.AppsV1().Deployments("shop").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || d.Status.ReadyReplicas != 2 {
			return fmt.Errorf("ready %d: %v", d.Status.ReadyReplicas, err)
		}

		return nil
	})

	// The operator's push: every node's config gets the new credential, no reboot.
	talos := sandboxtest.TalosFor(t, sb, sandbox.TalosconfigFile)

	for _, m := range sb.Fleet().Machines() {
		nctx := client.WithNode(ctx, m.IP)

		mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, talos.COSI, talosconfig.ActiveID)
		if err != nil {
			t.Fatal(err)
		}

		cur, err := mc.Provider().Bytes()
		if err != nil {
			t.Fatal(err)
		}

		data, err := nodetemplate.Rewrite("talos", cur, nil, sandbox.RegistryHost, next.Username, next.Password)
		if err != nil {
			t.Fatal(err)
		}

		if _, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_NO_REBOOT}); err != nil {
			t.Fatal(err)
		}

		if m.Configured() != next || m.Effective() != old {
			t.Fatalf("%s after the push: configured %s, effective %s", m.Name, m.Configured().Username, m.Effective().Username)
		}
	}

	sb.Registry().RevokeCredential(old.Username)

	// The negative control: on such a node, a pull with the node's own credential fails.
	hazard := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hazard", Namespace: "default"}, Spec: corev1.PodSpec{
		NodeName: "prod-worker-1", TerminationGracePeriodSeconds: ptr.To(int64(0)),
		Containers: []corev1.Container{{Name: "c", Image: sandbox.RegistryHost + "/ghcrsync/app:v1", ImagePullPolicy: corev1.PullAlways}},
	}}
	if _, err := kube.CoreV1().Pods("default").Create(ctx, hazard, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 30*time.Second, "the pod on a node whose runtime holds the revoked credential cannot pull", func() error {
		p, err := kube.CoreV1().Pods("default").Get(ctx, "hazard", metav1.GetOptions{})
		if err != nil {
			return err
		}

		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				return nil
			}
		}

		return fmt.Errorf("%+v", p.Status.ContainerStatuses)
	})

	_ = kube.CoreV1().Pods("default").Delete(ctx, "hazard", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})

	cfg := config(t, sb, nil)
	planFile := filepath.Join(t.TempDir(), "emergency.plan")

	r := ghcrsync(t, sb, "plan", "--config", cfg, "--allow-pending", "--out", planFile, "--json")

	var p struct {
		Emergency bool `json:"emergency"`
		Steering  struct {
			Effect string `json:"effect"`
		} `json:"steering"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || r.code != 0 {
		t.Fatalf("plan: exit %d, %v\n%s\n%s", r.code, err, r.stdout, r.stderr)
	}

	if !p.Emergency || p.Steering.Effect != "NoSchedule" || !strings.Contains(strings.Join(p.Warnings, "\n"), "has not loaded the credential its Talos config holds") {
		t.Fatalf("plan after a no-reboot push and a revoke: emergency %v, steering %s, warnings %q", p.Emergency, p.Steering.Effect, p.Warnings)
	}

	since := time.Now()

	if r := ghcrsync(t, sb, "apply", "--config", cfg, planFile); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("the emergency rotation: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	d, err := sb.Disruption(since, []string{"shop"})
	if err != nil {
		t.Fatal(err)
	}

	if d.PullFailurePodSecs != 0 || len(d.Evictions) == 0 {
		t.Fatalf("the emergency rotation: %d eviction(s), %.1f pod-seconds unable to pull: %+v", len(d.Evictions), d.PullFailurePodSecs, d.PullFailures)
	}

	t.Logf("%d eviction(s), %.1f pod-seconds unable to pull", len(d.Evictions), d.PullFailurePodSecs)
}

// A machine the autoscaler created from the template as it was before the run (its server
// provisioning, not a Node yet) joins during the run: apply waits for it before its last listing
// and rotates it, so its exit 0 holds for that machine too. The control: a machine still
// provisioning when the wait's bound (ready_timeout) is over makes the run exit 5, naming the
// node group.
func TestVerdictWaitsForMachinesBeingProvisioned(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	rotate(t, sb, "provisioning")

	// Created now, from the template holding the old credential; it joins in 15 s.
	if _, err := sb.Do(ctx, "scale-up", sandbox.Request{Duration: "15s"}); err != nil {
		t.Fatal(err)
	}

	r := apply(t, sb, config(t, sb, nil))
	if r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("a machine joining during the run: exit %d, want 0 with it rotated\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	for _, m := range sb.Fleet().Machines() {
		if m.Autoscaled && m.Effective() != sb.NewCredential() {
			t.Fatalf("%s still pulls with %s after apply said it was safe to revoke", m.Name, m.Effective().Username)
		}
	}

	// The control: one that takes longer than the run's wait is named, and the run exits 5.
	rotate(t, sb, "provisioning-slow")

	if _, err := sb.Do(ctx, "scale-up", sandbox.Request{Duration: "10m"}); err != nil {
		t.Fatal(err)
	}

	short := config(t, sb, func(s string) string {
		return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "10s"`, 1)
	})

	r = apply(t, sb, short)
	if r.code != 5 || !strings.Contains(r.stdout, "autoscale-cx43") || !strings.Contains(r.stdout, "is creating 1 machine") {
		t.Fatalf("a machine still provisioning when the run ends: exit %d, want 5 naming its group\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
