package view_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// Every progress event is worded once, the node first, on one line (a hostile pod name cannot
// break it); no writer discards them.
func TestProgressWording(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    progress.Event
		want string
	}{
		{"evicting", progress.Evicting{Node: "w1", Pod: "shop/web-1"}, "w1: evicting pod shop/web-1\n"},
		{"held by a budget", progress.EvictionRetry{Node: "w1", Pod: "shop/web-1", In: 4 * time.Second, Why: "429 TooManyRequests", Attempt: 3},
			"w1: pod shop/web-1 not evicted yet, attempt 3 (asking again in 4s or a little more): 429 TooManyRequests\n"},
		{"destinations unread", progress.EvictionRetry{Node: "w1", Pod: "shop/web-1", In: 5 * time.Second, Why: "timeout", Destinations: true},
			"w1: pod shop/web-1 not evicted yet: its destinations could not be read (asking again in 5s or a little more): timeout\n"},
		{"kubectl's line", progress.Drainer{Node: "w1", Line: "evicting pod shop/web-1\nforged: line"}, "w1: evicting pod shop/web-1 forged: line\n"},
		{"waiting ready", progress.WaitingReady{Node: "w1", Elapsed: 61400 * time.Millisecond, Timeout: 2 * time.Minute, Awaited: "Ready"},
			"w1: rebooting, 1m1s elapsed of ready_timeout 2m0s: waiting for Ready\n"},
		{"waiting gone", progress.WaitingGone{Node: "w1", Elapsed: 5200 * time.Millisecond, Timeout: 2 * time.Minute, Why: "the cluster autoscaler is deleting it"},
			"w1: 5s elapsed of ready_timeout 2m0s: waiting for it to go: the cluster autoscaler is deleting it\n"},
		{"waiting settled", progress.WaitingSettled{Node: "w1", Ready: true, Lifecycle: true}, "w1: waiting before release: Ready=true, lifecycle taints=true\n"},
		{"waiting provisioned", progress.WaitingProvisioned{Group: "pool-a", Machines: 2, Elapsed: 10 * time.Second, Timeout: 2 * time.Minute},
			"pool-a: 10s elapsed of ready_timeout 2m0s: waiting for 2 machines the autoscaler is creating to join, before the fleet is listed the last time\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer

			view.Progress(&b)(tc.e)

			if b.String() != tc.want {
				t.Fatalf("got %q, want %q", b.String(), tc.want)
			}
		})
	}

	progress.Func(nil).Emit(progress.Evicting{}) // no listener: nothing, no panic
	view.Progress(nil).Emit(progress.Evicting{})
}
