// Package child runs the sandbox's child processes (the control plane, the real autoscaler, a
// real node's containerd and kubelet): each in its own process group, killed with its parent
// even if the parent dies (Pdeathsig), logging to LOGDIR/NAME.log, stopped with a grace period
// then SIGKILL to the whole group — so nothing outlives a test binary or `ghcrsync-sandbox up`.
package child

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Process is one child process.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts bin (a path, or a name looked up on PATH) with args and, beside PATH
// (/usr/bin:/bin) and HOME (logDir), env; a PATH in env replaces that one.
func Start(name, bin string, args, env []string, logDir string) (*Process, error) {
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

	p := &Process{name: name, cmd: cmd, done: make(chan struct{})}

	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()

	return p, nil
}

// Name is what the process was started as (its log is NAME.log).
func (p *Process) Name() string { return p.name }

// Done is closed when the process has ended; Err is then how it ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process ended (after Done).
func (p *Process) Err() error { return p.err }

// Exited reports an error if the process has already ended.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("sandbox: %s exited: %v (see its log)", p.name, p.err)
	default:
		return nil
	}
}

// Stop terminates the process group, escalating to SIGKILL after grace, and waits.
func (p *Process) Stop(grace time.Duration) error {
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

// Pid is the child's process id (for leak checks).
func (p *Process) Pid() int { return p.cmd.Process.Pid }
