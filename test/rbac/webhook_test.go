package rbac

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ghcrsync/ghcrsync/internal/nodetemplate"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The template webhook (docs/deploy/admission.yaml) on the real API server: the shipped
// webhook configuration, pointed at `ghcrsync admission` run with the shipped Deployment's
// arguments. With it, the template identity's change of a node template other than the registry
// credential is refused (a machine config's role, the image); a credential change is admitted,
// and a full rotation writes the template through it; another user is not matched. Its failure
// policy: with the webhook down, the template identity's writes are refused. The negative
// control: without the webhook configuration, the same tampering is admitted (the admission
// policies cannot read inside the key).
func TestTemplateWebhook(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()

	create(t, kube, manifests(t, "namespace.yaml")...)
	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	dep, hook := shippedWebhook(t)
	addr, stop := startWebhook(t, sb, dep)
	caPEM, err := os.ReadFile(filepath.Join(filepath.Dir(addr.cert), "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}

	url := "https://" + addr.addr + "/validate"
	hook.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}

	hooks := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	_ = hooks.Delete(ctx, hook.Name, metav1.DeleteOptions{})

	if _, err := hooks.Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = hooks.Delete(context.Background(), hook.Name, metav1.DeleteOptions{}) })

	templater := clientsOf(t, newIdentity(t, sb, "ghcrsync-template"))
	admin := &clients{kube: kube}

	byWebhook := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "ghcrsync admission: node template")
	}
	role := func(js string) string { return strings.Replace(js, "type: worker", "type: controlplane", 1) }

	sandboxtest.Eventually(t, 30*time.Second, "the webhook refuses a changed machine config", func() error {
		if err := updateTemplate(templater.kube, sb, role); !byWebhook(err) {
			return fmt.Errorf("a changed machine config: %v", err)
		}

		return nil
	})

	for _, c := range []struct {
		name    string
		as      *clients
		edit    func(string) string
		refused bool
	}{
		{"machine_config_role", templater, role, true},
		{"image", templater, func(js string) string { return strings.Replace(js, `"amd64":"talos-`, `"amd64":"attacker-`, 1) }, true},
		{"pool_labels", templater, func(js string) string { return strings.Replace(js, `"labels":{`, `"labels":{"example.com/x":"y",`, 1) }, true},
		{"credential_only", templater, nil, false},
		// Not ghcrsync's template identity: not matched (Helm, Terraform, people write templates).
		{"another_user", admin, role, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := updateTemplate(c.as.kube, sb, c.edit)
			if c.refused != byWebhook(err) || !c.refused && err != nil {
				t.Fatalf("refused by the webhook: %v, want %v (%v)", byWebhook(err), c.refused, err)
			}
		})
	}

	// A full rotation with the webhook in place: the template is written through it.
	if _, err := sb.RotateSecret("webhook"); err != nil {
		t.Fatal(err)
	}

	applier := newIdentity(t, sb, "ghcrsync-apply")
	before, beforeTemplate := len(writes(t, sb, applier.user)), len(writes(t, sb, applier.templateUser))

	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", applier.cfg); r.code != 0 || !strings.Contains(r.stdout, "0 failed") {
		t.Fatalf("apply with the webhook: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	templateWrites(t, sb, applier, before, beforeTemplate)

	// The failure policy: the webhook down, the template identity writes no template at all.
	stop()

	sandboxtest.Eventually(t, 30*time.Second, "with the webhook down, a template write is refused", func() error {
		if err := updateTemplate(templater.kube, sb, nil); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			return fmt.Errorf("a credential change with the webhook down: %v", err)
		}

		return nil
	})

	// The negative control: without the webhook configuration, the policies admit the tampering.
	if err := hooks.Delete(ctx, hook.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 30*time.Second, "without the webhook, a changed machine config is admitted", func() error {
		return updateTemplate(templater.kube, sb, role)
	})
}

// shippedWebhook is docs/deploy/admission.yaml's Deployment and webhook configuration.
func shippedWebhook(t *testing.T) (*appsv1.Deployment, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	t.Helper()

	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy", "admission.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	var (
		dep  *appsv1.Deployment
		hook *admissionregistrationv1.ValidatingWebhookConfiguration
	)

	for _, o := range decode(t, "docs/deploy/admission.yaml", data) {
		switch v := o.(type) {
		case *appsv1.Deployment:
			dep = v
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			hook = v
		}
	}

	if dep == nil || hook == nil || len(hook.Webhooks) != 1 || len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatal("docs/deploy/admission.yaml: want a Deployment of one container and a ValidatingWebhookConfiguration of one webhook")
	}

	if w := hook.Webhooks[0]; w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail {
		t.Fatal("docs/deploy/admission.yaml: the webhook must fail closed (failurePolicy: Fail)")
	}

	return dep, hook
}

type webhookAddr struct{ addr, cert string }

// startWebhook runs `ghcrsync admission` with the Deployment's arguments, its mounts replaced by
// the sandbox's configuration and a serving pair for 127.0.0.1, on a free loopback port. stop
// ends it (SIGTERM, as on a pod's deletion).
func startWebhook(t *testing.T, sb *sandbox.Sandbox, dep *appsv1.Deployment) (webhookAddr, func()) {
	t.Helper()

	dir := t.TempDir()
	if err := sandbox.WriteServingPair(dir, net.IPv4(127, 0, 0, 1)); err != nil {
		t.Fatal(err)
	}

	args := dep.Spec.Template.Spec.Containers[0].Args
	repl := strings.NewReplacer("/config/ghcrsync.hcl", adminConfig(t, sb), "/tls/", dir+"/", ":8443", "127.0.0.1:0")

	for i := range args {
		args[i] = repl.Replace(args[i])
	}

	cmd := exec.Command(sandboxtest.Binary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}

	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}

	var stderr strings.Builder
	cmd.Stderr = &stderr

	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		}
	}

	t.Cleanup(func() {
		stop()

		if t.Failed() {
			t.Logf("ghcrsync admission's log:\n%s", stderr.String())
		}
	})

	line, err := bufio.NewReader(out).ReadString('\n')
	m := regexp.MustCompile(`listening on https://(\S+)/validate`).FindStringSubmatch(line)

	if err != nil || m == nil {
		stop()
		t.Fatalf("ghcrsync admission did not start: %q %v\n%s", line, err, stderr.String())
	}

	if _, _, err := net.SplitHostPort(m[1]); err != nil {
		t.Fatal(err)
	}

	return webhookAddr{addr: m[1], cert: filepath.Join(dir, "tls.crt")}, stop
}

// updateTemplate updates the node template as a dry run, as the client kube: its value with a
// fresh credential (what a rotation writes), then edit applied to its JSON (nil: none).
func updateTemplate(kube kubernetes.Interface, sb *sandbox.Sandbox, edit func(js string) string) error {
	ctx := context.Background()
	secrets := kube.CoreV1().Secrets(sandbox.TemplateNamespace)

	s, err := sb.Kube().CoreV1().Secrets(sandbox.TemplateNamespace).Get(ctx, sandbox.TemplateSecret, metav1.GetOptions{})
	if err != nil {
		return err
	}

	value, err := nodetemplate.Rewrite(nodetemplate.FormatHcloud, s.Data[sandbox.TemplateKey], []string{sandbox.TemplatePool}, sandbox.RegistryHost,
		"webhook-check", fmt.Sprintf("p-%d", time.Now().UnixNano()))
	if err != nil {
		return err
	}

	if edit != nil {
		js, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(value)))
		if err != nil {
			return err
		}

		edited := edit(string(js))
		if edited == string(js) {
			return fmt.Errorf("the edit changed nothing in %.200s", js)
		}

		value = []byte(base64.StdEncoding.EncodeToString([]byte(edited)))
	}

	s.Data[sandbox.TemplateKey] = value
	_, err = secrets.Update(ctx, s, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})

	return err
}
