package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one ghcrsync process.
type proc struct {
	args     []string
	cmd      *exec.Cmd
	stdout   bytes.Buffer
	stderr   bytes.Buffer
	started  time.Time
	done     chan struct{}
	mu       sync.Mutex
	code     int // exit code; -1 if killed by a signal it did not handle
	exitedAt time.Time
}

// cli runs the ghcrsync binary with the sandbox's environment; logDir, if set, keeps every
// process's output (NNN-command.log) for the seed's post-mortem.
type cli struct {
	bin    string
	env    []string
	mu     sync.Mutex
	logDir string
	n      int
}

func (c *cli) setLogDir(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.logDir, c.n = dir, 0
}

func (c *cli) start(args ...string) (*proc, error) {
	p := &proc{args: args, done: make(chan struct{})}
	p.cmd = exec.Command(c.bin, args...)
	p.cmd.Env = c.env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr

	if err := p.cmd.Start(); err != nil {
		return nil, err
	}

	p.started = time.Now()

	c.mu.Lock()
	c.n++
	logFile := ""
	if c.logDir != "" {
		logFile = filepath.Join(c.logDir, fmt.Sprintf("%03d-%s.log", c.n, args[0]))
	}
	c.mu.Unlock()

	go func() {
		_ = p.cmd.Wait()

		p.mu.Lock()
		p.code, p.exitedAt = p.cmd.ProcessState.ExitCode(), time.Now()
		p.mu.Unlock()

		if logFile != "" {
			_ = os.WriteFile(logFile, fmt.Appendf(nil, "$ ghcrsync %s\nstarted %s, exit %d after %s\n--- stdout\n%s\n--- stderr\n%s",
				strings.Join(args, " "), p.started.Format(time.RFC3339Nano), p.code, p.exitedAt.Sub(p.started).Round(time.Millisecond),
				p.stdout.String(), p.stderr.String()), 0o600)
		}

		close(p.done)
	}()

	return p, nil
}

// run runs one command to its end (killed after timeout: a hung command is a finding).
func (c *cli) run(timeout time.Duration, args ...string) (*proc, error) {
	p, err := c.start(args...)
	if err != nil {
		return nil, err
	}

	if err := p.wait(timeout); err != nil {
		return p, err
	}

	return p, nil
}

// wait waits for the process to end; after timeout it kills it and says so.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done

		return fmt.Errorf("ghcrsync %v did not end within %s (killed): it hangs\nstderr:\n%s", p.args[0], timeout, tail(p.stderr.String()))
	}
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

func (p *proc) exit() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()

	return p.code, p.exitedAt
}

func (p *proc) output() string {
	return "stdout:\n" + tail(p.stdout.String()) + "\nstderr:\n" + tail(p.stderr.String())
}

// tail keeps the end of a long output.
func tail(s string) string {
	const n = 4000
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}

	return s
}

// sleep waits d or until ctx ends; it reports whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
