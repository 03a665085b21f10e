package main

import (
	"encoding/json"
	"io"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/view"
)

// profileEnv names the file a CPU profile of the whole command is written to (`go tool pprof
// -top bin/ghcrsync FILE`): how docs/performance.md finds what bounds a figure.
const profileEnv = "GHCRSYNC_CPU_PROFILE"

// startProfile starts the CPU profile GHCRSYNC_CPU_PROFILE asks for; the returned stop writes it.
func startProfile(stderr io.Writer) (stop func()) {
	path := os.Getenv(profileEnv)
	if path == "" {
		return func() {}
	}

	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}

	if err != nil {
		view.Warning(stderr, profileEnv+": no CPU profile: "+err.Error())

		if f != nil {
			f.Close()
		}

		return func() {}
	}

	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// resourcesEnv names the file the command's own use of the machine is written to, as JSON, when
// it ends: its CPU (user and system seconds), its Go heap at its peak (sampled every
// resourceSample) and its peak resident memory. `make bench` reads it beside each wall time, so
// a figure says what is ghcrsync's own share and what is the sandbox's.
const resourcesEnv = "GHCRSYNC_RESOURCES"

// resourceSample is how often the heap is sampled: its peak between two samples is missed, by
// at most what the command allocates in that time.
const resourceSample = 5 * time.Millisecond

// Resources are a command's own use of the machine.
type Resources struct {
	UserSeconds   float64 `json:"cpu_user_s"`
	SystemSeconds float64 `json:"cpu_system_s"`
	PeakHeapBytes uint64  `json:"peak_heap_bytes"`
	MaxRSSBytes   int64   `json:"max_rss_bytes"`
}

// measureResources starts sampling the heap when GHCRSYNC_RESOURCES asks for it; the returned
// stop writes what the command used.
func measureResources(stderr io.Writer) (stop func()) {
	path := os.Getenv(resourcesEnv)
	if path == "" {
		return func() {}
	}

	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	peak := func(p *uint64) {
		metrics.Read(sample)
		if v := sample[0].Value.Uint64(); v > *p {
			*p = v
		}
	}

	var (
		top  uint64
		done = make(chan struct{})
		over = make(chan struct{})
	)

	go func() {
		defer close(over)

		t := time.NewTicker(resourceSample)
		defer t.Stop()

		for {
			peak(&top)

			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()

	return func() {
		close(done)
		<-over
		peak(&top)

		r := Resources{PeakHeapBytes: top}

		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
			r.UserSeconds = time.Duration(ru.Utime.Nano()).Seconds()
			r.SystemSeconds = time.Duration(ru.Stime.Nano()).Seconds()
			r.MaxRSSBytes = maxRSS(ru)
		}

		b, _ := json.Marshal(r)
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			view.Warning(stderr, resourcesEnv+": "+err.Error())
		}
	}
}
