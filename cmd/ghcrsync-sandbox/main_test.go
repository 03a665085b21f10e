package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
)

// ctl's table and the admin API's verbs are the same list.
func TestCtlVerbsAreTheAdminAPIs(t *testing.T) {
	var names []string
	for _, v := range ctlVerbs {
		names = append(names, v.name)
	}

	for _, v := range sandbox.Verbs {
		if !slices.Contains(names, v) {
			t.Errorf("the admin API serves %q, which ctl does not offer", v)
		}
	}

	for _, v := range names {
		if !slices.Contains(sandbox.Verbs, v) {
			t.Errorf("ctl offers %q, which the admin API does not serve", v)
		}
	}
}

func TestCtlRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want sandbox.Request
		err  string
	}{
		{name: "node", args: []string{"reboot", "w1"}, want: sandbox.Request{Node: "w1"}},
		{name: "no_arguments", args: []string{"stats"}},
		{name: "two_arguments", args: []string{"deny-repository", "u", "org/app"}, want: sandbox.Request{User: "u", Repository: "org/app"}},
		{name: "alarm_none_clears", args: []string{"etcd-alarm", "cp1", "none"}, want: sandbox.Request{Node: "cp1"}},
		{name: "move_address_back", args: []string{"move-address", "w1", "none"}, want: sandbox.Request{Node: "w1"}},
		{name: "report_no_ips", args: []string{"report-ips", "w1", "none"}, want: sandbox.Request{Node: "w1", IPs: []string{}}},
		{name: "report_ips", args: []string{"report-ips", "w1", "10.0.0.1,10.0.0.2"}, want: sandbox.Request{Node: "w1", IPs: []string{"10.0.0.1", "10.0.0.2"}}},
		{name: "too_few", args: []string{"slow-talos", "w1"}, err: "slow-talos takes 2 argument(s): slow-talos NODE DURATION"},
		{name: "too_many", args: []string{"move-address", "w1", "m2", "m3"}, err: "move-address takes 1 to 2 arguments"},
		{name: "unknown", args: []string{"explode"}, err: `unknown verb "explode"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := request(tc.args[0], tc.args[1:])

			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err == "" && !equalRequest(got, tc.want):
				t.Fatalf("request %+v, want %+v", got, tc.want)
			}
		})
	}
}

// equalRequest compares requests as the admin API reads them: JSON (no IPs and an empty list differ).
func equalRequest(a, b sandbox.Request) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)

	return string(ja) == string(jb)
}
