package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one child process of the sandbox (etcd, kube-apiserver, ...). It runs in its
// own process group and is killed with the sandbox even if the sandbox itself dies
// (Pdeathsig), so nothing outlives a test binary or `ghcrsync-sandbox up`.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess starts bin with args and, beside PATH and HOME, env.
func startProcess(name, bin string, args, env []string, logDir string) (*process, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("sandbox: %s binary %s: %w (build it with `make control-plane`)", name, bin, err)
	}

	logFile, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + logDir}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	if err := cmd.Start(); err != nil {
		logFile.Close()

		return nil, fmt.Errorf("sandbox: start %s: %w", name, err)
	}

	p := &process{name: name, cmd: cmd, done: make(chan struct{})}

	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()

	return p, nil
}

// exited reports an error if the process has already ended.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("sandbox: %s exited: %v (see its log)", p.name, p.err)
	default:
		return nil
	}
}

// stop terminates the process group, escalating to SIGKILL after grace, and waits.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}

	select {
	case <-p.done:
		return nil
	default:
	}

	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)

	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}

	// The group leader is gone; make sure nothing else of its group survives.
	if err := syscall.Kill(-pgid, 0); err == nil || !errors.Is(err, syscall.ESRCH) {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}

	return nil
}

// pid is the child's process id (for leak checks).
func (p *process) pid() int { return p.cmd.Process.Pid }
