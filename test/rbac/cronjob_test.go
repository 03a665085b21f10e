package rbac

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The continuation lane in the cluster: docs/deploy/cronjob.yaml, created as written (the real
// apiserver admits it; it is suspended here so the real CronJob controller does not start a run
// of its own), runs the Job's very pod (its template is the Job's: no drift). A run of it is
// killed hard mid-rotation — SIGKILL while a worker reboots, as an OOM kill: its pod is Failed
// and its fences recorded. While it still ran, `fences` said its run was alive and nothing
// releasable (the negative control). The next run, started from the same
// CronJob, proves the first one over from its pod without --holder, reclaims its fences and
// finishes the rotation — the node the killed run left on its unproven hold included (the plan,
// made before the reclaim, left it to another run's fence; the run's late-node pass takes it).
// No demo workloads: what is tested is the run's end and the next one, not a drain. Then the
// same with a run whose pod is deleted mid-rotation.
func TestHardKilledCronJobRunIsRecoveredByTheNext(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the sandbox runs a Job's process only as root (chroot, setuid to the pod's user)")
	}

	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 2, TalosVersion: "1.14,1.13,1.13", Seed: 13, NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 4 * time.Second, AutoscalerInterval: time.Second,
	})
	ctx := context.Background()
	kube := sb.Kube()

	create(t, kube, manifests(t, "namespace.yaml")...)
	install(t, sb, rendered(t, sb, adminConfig(t, sb))...)

	job := shippedJob(t)
	cron := shippedCronJob(t)

	if !reflect.DeepEqual(cron.Spec.JobTemplate.Spec.Template, job.Spec.Template) {
		t.Fatal("docs/deploy/cronjob.yaml's pod template differs from docs/deploy/job.yaml's: keep them the same")
	}

	image := job.Spec.Template.Spec.Containers[0].Image
	if err := sb.Registry().Publish(image); err != nil {
		t.Fatal(err)
	}

	sb.Fleet().RunImage(image, shippedImage(t, sandboxtest.Binary(t)))

	suspended := cron.DeepCopy()
	suspended.Spec.Suspend = ptr.To(true)

	if _, err := kube.BatchV1().CronJobs(ns).Create(ctx, suspended, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the CronJob as written: %v", err)
	}

	if _, err := sb.RotateSecret("cron"); err != nil {
		t.Fatal(err)
	}

	inputs(t, sb)

	// The first run, killed while a worker reboots.
	first := fromCronJob(cron, "ghcrsync-continue-1")
	pod := startJob(t, sb, first, `"@message":"rebooting"`)

	if r := adminGhcrsync(t, sb, "fences"); !strings.Contains(r, "held by a live run") || strings.Contains(r, "terminated run") || strings.Contains(r, "has exited") {
		t.Fatalf("fences while the first run's pod runs: want its run alive, nothing releasable:\n%s", r)
	}

	if !sb.Fleet().KillContainer(pod.UID) {
		t.Fatalf("no process for pod %s", pod.Name)
	}

	sandboxtest.Eventually(t, time.Minute, "the killed run's pod Failed", func() error {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("%v %v", p.Status.Phase, err)
		}

		return nil
	})

	if r := adminGhcrsync(t, sb, "fences"); !strings.Contains(r, "has ended (Failed") {
		t.Fatalf("fences after the kill: want the run proved over by its pod:\n%s", r)
	}

	// The next run, from the same CronJob: no person, no --holder.
	done, log := runJob(t, sb, fromCronJob(cron, "ghcrsync-continue-2"))
	if !done || !strings.Contains(log, "reclaimed a fence of a terminated run") || !strings.Contains(log, "Apply complete") {
		t.Fatalf("the next run did not reclaim and finish: complete=%v\n%s", done, log)
	}

	for _, m := range sb.FleetInfo() {
		if m.Effective != sb.NewCredential().Username {
			t.Errorf("%s runs %s after the second run, want %s", m.Name, m.Effective, sb.NewCredential().Username)
		}
	}

	if r := adminGhcrsync(t, sb, "fences"); !strings.Contains(r, "No fence is held") {
		t.Fatalf("fences after the second run:\n%s", r)
	}

	// A run whose pod is deleted mid-rotation (kubectl delete pod: SIGTERM, then the pod is
	// gone). Its Job is deleted first, orphaning the pod, so no controller replaces it. The pod's
	// absence is evidence once no live Lease vouches for the run; the next run, again from the
	// CronJob and without --holder, reclaims what it left and finishes.
	if _, err := sb.RotateSecret("cron-deleted"); err != nil {
		t.Fatal(err)
	}

	inputs(t, sb)

	third := fromCronJob(cron, "ghcrsync-continue-3")
	pod = startJob(t, sb, third, `"@message":"rebooting"`)

	if err := kube.BatchV1().Jobs(ns).Delete(ctx, third.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}); err != nil {
		t.Fatal(err)
	}

	if err := kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 3*time.Minute, "the deleted run's pod gone", func() error {
		if _, err := kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			return errors.New("still there")
		}

		return nil
	})

	done, log = runJob(t, sb, fromCronJob(cron, "ghcrsync-continue-4"))
	if !done || !strings.Contains(log, "Apply complete") {
		t.Fatalf("the run after the deleted one did not finish: complete=%v\n%s", done, log)
	}

	for _, m := range sb.FleetInfo() {
		if m.Effective != sb.NewCredential().Username {
			t.Errorf("%s runs %s after the run that followed the deleted one, want %s", m.Name, m.Effective, sb.NewCredential().Username)
		}
	}

	if r := adminGhcrsync(t, sb, "fences"); !strings.Contains(r, "No fence is held") {
		t.Fatalf("fences after the run that followed the deleted one:\n%s", r)
	}
}

// shippedCronJob is docs/deploy/cronjob.yaml.
func shippedCronJob(t *testing.T) *batchv1.CronJob {
	t.Helper()

	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy", "cronjob.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	objs := decode(t, "docs/deploy/cronjob.yaml", data)

	cron, ok := objs[0].(*batchv1.CronJob)
	if len(objs) != 1 || !ok || cron.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Fatalf("docs/deploy/cronjob.yaml: want one CronJob that forbids concurrent runs, got %d objects (%T)", len(objs), objs[0])
	}

	return cron
}

// fromCronJob is the Job a CronJob starts (kubectl create job --from=cronjob/…).
func fromCronJob(cron *batchv1.CronJob, name string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cron.Namespace}, Spec: *cron.Spec.JobTemplate.Spec.DeepCopy()}
}

// startJob creates job and returns its pod once the pod's log shows marker.
func startJob(t *testing.T, sb *sandbox.Sandbox, job *batchv1.Job, marker string) corev1.Pod {
	t.Helper()

	ctx := context.Background()
	jobs := sb.Kube().BatchV1().Jobs(job.Namespace)

	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = jobs.Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})

	var pod corev1.Pod

	sandboxtest.Eventually(t, 3*time.Minute, job.Name+"'s log shows "+marker, func() error {
		pods, err := sb.Kube().CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
		if err != nil || len(pods.Items) != 1 {
			return fmt.Errorf("pods %v", err)
		}

		pod = pods.Items[0]

		log, _ := sb.Fleet().ContainerLog(pod.UID)
		if !strings.Contains(log, marker) {
			return fmt.Errorf("not yet (%s):\n%s", pod.Status.Phase, log)
		}

		return nil
	})

	return pod
}

// adminGhcrsync runs ghcrsync with the sandbox's own (admin) configuration and returns what it
// printed: a person looking from outside.
func adminGhcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) string {
	t.Helper()

	_, out, errOut := sandboxtest.Run(t, sb, append(args, "--config", sb.Path(sandbox.ConfigFile))...)

	return out + errOut
}
