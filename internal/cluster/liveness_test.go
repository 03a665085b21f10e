package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
)

func TestPodJudgesTheRunsPod(t *testing.T) {
	pod := func(uid string, phase corev1.PodPhase) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ghcrsync-system", Name: "ghcrsync-apply-x7k2p", UID: types.UID("u-" + uid)},
			Spec: corev1.PodSpec{NodeName: "cp-1"}, Status: corev1.PodStatus{Phase: phase}}
		if phase == corev1.PodFailed {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ghcrsync",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}
		}

		return p
	}

	run := holder.ID{RunRef: "pod:ghcrsync-system/ghcrsync-apply-x7k2p/u-1", PID: 1}

	tests := []struct {
		name     string
		id       holder.ID
		objects  []runtime.Object
		listErr  error
		want     liveness.Verdict
		wantErr  string
		evidence string
	}{
		{name: "killed: the pod failed", id: run, objects: []runtime.Object{pod("1", corev1.PodFailed)},
			want: liveness.Verdict{Applicable: true, Terminal: true, Unique: true}, evidence: "has ended (Failed: OOMKilled, exit 137)"},
		{name: "finished: the pod succeeded", id: run, objects: []runtime.Object{pod("1", corev1.PodSucceeded)},
			want: liveness.Verdict{Applicable: true, Terminal: true, Unique: true}, evidence: "has ended (Succeeded)"},
		{name: "gone: terminated, no proof beyond the Lease", id: run,
			want: liveness.Verdict{Applicable: true, Terminal: true}, evidence: "no longer exists"},
		{name: "the name is another pod's now", id: run, objects: []runtime.Object{pod("2", corev1.PodRunning)},
			want: liveness.Verdict{Applicable: true, Terminal: true}, evidence: "no longer exists"},
		{name: "running: alive", id: run, objects: []runtime.Object{pod("1", corev1.PodRunning)},
			want: liveness.Verdict{Applicable: true}, evidence: "is Running on cp-1"},
		{name: "terminating but running: alive", id: run, objects: []runtime.Object{func() *corev1.Pod {
			p := pod("1", corev1.PodRunning)
			p.DeletionTimestamp = &metav1.Time{}

			return p
		}()}, want: liveness.Verdict{Applicable: true}, evidence: "is Running"},
		{name: "not a pod's run: not judged", id: holder.ID{RunRef: "gh12.1", PID: 1}, want: liveness.Verdict{}},
		{name: "a hostile ref: not judged", id: holder.ID{RunRef: "pod:a/b", PID: 1}, want: liveness.Verdict{}},
		{name: "forbidden: an error (alive), naming the right", id: run,
			listErr: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no")), wantErr: "needs list pods in ghcrsync-system"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewSimpleClientset(tt.objects...)
			if tt.listErr != nil {
				client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tt.listErr })
			}

			got, err := PodLiveness{Client: client}.Check(context.Background(), tt.id)

			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("want an error containing %q, got %v (%+v)", tt.wantErr, err, got)
				}

				return
			case err != nil:
				t.Fatal(err)
			}

			if got.Applicable != tt.want.Applicable || got.Terminal != tt.want.Terminal || got.Unique != tt.want.Unique {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}

			if !strings.Contains(got.Evidence, tt.evidence) {
				t.Fatalf("evidence %q lacks %q", got.Evidence, tt.evidence)
			}
		})
	}
}
