package sandbox

import (
	"fmt"
	"os"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/child"
)

// process is one child process of the sandbox (etcd, kube-apiserver, ...): see package child.
type process = child.Process

// startProcess starts bin, a control-plane binary of the cache, with args and env.
func startProcess(name, bin string, args, env []string, logDir string) (*process, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("sandbox: %s binary %s: %w (build it with `make control-plane`)", name, bin, err)
	}

	return child.Start(name, bin, args, env, logDir)
}
