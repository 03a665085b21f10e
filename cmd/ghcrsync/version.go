package main

import (
	"runtime/debug"
	"strings"
)

// version is set by `make build` (-ldflags "-X main.version=$(git describe)"); otherwise it is
// read from the build info: the module version of `go install …@vX`, or the VCS revision the
// binary was built from.
var version = ""

// buildVersion is the version ghcrsync reports.
func buildVersion() string {
	if version != "" {
		return version
	}

	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}

	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return strings.TrimPrefix(v, "v")
	}

	rev, dirty := "", false

	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}

	if rev == "" {
		return "devel"
	}

	if len(rev) > 12 {
		rev = rev[:12]
	}

	if dirty {
		rev += "-dirty"
	}

	return "devel+" + rev
}
