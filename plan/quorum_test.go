package plan

import (
	"strings"
	"testing"
)

func TestQuorum(t *testing.T) {
	member := func(names ...string) []EtcdMember {
		out := make([]EtcdMember, 0, len(names))
		for _, n := range names {
			out = append(out, EtcdMember{Hostname: n})
		}

		return out
	}
	healthy := func(name string) ControlPlane {
		return ControlPlane{Name: name, Ready: true, Etcd: EtcdView{Members: member("cp1", "cp2", "cp3")}}
	}
	three := func(change func([]ControlPlane)) []ControlPlane {
		cps := []ControlPlane{healthy("cp1"), healthy("cp2"), healthy("cp3")}
		if change != nil {
			change(cps)
		}

		return cps
	}

	for _, tc := range []struct {
		name      string
		cps       []ControlPlane
		allowLoss bool
		want      string // "" passes
	}{
		{"every other member healthy", three(nil), false, ""},
		{"another not Ready", three(func(c []ControlPlane) { c[1].Ready = false }), false, "cp2 is not Ready"},
		{"another cordoned by anyone", three(func(c []ControlPlane) { c[2].Unschedulable = true }), false, "cp3 is cordoned"},
		{"another fenced by a run", three(func(c []ControlPlane) { c[1].Owner = "run-b" }), false, "cp2 is fenced by run run-b"},
		{"another's status unreadable", three(func(c []ControlPlane) { c[1].Etcd.Err = "deadline exceeded" }), false, "cannot be read"},
		{"another reports errors", three(func(c []ControlPlane) { c[2].Etcd.Errors = []string{"raft: not leader"} }), false, "reports errors"},
		{"an alarm", three(func(c []ControlPlane) { c[1].Etcd.Alarms = []string{"NOSPACE on cp3"} }), false, "alarms raised (NOSPACE on cp3)"},
		{"a corrupt alarm, even with loss allowed", three(func(c []ControlPlane) { c[1].Etcd.Alarms = []string{"CORRUPT on cp2"} }), true, "CORRUPT"},
		{"a learner among the others", three(func(c []ControlPlane) { c[1].Etcd.Members[2].Learner = true }), false, "cp3 are learners"},
		{"two control planes", []ControlPlane{healthy("cp1"), healthy("cp2")}, false, "only 1 other voting etcd member"},
		{"two control planes, loss allowed", []ControlPlane{healthy("cp1"), healthy("cp2")}, true, ""},
		{"a single control plane, loss allowed", []ControlPlane{healthy("cp1")}, true, ""},
		{"a single control plane", []ControlPlane{healthy("cp1")}, false, "only 0 other voting"},
		{"loss allowed is no excuse for a down member", []ControlPlane{healthy("cp1"), {Name: "cp2"}}, true, "cp2 is not Ready"},
		{"self's own state is not asked", three(func(c []ControlPlane) { c[0].Ready, c[0].Unschedulable, c[0].Owner = false, true, "us" }), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Quorum("cp1", tc.cps, tc.allowLoss)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
