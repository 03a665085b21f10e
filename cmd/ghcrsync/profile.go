package main

import (
	"io"
	"os"
	"runtime/pprof"

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
