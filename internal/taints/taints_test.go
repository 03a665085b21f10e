package taints

import (
	"slices"
	"testing"
)

func TestScheduling(t *testing.T) {
	candidate := func(ts string) Taint { return Taint{Key: DeletionCandidate, Value: ts, Effect: "PreferNoSchedule"} }
	maint := Taint{Key: "example.com/maintenance", Effect: "NoSchedule"}
	notReady := Taint{Key: NotReady, Effect: "NoSchedule"}

	for _, tc := range []struct {
		name   string
		before []Taint
		after  []Taint
		same   bool
	}{
		{name: "candidate_timestamp_rewritten", before: []Taint{candidate("1700000000")}, after: []Taint{candidate("1700000010")}, same: true},
		{name: "candidate_added", before: nil, after: []Taint{candidate("1")}, same: true},
		{name: "candidate_removed", before: []Taint{candidate("1"), maint}, after: []Taint{maint}, same: true},
		{name: "unschedulable_mirror", before: nil, after: []Taint{{Key: Unschedulable, Effect: "NoSchedule"}}, same: true},
		{name: "foreign_taint_added", before: nil, after: []Taint{maint}, same: false},
		{name: "foreign_taint_value_changed", before: []Taint{{Key: "a", Value: "1", Effect: "NoSchedule"}}, after: []Taint{{Key: "a", Value: "2", Effect: "NoSchedule"}}, same: false},
		{name: "to_be_deleted_is_genuine", before: nil, after: []Taint{{Key: ToBeDeleted, Value: "1", Effect: "NoSchedule"}}, same: false},
		{name: "lifecycle_appears_while_rebooting", before: nil, after: []Taint{notReady}, same: true},
		{name: "lifecycle_lag_after_ready", before: []Taint{notReady, maint}, after: []Taint{maint}, same: true},
		{name: "own_steering_taint_added", before: []Taint{maint}, after: []Taint{maint, {Key: Steering, Value: RunToken("h"), Effect: "PreferNoSchedule"}}, same: true},
		{name: "own_steering_taint_effect_changed", before: []Taint{{Key: Steering, Effect: "PreferNoSchedule"}}, after: []Taint{{Key: Steering, Effect: "NoSchedule"}}, same: true},
		{name: "operator_taint_of_the_same_effect_is_genuine", before: []Taint{{Key: Steering, Effect: "NoSchedule"}}, after: []Taint{{Key: Steering, Effect: "NoSchedule"}, maint}, same: false},
		{name: "order_and_duplicates", before: []Taint{maint, {Key: "b", Effect: "NoExecute"}}, after: []Taint{{Key: "b", Effect: "NoExecute"}, maint, maint}, same: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, a := Scheduling(tc.before), Scheduling(tc.after)
			if got := slices.Equal(a, b); got != tc.same {
				added, removed := Diff(b, a)
				t.Fatalf("same=%t want %t (%s)", got, tc.same, DescribeDiff(added, removed))
			}
		})
	}
}

func TestRunToken(t *testing.T) {
	a, b := RunToken("0123456789abcdef-local-host-1-a1b2c3"), RunToken("0123456789abcdef-local-host-1-d4e5f6")
	if a == b || len(a) > 63 || a != RunToken("0123456789abcdef-local-host-1-a1b2c3") {
		t.Fatalf("tokens %q %q", a, b)
	}

	for _, r := range a {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			t.Fatalf("%q is not a taint value", a)
		}
	}
}

func TestDiffDescribe(t *testing.T) {
	added, removed := Diff([]string{"a:NoSchedule"}, []string{"b=1:NoExecute"})
	if got := DescribeDiff(added, removed); got != "+ b=1:NoExecute, - a:NoSchedule" {
		t.Fatal(got)
	}
}

func TestSince(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		ok          bool
	}{
		{"unix_seconds", "1764417086", true},
		{"trailing_garbage", "17abc", false},
		{"empty", "", false},
		{"float", "1764417086.5", false},
		{"spaces", " 1764417086", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, ok := Since(Taint{Key: DeletionCandidate, Value: tc.value})
			if ok != tc.ok || (ok && at.Unix() != 1764417086) {
				t.Fatalf("Since(%q) = %v, %t", tc.value, at, ok)
			}
		})
	}
}

func TestHasLifecycle(t *testing.T) {
	if !HasLifecycle([]Taint{{Key: "a"}, {Key: CiliumAgentNotReady}}) || HasLifecycle([]Taint{{Key: ToBeDeleted}}) || HasLifecycle(nil) {
		t.Fatal("lifecycle taints")
	}
}
