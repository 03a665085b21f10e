package rbac

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/release"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The shipped Job manifest, applied as written: the real apiserver admits it (its service
// account's token volume added by admission), the real job controller and scheduler run it,
// and the node's kubelet runs its one container as a process (sandbox.ProcessImage): chrooted
// into the image's file system (the shipped image's ENTRYPOINT, USER and ENV), the pod's volumes laid
// out as a kubelet does (the secret's file modes and fsGroup ownership, a token bound to the
// pod), as the pod's user, with a read-only root file system. The Job prefers a control plane;
// that one runs Talos 1.14 here, which reloads registry auth live, so the Job updates its own node
// without fencing it, fences and reboots the two 1.13 workers, and the rotation completes — and
// the Job with it. The negative control: the same manifest without its fsGroup cannot read its
// own inputs, and fails before it contacts anything.
func TestShippedJobManifest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the sandbox runs a Job's process only as root (chroot, setuid to the pod's user)")
	}

	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 2, TalosVersion: "1.14,1.13,1.13", Seed: 12,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)
	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	job := shippedJob(t)
	image := job.Spec.Template.Spec.Containers[0].Image

	// The image is a pinned release, the one the workflows install.
	if pin := workflowPin(t); !strings.HasSuffix(image, ":"+pin) {
		t.Fatalf("docs/deploy/job.yaml runs %s; the workflows pin ghcrsync %s: pin the same release", image, pin)
	}

	if readme, _ := os.ReadFile(filepath.Join("..", "..", "README.md")); !strings.Contains(string(readme), image) {
		t.Fatalf("README.md's install section does not name the image the Job runs, %s", image)
	}

	if err := sb.Registry().Publish(image); err != nil {
		t.Fatal(err)
	}

	sb.Fleet().RunImage(image, shippedImage(t, sandboxtest.Binary(t)))

	if _, err := sb.RotateSecret("job"); err != nil {
		t.Fatal(err)
	}

	inputs(t, sb)

	apply := "system:serviceaccount:" + ns + ":ghcrsync-apply"

	t.Run("without fsGroup the inputs are unreadable", func(t *testing.T) {
		bad := job.DeepCopy()
		bad.Name += "-no-fsgroup"
		bad.Spec.Template.Spec.SecurityContext.FSGroup = nil

		before := len(writes(t, sb, apply))

		if done, log := runJob(t, sb, bad); done || !strings.Contains(log, "/inputs/ghcrsync.hcl") || !strings.Contains(log, "permission denied") {
			t.Fatalf("the Job without fsGroup: complete=%v, log:\n%s", done, log)
		}

		if after := writes(t, sb, apply); len(after) != before {
			t.Fatalf("the failed Job wrote: %v", after[before:])
		}
	})

	done, log := runJob(t, sb, job)
	if !done || !strings.Contains(log, "Apply complete") || !strings.Contains(log, "0 failed") {
		t.Fatalf("the shipped Job did not complete the rotation: complete=%v, log:\n%s", done, log)
	}

	if strings.Contains(log, sb.NewCredential().Password) {
		t.Fatal("the Job's log holds the credential")
	}

	for _, m := range sb.FleetInfo() {
		if m.Effective != sb.NewCredential().Username {
			t.Errorf("%s runs %s after the Job, want %s", m.Name, m.Effective, sb.NewCredential().Username)
		}
	}
}

// shippedJob is docs/deploy/job.yaml.
func shippedJob(t *testing.T) *batchv1.Job {
	t.Helper()

	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy", "job.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	objs := decode(t, "docs/deploy/job.yaml", data)
	if len(objs) != 1 {
		t.Fatalf("docs/deploy/job.yaml holds %d objects, want the Job", len(objs))
	}

	job, ok := objs[0].(*batchv1.Job)
	if !ok || len(job.Spec.Template.Spec.Containers) != 1 || job.Spec.Template.Spec.SecurityContext == nil {
		t.Fatalf("docs/deploy/job.yaml: want a Job of one container with a pod securityContext, got %T", objs[0])
	}

	return job
}

// workflowPin is the ghcrsync version the shipped workflows install.
func workflowPin(t *testing.T) string {
	t.Helper()

	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "workflows", "apply.yml"))
	if err != nil {
		t.Fatal(err)
	}

	m := regexp.MustCompile(`GHCRSYNC_VERSION:\s*(v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/workflows/apply.yml pins no GHCRSYNC_VERSION")
	}

	return string(m[1])
}

// shippedImage is the image make release ships (release.ImageIndex), with binary as its content,
// as the sandbox's kubelet runs it: its ENTRYPOINT, USER and ENV, read from its config.
func shippedImage(t *testing.T, binary string) sandbox.ProcessImage {
	t.Helper()

	idx, err := release.ImageIndex(map[string]string{"linux/" + runtime.GOARCH: binary}, release.ImageSource{Version: "test"}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}

	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("the shipped image's index: %v", err)
	}

	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}

	user, group, _ := strings.Cut(cf.Config.User, ":")
	uid, _ := strconv.ParseInt(user, 10, 64)
	gid, _ := strconv.ParseInt(group, 10, 64)

	if len(cf.Config.Entrypoint) != 1 || uid == 0 {
		t.Fatalf("the shipped image: want one ENTRYPOINT and a non-root USER, got %+v", cf.Config)
	}

	return sandbox.ProcessImage{Binary: binary, Entrypoint: cf.Config.Entrypoint[0], User: uid, Group: gid, Env: cf.Config.Env}
}

// inputs creates the ghcrsync-inputs Secret the manifest's header says to create: the sandbox's
// configuration made in-cluster with the Kubernetes state backend, the SOPS file, the
// talosconfig and the age key.
func inputs(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	cfg, err := os.ReadFile(sb.Path(sandbox.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	text := string(cfg)
	for old, new := range map[string]string{
		// The pod's own service account (apply's), and the template identity's kubeconfig among the
		// inputs (docs/deploy/job.yaml): the apply identity writes no node template.
		`kubeconfig = "kubeconfig"`: "in_cluster          = true\n  template_kubeconfig = \"template.kubeconfig\"",
		"state {\n  backend = \"local\"\n  path    = \"ghcrsync.state.json\"\n}": "state {\n  backend   = \"kubernetes\"\n  namespace = \"flux-system\"\n  secret    = \"ghcrsync-state\"\n}",
	} {
		if !strings.Contains(text, old) {
			t.Fatalf("the sandbox's ghcrsync.hcl has no %q", old)
		}

		text = strings.Replace(text, old, new, 1)
	}

	data := map[string][]byte{"ghcrsync.hcl": []byte(text)}

	if data["template.kubeconfig"], err = os.ReadFile(tokenKubeconfig(t, sb, "ghcrsync-template")); err != nil {
		t.Fatal(err)
	}

	for key, file := range map[string]string{"secret.enc.yaml": sandbox.SecretFile, "talosconfig": sandbox.TalosconfigFile, "age.key": sandbox.AgeKeyFile} {
		if data[key], err = os.ReadFile(sb.Path(file)); err != nil {
			t.Fatal(err)
		}
	}

	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ghcrsync-inputs", Namespace: ns}, Data: data}

	_ = sb.Kube().CoreV1().Secrets(ns).Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	if _, err := sb.Kube().CoreV1().Secrets(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// runJob creates job, waits until the job controller says it is complete or failed, and returns
// which, with its pod's log.
func runJob(t *testing.T, sb *sandbox.Sandbox, job *batchv1.Job) (bool, string) {
	t.Helper()

	ctx := context.Background()
	kube := sb.Kube()
	jobs := kube.BatchV1().Jobs(job.Namespace)

	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the Job as written: %v", err)
	}

	t.Cleanup(func() {
		_ = jobs.Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})

	var complete bool

	sandboxtest.Eventually(t, 4*time.Minute, "Job "+job.Name+" finished", func() error {
		j, err := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		for _, c := range j.Status.Conditions {
			if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
				complete = c.Type == batchv1.JobComplete

				return nil
			}
		}

		return fmt.Errorf("conditions %v", j.Status.Conditions)
	})

	return complete, jobLog(t, sb, kube, job)
}

func jobLog(t *testing.T, sb *sandbox.Sandbox, kube kubernetes.Interface, job *batchv1.Job) string {
	t.Helper()

	pods, err := kube.CoreV1().Pods(job.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the Job's pods: %v (%d)", err, len(pods.Items))
	}

	pod := pods.Items[0]

	log, err := sb.Fleet().ContainerLog(pod.UID)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Sprintf("(no log: %v; pod status %+v)", err, pod.Status)
	}

	return fmt.Sprintf("pod %s on %s, %s\n%s", pod.Name, pod.Spec.NodeName, pod.Status.Phase, log)
}
