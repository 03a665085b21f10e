package view

import (
	"fmt"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"io"
	"sync"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/progress"
)

// Progress words the progress events of a run or a release, one line each, on w (stderr): the
// node first. Events from concurrent node transactions never interleave within a line.
func Progress(w io.Writer) progress.Func {
	if w == nil {
		return nil
	}

	var mu sync.Mutex

	return func(e progress.Event) {
		line := progressLine(e)
		if line == "" {
			return
		}

		mu.Lock()
		defer mu.Unlock()

		fmt.Fprintln(w, Clean(e.About())+": "+oneLine(line))
	}
}

func progressLine(e progress.Event) string {
	switch e := e.(type) {
	case progress.Evicting:
		return "evicting pod " + e.Pod
	case progress.EvictionRetry:
		if e.Destinations {
			return fmt.Sprintf("pod %s not evicted yet: its destinations could not be read (asking again in %s or a little more): %s", e.Pod, e.In, e.Why)
		}

		return fmt.Sprintf("pod %s not evicted yet, attempt %d (asking again in %s or a little more): %s", e.Pod, e.Attempt, e.In, e.Why)
	case progress.Drainer:
		return e.Line
	case progress.WaitingReady:
		return fmt.Sprintf("rebooting, %s elapsed of ready_timeout %s: waiting for %s", e.Elapsed.Round(time.Second), e.Timeout, e.Awaited)
	case progress.WaitingGone:
		return fmt.Sprintf("%s elapsed of ready_timeout %s: waiting for it to go: %s", e.Elapsed.Round(time.Second), e.Timeout, e.Why)
	case progress.WaitingSettled:
		return fmt.Sprintf("waiting before release: Ready=%t, lifecycle taints=%t", e.Ready, e.Lifecycle)
	case progress.WaitingProvisioned:
		return fmt.Sprintf("%s elapsed of ready_timeout %s: waiting for %d %s the autoscaler is creating to join, before the fleet is listed "+
			"the last time", e.Elapsed.Round(time.Second), e.Timeout, e.Machines, human.Plural(e.Machines, "machine", "machines"))
	}

	return ""
}
