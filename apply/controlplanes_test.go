package apply

import (
	"context"
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/plan"
)

type cpNodes struct {
	nodes []corev1.Node
	err   error
}

func (f cpNodes) ControlPlanes(context.Context) ([]corev1.Node, error) { return f.nodes, f.err }

// etcdAt answers by address; an address it does not know fails (token-free message).
type etcdAt struct {
	views map[string]*plan.EtcdView
	asked *[]string
}

func (f etcdAt) Etcd(_ context.Context, addr string) (*plan.EtcdView, error) {
	*f.asked = append(*f.asked, addr)
	if v, ok := f.views[addr]; ok {
		return v, nil
	}

	return nil, errors.New("connection refused")
}

func controlPlane(name, ip string, ready bool) corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}

	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}},
		},
	}
}

func TestControlPlanes(t *testing.T) {
	healthy := &plan.EtcdView{Members: []plan.EtcdMember{{Hostname: "cp-1"}, {Hostname: "cp-2"}, {Hostname: "cp-3"}}}
	three := []corev1.Node{controlPlane("cp-1", "10.0.0.1", true), controlPlane("cp-2", "10.0.0.2", true), controlPlane("cp-3", "10.0.0.3", false)}

	for _, c := range []struct {
		name      string
		nodes     cpNodes
		views     map[string]*plan.EtcdView
		down      string
		wantAsked []string
		want      []plan.ControlPlane
		wantErr   bool
	}{
		{
			name: "every member but the one going down is asked, at its InternalIP", nodes: cpNodes{nodes: three},
			views: map[string]*plan.EtcdView{"10.0.0.2": healthy, "10.0.0.3": healthy}, down: "cp-1",
			wantAsked: []string{"10.0.0.2", "10.0.0.3"},
			want: []plan.ControlPlane{
				{Name: "cp-1", Ready: true}, {Name: "cp-2", Ready: true, Etcd: *healthy}, {Name: "cp-3", Etcd: *healthy},
			},
		},
		{
			name: "an unreadable member is read as its error, for the gate to judge", nodes: cpNodes{nodes: three},
			views: map[string]*plan.EtcdView{"10.0.0.2": healthy}, down: "cp-1",
			wantAsked: []string{"10.0.0.2", "10.0.0.3"},
			want: []plan.ControlPlane{
				{Name: "cp-1", Ready: true}, {Name: "cp-2", Ready: true, Etcd: *healthy},
				{Name: "cp-3", Etcd: plan.EtcdView{Err: "connection refused"}},
			},
		},
		{name: "the LIST failing fails the read", nodes: cpNodes{err: errors.New("apiserver unavailable")}, down: "cp-1", wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var asked []string

			got, err := controlPlanes(context.Background(), c.nodes, etcdAt{views: c.views, asked: &asked}, c.down)
			if (err != nil) != c.wantErr {
				t.Fatalf("error: %v, want one: %v", err, c.wantErr)
			}

			if !reflect.DeepEqual(asked, c.wantAsked) {
				t.Errorf("asked %v, want %v", asked, c.wantAsked)
			}

			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("read\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}
