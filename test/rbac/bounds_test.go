package rbac

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/permission"
	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
)

// bounded is an object a shipped identity may write, with the policy that bounds the write and
// the JSON-pointer paths of the fields ghcrsync writes there (every other field is refused).
type bounded struct {
	name     string
	gvr      schema.GroupVersionResource
	ns, obj  string
	policy   string
	ours     func(path string) bool
	patchers []string // the identities holding the write: "apply", "release"
}

// serverOwned are fields the API server keeps, and the object's identity: not writable by anyone.
func serverOwned(path string) bool {
	for _, p := range []string{"/apiVersion", "/kind", "/status", "/metadata/name", "/metadata/namespace", "/metadata/uid",
		"/metadata/resourceVersion", "/metadata/generation", "/metadata/creationTimestamp", "/metadata/managedFields", "/metadata/selfLink"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}

	return false
}

// The escalations the issue names, each tried as a server-side dry run by the real identity
// against the real API server: refused, by its policy. Then every field of each bounded object
// other than ghcrsync's own is changed, one at a time, and must be refused too (the variants no
// one wrote a case for). ghcrsync's own writes are admitted. Negative control: with the
// policies' bindings deleted, the same escalations are admitted — the policies are what refuse
// them.
func TestWritesAreBoundedToTheirFields(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	create(t, kube, manifests(t, "namespace.yaml")...)
	objs := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, objs...)

	as := map[string]*clients{
		"apply":   clientsOf(t, newIdentity(t, sb, "ghcrsync-apply")),
		"release": clientsOf(t, newIdentity(t, sb, "ghcrsync-release")),
		// The node templates' writer: no other identity may write one (rbac below).
		"template": clientsOf(t, newIdentity(t, sb, "ghcrsync-template")),
	}

	// The probe namespace holds no account but the probe's: a pod as ghcrsync-release there is
	// refused for that alone. To see the policy refuse it as well, an account of that name is put
	// there, as in a namespace shared with the identities (the layout before this version).
	create(t, kube, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ghcrsync-release", Namespace: sandbox.ProbeNamespace}})

	node := aWorker(t, kube)
	escalations := namedEscalations(node)
	markPullSecret(t, kube)

	typeChecked(t, kube, objs)

	// The policies are enforced once the API server has loaded them.
	sandboxtest.Eventually(t, 30*time.Second, "the policies refuse the escalations", func() error {
		for _, e := range escalations {
			if err := e.try(as[e.who]); !e.refused(err) {
				return fmt.Errorf("%s: %v", e.name, err)
			}
		}

		return nil
	})

	for _, e := range escalations {
		t.Run(e.name, func(t *testing.T) {
			if err := e.try(as[e.who]); !e.refused(err) {
				t.Fatalf("want a refusal by %s, got %v", e.policy, err)
			}
		})
	}

	// The template identity's split holds by RBAC; the control is among the own writes below:
	// the template identity writes the template key and restarts the autoscaler, apply steers.
	for _, e := range splitTemplateWrites(node) {
		t.Run(e.name, func(t *testing.T) {
			if err := e.try(as[e.who]); !e.refused(err) {
				t.Fatalf("want a refusal by %s's roles, got %v", e.who, err)
			}
		})
	}

	// ghcrsync's own writes pass.
	for _, w := range ownWrites(node) {
		t.Run("own_"+w.name, func(t *testing.T) {
			if err := w.try(as[w.who]); err != nil {
				t.Fatalf("ghcrsync's own write is refused: %v", err)
			}
		})
	}

	// Every other field, one at a time.
	refusedElsewhere := map[string]bool{}
	tried := 0

	for _, b := range boundedObjects(node) {
		for _, who := range b.patchers {
			for _, v := range variants(t, sb, b) {
				tried++

				err := patchDryRun(ctx, as[who].dyn, b, v.patch)

				switch {
				case err == nil:
					t.Errorf("%s may change %s %s (%s): admitted", who, b.name, v.path, v.op)
				case !refusedBy(err, b.policy):
					refusedElsewhere[who+" "+b.name+" "+v.path+" "+v.op] = true
				}
			}
		}
	}

	if tried < 60 {
		t.Fatalf("only %d variants tried", tried)
	}

	// The negative control: without the bindings, the escalations are admitted.
	bindings := policyBindings(objs)
	for _, name := range bindings {
		_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
	}

	t.Cleanup(func() { install(t, sb, permissionPolicy(objs)...) })

	sandboxtest.Eventually(t, 30*time.Second, "without the bindings, every escalation is admitted", func() error {
		for _, e := range escalations {
			err := e.try(as[e.who])
			if e.podSecurity && e.refused(err) {
				continue // PodSecurity still refuses it
			}

			if err != nil {
				return fmt.Errorf("%s: %v", e.name, err)
			}
		}

		return nil
	})

	// A variant refused by something else (a field's own validation) is refused without the
	// policies too: it is not one the policies were trusted with.
	admittedWithout := 0

	for _, b := range boundedObjects(node) {
		for _, who := range b.patchers {
			for _, v := range variants(t, sb, b) {
				err := patchDryRun(ctx, as[who].dyn, b, v.patch)
				if err == nil {
					admittedWithout++
				}

				if err == nil && refusedElsewhere[who+" "+b.name+" "+v.path+" "+v.op] {
					t.Errorf("%s %s %s (%s) was refused by something other than %s, yet is admitted without it", who, b.name, v.path, v.op, b.policy)
				}
			}
		}
	}

	if admittedWithout < tried/2 {
		t.Fatalf("control: only %d of %d variants are admitted without the policies: the sweep does not test them", admittedWithout, tried)
	}

	t.Logf("%d escalations and %d field variants refused; %d variants admitted without the policies", len(escalations), tried, admittedWithout)
}

// clients are an identity's typed and dynamic clients.
type clients struct {
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

func clientsOf(t *testing.T, id identity) *clients {
	t.Helper()

	kc := filepath.Join(filepath.Dir(id.cfg), "kubeconfig")

	return &clients{kube: sandboxtest.KubeFrom(t, kc), dyn: sandboxtest.DynamicFrom(t, kc)}
}

func refusedBy(err error, policy string) bool {
	return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) &&
		strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

var (
	deployments = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	nodes       = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	accounts    = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	secrets     = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
)

// markPullSecret marks the consumer pull secret as a run of the sandbox's configuration writes
// it (with the cluster credential's name, as the roles were rendered).
func markPullSecret(t *testing.T, kube kubernetes.Interface) {
	t.Helper()

	ns, name := sandbox.ConsumerNamespaces[0], sandbox.ConsumerSecret

	s, err := kube.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.ConfigurationAnnotation, sandbox.LeaseNamespace+"/ghcr-auth-refresh")
	metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.CredentialAnnotation, "ghcr")

	if _, err := kube.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// write is one dry-run write by an identity. podSecurity: the probe namespace's PodSecurity
// "restricted" admission refuses it as well (before the policy sees it), with or without it.
// rbac: the identity's roles refuse it (no policy is involved: it holds no such right).
type write struct {
	name, who, policy string
	try               func(*clients) error
	podSecurity, rbac bool
}

// refused reports whether err is the refusal w must meet.
func (w write) refused(err error) bool {
	if w.rbac {
		return apierrors.IsForbidden(err) && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
	}

	return refusedBy(err, w.policy) || w.podSecurity && err != nil && strings.Contains(err.Error(), `violates PodSecurity "restricted`)
}

// splitTemplateWrites are the writes the template identity's split refuses by RBAC: apply writes
// no node template and restarts no deployment; the template identity patches no node, evicts
// nothing and writes no pull secret — no one token both writes what new machines boot from and
// reboots a node into it.
func splitTemplateWrites(node string) []write {
	touch := func(s *corev1.Secret) { s.Data[sandbox.TemplateKey] = append(s.Data[sandbox.TemplateKey], ' ') }

	return []write{
		{name: "apply_writes_the_template", who: "apply", rbac: true, try: updateSecret(sandbox.TemplateNamespace, sandbox.TemplateSecret, touch)},
		{name: "apply_restarts_the_autoscaler", who: "apply", rbac: true, try: mergePatch(deployments, "kube-system", sandbox.AutoscalerDeployment,
			spec(map[string]any{"template": map[string]any{"metadata": map[string]any{"annotations": map[string]any{cluster.RestartedAtAnnotation: "now"}}}}))},
		{name: "template_cordons_a_node", who: "template", rbac: true, try: mergePatch(nodes, "", node, spec(map[string]any{"unschedulable": true}))},
		{name: "template_evicts_a_pod", who: "template", rbac: true, try: func(c *clients) error {
			return c.kube.CoreV1().Pods("default").EvictV1(context.Background(), &policyv1.Eviction{
				ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default"}, DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
		}},
		{name: "template_writes_a_pull_secret", who: "template", rbac: true, try: updateSecret(sandbox.ConsumerNamespaces[0], sandbox.ConsumerSecret, func(s *corev1.Secret) {
			s.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{}}`)
		})},
	}
}

func mergePatch(gvr schema.GroupVersionResource, ns, name string, body map[string]any) func(*clients) error {
	return func(c *clients) error {
		b, _ := json.Marshal(body)

		var err error
		if ns == "" {
			_, err = c.dyn.Resource(gvr).Patch(context.Background(), name, types.MergePatchType, b, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		} else {
			_, err = c.dyn.Resource(gvr).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, b, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		}

		return err
	}
}

func spec(kv map[string]any) map[string]any { return map[string]any{"spec": kv} }

func template(podSpec map[string]any) map[string]any {
	return spec(map[string]any{"template": map[string]any{"spec": podSpec}})
}

func probePod(mutate func(*corev1.Pod)) func(*clients) error {
	return func(c *clients) error {
		pod := probe.Pod(node0, plan.Probe{Image: "ghcr.io/ghcrsync/private-probe:v1", Namespace: sandbox.ProbeNamespace, ServiceAccount: sandbox.ProbeServiceAccount}, "bounds")
		if mutate != nil {
			mutate(pod)
		}

		_, err := c.kube.CoreV1().Pods(sandbox.ProbeNamespace).Create(context.Background(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

		return err
	}
}

var node0 string // the node the probe pods are pinned to

func namedEscalations(node string) []write {
	node0 = node
	ks, repo := cluster.Kustomizations, cluster.OCIRepositories
	ksName, ns := sandbox.Kustomization, sandbox.RootNamespace
	dep := func(name string, body map[string]any) write {
		return write{name: "template_deployment_" + name, who: "template", policy: permission.DeploymentsPolicy,
			try: mergePatch(deployments, "kube-system", sandbox.AutoscalerDeployment, body)}
	}

	var out []write

	for _, who := range []string{"apply", "release"} {
		out = append(out,
			write{name: who + "_kustomization_spec_patches", who: who, policy: permission.KustomizationsPolicy,
				try: mergePatch(ks, ns, ksName, spec(map[string]any{"patches": []any{map[string]any{"patch": "- op: add\n  path: /x\n  value: y", "target": map[string]any{"kind": "Deployment"}}}}))},
			write{name: who + "_kustomization_spec_serviceAccountName", who: who, policy: permission.KustomizationsPolicy,
				try: mergePatch(ks, ns, ksName, spec(map[string]any{"serviceAccountName": "cluster-admin-sa"}))},
			write{name: who + "_node_label", who: who, policy: permission.NodesPolicy,
				try: mergePatch(nodes, "", node, map[string]any{"metadata": map[string]any{"labels": map[string]any{"node-role.kubernetes.io/control-plane": ""}}})},
			// The steering taint with NoExecute: every pod without a toleration evicted at once,
			// past every budget; and with a value not of a run's token.
			write{name: who + "_steering_taint_noexecute", who: who, policy: permission.NodesPolicy, try: steer(node, taints.RunToken("h1"), "NoExecute")},
			write{name: who + "_steering_taint_other_value", who: who, policy: permission.NodesPolicy, try: steer(node, "anything", "NoSchedule")},
		)
	}

	// Secrets: only those the configuration names, each as ghcrsync writes it.
	team, pull := sandbox.ConsumerNamespaces[0], sandbox.ConsumerSecret
	tmplNS, tmpl := sandbox.TemplateNamespace, sandbox.TemplateSecret
	out = append(out,
		write{name: "apply_opaque_secret_of_another_name", who: "apply", policy: permission.SecretsPolicy,
			try: createSecret(team, "app-config", corev1.SecretTypeOpaque, map[string][]byte{"DATABASE_URL": []byte("postgres://attacker")})},
		write{name: "apply_opaque_secret_in_flux_system", who: "apply", policy: permission.SecretsPolicy,
			try: createSecret(sandbox.RootNamespace, "cluster-vars", corev1.SecretTypeOpaque, map[string][]byte{"domain": []byte("attacker.example")})},
		write{name: "apply_pull_secret_of_another_name", who: "apply", policy: permission.SecretsPolicy,
			try: createSecret(team, "other-pull", corev1.SecretTypeDockerConfigJson, map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)})},
		write{name: "apply_pull_secret_opaque", who: "apply", policy: permission.SecretsPolicy,
			try: createSecret(sandbox.ConsumerNamespaces[1], pull, corev1.SecretTypeOpaque, map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)})},
		write{name: "apply_pull_secret_second_key", who: "apply", policy: permission.SecretsPolicy,
			try: updateSecret(team, pull, func(s *corev1.Secret) { s.Data["HCLOUD_TOKEN"] = []byte("x") })},
		write{name: "apply_pull_secret_another_credential", who: "apply", policy: permission.SecretsPolicy,
			try: updateSecret(team, pull, func(s *corev1.Secret) {
				metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.CredentialAnnotation, "tenant-x")
			})},
		write{name: "apply_pull_secret_immutable", who: "apply", policy: permission.SecretsPolicy,
			try: updateSecret(team, pull, func(s *corev1.Secret) { s.Immutable = ptr.To(true) })},
		write{name: "apply_pull_secret_owner", who: "apply", policy: permission.SecretsPolicy,
			try: updateSecret(team, pull, func(s *corev1.Secret) { s.Finalizers = append(s.Finalizers, "example.com/hold") })},
		write{name: "template_template_another_key", who: "template", policy: permission.SecretsPolicy,
			try: updateSecret(tmplNS, tmpl, func(s *corev1.Secret) { s.Data["HCLOUD_ENDPOINT"] = []byte("https://attacker.example") })},
		write{name: "template_template_label", who: "template", policy: permission.SecretsPolicy,
			try: updateSecret(tmplNS, tmpl, func(s *corev1.Secret) { metav1.SetMetaDataLabel(&s.ObjectMeta, "example.com/x", "y") })},
		write{name: "template_template_annotation", who: "template", policy: permission.SecretsPolicy,
			try: updateSecret(tmplNS, tmpl, func(s *corev1.Secret) { metav1.SetMetaDataAnnotation(&s.ObjectMeta, "ghcrsync.dev/x", "y") })},
	)

	// Events: only ghcrsync's own shape, never the kubelet's.
	for _, who := range []string{"apply", "release"} {
		out = append(out,
			write{name: who + "_event_as_the_kubelet", who: who, policy: permission.EventsPolicy, try: createEvent(func(e *corev1.Event) {
				e.Reason, e.Source, e.ReportingController, e.ReportingInstance = "Pulled", corev1.EventSource{Component: "kubelet"}, "kubelet", "node-1"
				e.InvolvedObject = corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0", APIVersion: "v1"}
			})},
			write{name: who + "_event_about_a_pod", who: who, policy: permission.EventsPolicy, try: createEvent(func(e *corev1.Event) {
				e.InvolvedObject = corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0", APIVersion: "v1"}
			})},
		)
	}

	out = append(out, write{name: "apply_foreign_lease", who: "apply", policy: permission.LeasesPolicy, try: func(c *clients) error {
		_, err := c.kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Create(context.Background(),
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kustomize-controller-leader-election", Namespace: sandbox.LeaseNamespace}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

		return err
	}})

	return append(out,
		write{name: "apply_ocirepository_spec_url", who: "apply", policy: permission.OCIRepositoriesPolicy,
			try: mergePatch(repo, ns, sandbox.OCIRepository, spec(map[string]any{"url": "oci://attacker.example/app"}))},
		dep("image", template(map[string]any{"containers": []any{map[string]any{"name": "cluster-autoscaler", "image": "attacker.example/x:1"}}})),
		dep("serviceAccountName", template(map[string]any{"serviceAccountName": "default"})),
		dep("replicas", spec(map[string]any{"replicas": 5})),
		write{name: "apply_serviceaccount_automount", who: "apply", policy: permission.ServiceAccountsPolicy,
			try: mergePatch(accounts, sandbox.ConsumerNamespaces[0], "default", map[string]any{"automountServiceAccountToken": true})},
		write{name: "apply_pod_as_ghcrsync_release", who: "apply", policy: permission.PodsPolicy,
			try: probePod(func(p *corev1.Pod) { p.Spec.ServiceAccountName = "ghcrsync-release" })},
		write{name: "apply_pod_mounting_a_secret", who: "apply", policy: permission.PodsPolicy,
			try: probePod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "ghcrsync-inputs"}}}}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "s", MountPath: "/s"}}
			})},
		write{name: "apply_pod_with_a_token", who: "apply", policy: permission.PodsPolicy,
			try: probePod(func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) })},
		write{name: "apply_pod_other_image", who: "apply", policy: permission.PodsPolicy,
			try: probePod(func(p *corev1.Pod) { p.Spec.Containers[0].Image = "attacker.example/shell:1" })},
		write{name: "apply_pod_command", who: "apply", policy: permission.PodsPolicy,
			try: probePod(func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "id"} })},
		write{name: "apply_pod_host_network", who: "apply", policy: permission.PodsPolicy, podSecurity: true,
			try: probePod(func(p *corev1.Pod) { p.Spec.HostNetwork = true })},
		write{name: "apply_pod_privileged", who: "apply", policy: permission.PodsPolicy, podSecurity: true,
			try: probePod(func(p *corev1.Pod) {
				p.Spec.Containers[0].SecurityContext.Privileged, p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true), nil
			})},
		write{name: "apply_pod_init_container", who: "apply", policy: permission.PodsPolicy,
			try: probePod(func(p *corev1.Pod) {
				c := p.Spec.Containers[0]
				c.Name = "escape"
				p.Spec.InitContainers = []corev1.Container{c}
			})},
	)
}

// createSecret is a dry-run create of a Secret.
func createSecret(ns, name string, typ corev1.SecretType, data map[string][]byte) func(*clients) error {
	return func(c *clients) error {
		_, err := c.kube.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Type: typ, Data: data},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

		return err
	}
}

// updateSecret is a dry-run update of a Secret as it is now, changed by change.
func updateSecret(ns, name string, change func(*corev1.Secret)) func(*clients) error {
	return func(c *clients) error {
		s, err := c.kube.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if s.Data == nil {
			s.Data = map[string][]byte{}
		}

		change(s)
		_, err = c.kube.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})

		return err
	}
}

// createEvent is a dry-run create, in the default namespace, of an Event as ghcrsync records one
// about a Node, changed by change.
func createEvent(change func(*corev1.Event)) func(*clients) error {
	return func(c *clients) error {
		now := metav1.Now()
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "bounds." + strconv.FormatInt(now.UnixNano(), 16), Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node0, APIVersion: "v1"}, Reason: "GhcrsyncClaim", Message: "run x: claimed",
			Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: cluster.EventSource}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
			ReportingController: cluster.EventReportingController, ReportingInstance: cluster.EventSource}

		if change != nil {
			change(e)
		}

		_, err := c.kube.CoreV1().Events("default").Create(context.Background(), e, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

		return err
	}
}

// steer is a dry-run patch adding the steering taint with value and effect to node's taints.
func steer(node, value, effect string) func(*clients) error {
	return func(c *clients) error {
		n, err := c.kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}

		// A dry run stores nothing: no resourceVersion, so a kubelet heartbeat in between is no conflict.
		list := append(slices.Clone(n.Spec.Taints), corev1.Taint{Key: taints.Steering, Value: value, Effect: corev1.TaintEffect(effect)})

		return mergePatch(nodes, "", node, map[string]any{"spec": map[string]any{"taints": list}})(c)
	}
}

// ownWrites are the writes ghcrsync makes, each admitted.
func ownWrites(node string) []write {
	ks := cluster.Kustomizations
	ns := sandbox.RootNamespace

	var out []write

	for _, who := range []string{"apply", "release"} {
		out = append(out,
			write{name: who + "_suspend", who: who, try: mergePatch(ks, ns, sandbox.Kustomization,
				map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.SuspendedByAnnotation: "run"}}, "spec": map[string]any{"suspend": true}})},
			write{name: who + "_cordon_and_claim", who: who, try: mergePatch(nodes, "", node, map[string]any{
				"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "run", object.ScaleDownDisabledAnnotation: "true"}},
				"spec":     map[string]any{"unschedulable": true}})},
		)
	}

	return append(out,
		write{name: "apply_reconcile_request", who: "apply", try: mergePatch(cluster.OCIRepositories, ns, sandbox.OCIRepository,
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{cluster.ReconcileRequestAnnotation: "now"}}})},
		write{name: "template_rollout_restart", who: "template", try: mergePatch(deployments, "kube-system", sandbox.AutoscalerDeployment,
			spec(map[string]any{"template": map[string]any{"metadata": map[string]any{"annotations": map[string]any{cluster.RestartedAtAnnotation: "now"}}}}))},
		write{name: "apply_pull_secret_reference", who: "apply", try: mergePatch(accounts, sandbox.ConsumerNamespaces[0], "default",
			map[string]any{"imagePullSecrets": []any{map[string]any{"name": sandbox.ConsumerSecret}}})},
		write{name: "apply_steering_taint", who: "apply", try: func(c *clients) error {
			n, err := c.kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				return err
			}

			return mergePatch(nodes, "", node, object.SteerPatch(n, "run", "PreferNoSchedule"))(c)
		}},
		write{name: "apply_probe_pod", who: "apply", try: probePod(nil)},
		// The fan-out's writes: a pull secret created and updated (its key and marks), the template's key.
		write{name: "apply_pull_secret_create", who: "apply", try: func(c *clients) error {
			ns := sandbox.ConsumerNamespaces[1]
			_, err := c.kube.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: sandbox.ConsumerSecret, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "ghcrsync"},
					Annotations: map[string]string{object.ConfigurationAnnotation: "flux-system/x", object.CredentialAnnotation: "ghcr"}},
				Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)},
			}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

			return err
		}},
		write{name: "apply_pull_secret_update", who: "apply", try: updateSecret(sandbox.ConsumerNamespaces[0], sandbox.ConsumerSecret, func(s *corev1.Secret) {
			s.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{}}`)
			metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.ConfigurationAnnotation, "flux-system/x")
			metav1.SetMetaDataAnnotation(&s.ObjectMeta, object.CredentialAnnotation, "ghcr")
		})},
		write{name: "template_template_key", who: "template", try: updateSecret(sandbox.TemplateNamespace, sandbox.TemplateSecret, func(s *corev1.Secret) {
			s.Data[sandbox.TemplateKey] = append(s.Data[sandbox.TemplateKey], ' ')
		})},
		write{name: "apply_event", who: "apply", try: createEvent(nil)},
		write{name: "release_event", who: "release", try: createEvent(nil)},
	)
}

func boundedObjects(node string) []bounded {
	annotation := func(keys ...string) func(string) bool {
		return func(p string) bool {
			for _, k := range keys {
				if p == "/metadata/annotations/"+escapePointer(k) {
					return true
				}
			}

			return false
		}
	}

	return []bounded{
		{name: "Node " + node, gvr: nodes, obj: node, policy: permission.NodesPolicy, patchers: []string{"apply", "release"},
			ours: func(p string) bool {
				return strings.HasPrefix(p, "/metadata/annotations/ghcrsync.dev~1") || p == "/metadata/annotations/"+escapePointer(object.ScaleDownDisabledAnnotation) ||
					p == "/spec/unschedulable"
			}},
		{name: "Deployment kube-system/" + sandbox.AutoscalerDeployment, gvr: deployments, ns: "kube-system", obj: sandbox.AutoscalerDeployment,
			policy: permission.DeploymentsPolicy, patchers: []string{"template"}, ours: annotationOfTemplate(cluster.RestartedAtAnnotation)},
		{name: "Kustomization " + sandbox.RootNamespace + "/" + sandbox.Kustomization, gvr: cluster.Kustomizations, ns: sandbox.RootNamespace, obj: sandbox.Kustomization,
			policy: permission.KustomizationsPolicy, patchers: []string{"apply", "release"},
			ours: func(p string) bool { return p == "/spec/suspend" || annotation(object.SuspendedByAnnotation)(p) }},
		{name: "OCIRepository " + sandbox.RootNamespace + "/" + sandbox.OCIRepository, gvr: cluster.OCIRepositories, ns: sandbox.RootNamespace, obj: sandbox.OCIRepository,
			policy: permission.OCIRepositoriesPolicy, patchers: []string{"apply"}, ours: annotation(cluster.ReconcileRequestAnnotation)},
		{name: "ServiceAccount " + sandbox.ConsumerNamespaces[0] + "/default", gvr: accounts, ns: sandbox.ConsumerNamespaces[0], obj: "default",
			policy: permission.ServiceAccountsPolicy, patchers: []string{"apply"}, ours: func(p string) bool { return strings.HasPrefix(p, "/imagePullSecrets") }},
		// The pull secret as ghcrsync left it (markPullSecret): its key and configuration mark are
		// ghcrsync's; its credential mark is pinned to the credential rendered for its namespace.
		{name: "Secret " + sandbox.ConsumerNamespaces[0] + "/" + sandbox.ConsumerSecret, gvr: secrets, ns: sandbox.ConsumerNamespaces[0], obj: sandbox.ConsumerSecret,
			policy: permission.SecretsPolicy, patchers: []string{"apply"},
			ours: func(p string) bool {
				return p == "/data/.dockerconfigjson" || annotation(object.ConfigurationAnnotation)(p)
			}},
		{name: "Secret " + sandbox.TemplateNamespace + "/" + sandbox.TemplateSecret, gvr: secrets, ns: sandbox.TemplateNamespace, obj: sandbox.TemplateSecret,
			policy: permission.SecretsPolicy, patchers: []string{"template"}, ours: func(p string) bool { return p == "/data/"+sandbox.TemplateKey }},
	}
}

func annotationOfTemplate(key string) func(string) bool {
	return func(p string) bool { return p == "/spec/template/metadata/annotations/"+escapePointer(key) }
}

func escapePointer(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }

// variant is one change of one field, as a JSON patch.
type variant struct {
	path, op string
	patch    []byte
}

// variants change each field of b's object (as it is now) that is neither ghcrsync's nor the
// server's: every leaf replaced (a string extended, a number incremented, a boolean negated),
// every map given a new key, every list an element removed.
func variants(t *testing.T, sb *sandbox.Sandbox, b bounded) []variant {
	t.Helper()

	dyn := sandboxtest.DynamicFrom(t, sb.Path(sandbox.KubeconfigFile))

	var (
		obj map[string]any
		err error
	)

	if b.ns == "" {
		u, gerr := dyn.Resource(b.gvr).Get(context.Background(), b.obj, metav1.GetOptions{})
		obj, err = objectOf(u, gerr)
	} else {
		u, gerr := dyn.Resource(b.gvr).Namespace(b.ns).Get(context.Background(), b.obj, metav1.GetOptions{})
		obj, err = objectOf(u, gerr)
	}

	if err != nil {
		t.Fatalf("read %s: %v", b.name, err)
	}

	var out []variant

	add := func(path, op string, value any) {
		if serverOwned(path) || b.ours(path) || strings.HasPrefix(path, "/spec/taints") && steeringTaintPath(obj, path) {
			return
		}

		ops := []map[string]any{{"op": op, "path": path}}
		if op != "remove" {
			ops[0]["value"] = value
		}

		body, _ := json.Marshal(ops)
		out = append(out, variant{path: path, op: op, patch: body})
	}

	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			add(path+"/ghcrsync-escape", "add", "x")

			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}

			sort.Strings(keys)

			for _, k := range keys {
				walk(path+"/"+escapePointer(k), x[k])
			}
		case []any:
			if len(x) > 0 {
				add(path+"/0", "remove", nil)
			}

			for i, e := range x {
				walk(path+"/"+strconv.Itoa(i), e)
			}
		case string:
			add(path, "replace", x+"-escape")
		case bool:
			add(path, "replace", !x)
		case int64:
			add(path, "replace", x+1)
		case float64:
			add(path, "replace", x+1)
		}
	}

	walk("", obj)

	return out
}

func objectOf(u interface{ UnstructuredContent() map[string]any }, err error) (map[string]any, error) {
	if err != nil {
		return nil, err
	}

	return u.UnstructuredContent(), nil
}

// steeringTaintPath: a path inside the steering taint's entry (ghcrsync's own).
func steeringTaintPath(obj map[string]any, path string) bool {
	rest := strings.TrimPrefix(path, "/spec/taints/")
	idx, _, _ := strings.Cut(rest, "/")

	i, err := strconv.Atoi(idx)
	if err != nil {
		return false
	}

	spec, _ := obj["spec"].(map[string]any)
	list, _ := spec["taints"].([]any)

	if i >= len(list) {
		return false
	}

	m, _ := list[i].(map[string]any)

	return m["key"] == taints.Steering
}

func patchDryRun(ctx context.Context, dyn dynamic.Interface, b bounded, patch []byte) error {
	// Strict: a field the type does not have is an error, not silently dropped (a no-op admitted).
	opts := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}

	var err error
	if b.ns == "" {
		_, err = dyn.Resource(b.gvr).Patch(ctx, b.obj, types.JSONPatchType, patch, opts)
	} else {
		_, err = dyn.Resource(b.gvr).Namespace(b.ns).Patch(ctx, b.obj, types.JSONPatchType, patch, opts)
	}

	return err
}

// aWorker is the first worker Node by name (a control-plane label on it is the escalation tried).
func aWorker(t *testing.T, kube kubernetes.Interface) string {
	t.Helper()

	list, err := kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: "!" + object.ControlPlaneLabel})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("worker nodes: %v", err)
	}

	names := make([]string, 0, len(list.Items))
	for _, n := range list.Items {
		names = append(names, n.Name)
	}

	slices.Sort(names)

	return names[0]
}

// typeChecked: the API server found nothing to warn about in any of the policies' expressions.
func typeChecked(t *testing.T, kube kubernetes.Interface, objs []runtime.Object) {
	t.Helper()

	for _, o := range objs {
		p, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy)
		if !ok {
			continue
		}

		sandboxtest.Eventually(t, 30*time.Second, "policy "+p.Name+" type-checked", func() error {
			got, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(context.Background(), p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}

			if got.Status.ObservedGeneration != got.Generation {
				return errors.New("not observed yet")
			}

			if tc := got.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
				t.Fatalf("policy %s: the API server warns: %+v", p.Name, tc.ExpressionWarnings)
			}

			return nil
		})
	}
}

func policyBindings(objs []runtime.Object) []string {
	var out []string

	for _, o := range objs {
		if b, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding); ok {
			out = append(out, b.Name)
		}
	}

	return out
}

// With a bounding policy missing (its binding deleted, as before the API server loads it),
// apply and release refuse to start, naming it, and write nothing; with it in force again,
// release runs.
func TestCommandsProveTheirContainment(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)
	objs := rendered(t, sb, adminConfig(t, sb))
	install(t, sb, objs...)

	applier, releaser := newIdentity(t, sb, "ghcrsync-apply"), newIdentity(t, sb, "ghcrsync-release")

	if _, err := sb.RotateSecret("containment"); err != nil {
		t.Fatal(err)
	}

	withholdKustomizationsPolicy(t, sb, releaser)
	t.Cleanup(func() { install(t, sb, permissionPolicy(objs)...) })

	for _, c := range []struct {
		id   identity
		args []string
	}{{applier, []string{"apply", "--auto-approve"}}, {releaser, []string{"release"}}} {
		r := ghcrsync(t, sb, append(c.args, "--config", c.id.cfg)...)
		if r.code != 1 || !strings.Contains(r.stderr, "will not run as "+c.id.user) || !strings.Contains(r.stderr, permission.KustomizationsPolicy) ||
			!strings.Contains(r.stderr, "ghcrsync rbac") || !strings.Contains(r.stderr, "nothing was changed") {
			t.Fatalf("%s without %s: exit %d\n%s", c.args[0], permission.KustomizationsPolicy, r.code, r.stderr)
		}

		if w := writes(t, sb, c.id.user); len(w) != 0 {
			t.Fatalf("%s without its policy wrote: %v", c.args[0], w)
		}
	}

	install(t, sb, permissionPolicy(objs)...)

	if r := ghcrsync(t, sb, "release", "--config", releaser.cfg); r.code != 0 {
		t.Fatalf("release with the policies in force: exit %d\n%s", r.code, r.stderr)
	}
}

// A namespace labelled as a consumer after the roles were rendered is a warning naming it and a
// consumer the verdict counts as not written — not a permission failure that stops every plan
// and apply (anyone who may label a namespace could otherwise stop them all, emergencies
// included). The control: with the roles rendered again, it is an ordinary consumer.
func TestConsumerLabelledAfterTheRoles(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	const late = "team-late"

	create(t, kube, manifests(t, "namespace.yaml")...)
	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	create(t, kube, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: late, Labels: map[string]string{sandbox.ConsumerLabel: "ghcr"}}})
	t.Cleanup(func() {
		if n, err := kube.CoreV1().Namespaces().Get(ctx, late, metav1.GetOptions{}); err == nil {
			delete(n.Labels, sandbox.ConsumerLabel)
			_, _ = kube.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{})
		}

		_ = kube.CoreV1().Namespaces().Delete(ctx, late, metav1.DeleteOptions{})
	})

	planner, applier := newIdentity(t, sb, "ghcrsync-plan"), newIdentity(t, sb, "ghcrsync-apply")

	if _, err := sb.RotateSecret("late-consumer"); err != nil {
		t.Fatal(err)
	}

	r := ghcrsync(t, sb, "plan", "--config", planner.cfg, "--json")
	if r.code != 0 {
		t.Fatalf("plan with a consumer outside the roles: exit %d, want 0\n%s", r.code, r.stderr)
	}

	var p struct {
		Warnings []string `json:"warnings"`
		Verdict  struct {
			Uses []struct{ Name, State string } `json:"still_used_by"`
		} `json:"verdict"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatal(err)
	}

	if !slices.ContainsFunc(p.Warnings, func(w string) bool {
		return strings.Contains(w, "namespace "+late+" carries the consumer label") && strings.Contains(w, "ghcrsync rbac")
	}) {
		t.Fatalf("plan does not warn about %s: %q", late, p.Warnings)
	}

	if !slices.ContainsFunc(p.Verdict.Uses, func(u struct{ Name, State string }) bool {
		return u.Name == late+"/"+sandbox.ConsumerSecret && u.State == "unknown"
	}) {
		t.Fatalf("the verdict does not count %s/%s as not written: %+v", late, sandbox.ConsumerSecret, p.Verdict.Uses)
	}

	// apply runs, writes nothing there, and its verdict says do not revoke yet, naming it.
	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 5 || !strings.Contains(r.stdout, late+"/"+sandbox.ConsumerSecret) {
		t.Fatalf("apply with a consumer outside the roles: exit %d, want 5 naming it\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if _, err := kube.CoreV1().Secrets(late).Get(ctx, sandbox.ConsumerSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a pull secret was written outside the roles: %v", err)
	}

	// The control: rendered again, the namespace is a consumer like the others.
	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	if r := ghcrsync(t, sb, "plan", "--config", planner.cfg); r.code != 0 || strings.Contains(r.stdout, "carries the consumer label") ||
		!strings.Contains(r.stdout, late+"/"+sandbox.ConsumerSecret) {
		t.Fatalf("plan after the roles were rendered again: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
