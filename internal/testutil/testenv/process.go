package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ToolPath finds a tool in the repository's bin/ or PATH; how says how to get it.
func ToolPath(name, how string) (string, error) {
	local := filepath.Join(RepoRoot(), "bin", name)
	if st, err := os.Stat(local); err == nil && !st.IsDir() {
		return local, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found in bin/ or PATH (%s; `make test` installs it)", name, how)
}

// service is a server process started for tests or benchmarks: its output
// is kept (the tail) for error messages, it dies with its parent, and it is
// stopped with SIGTERM, then SIGKILL after a grace period.
type service struct {
	cmd     *exec.Cmd
	out     *tailBuffer
	exited  chan struct{}
	waitErr error
	once    sync.Once
}

func startService(cmd *exec.Cmd, outMax int) (*service, error) {
	s := &service{cmd: cmd, out: &tailBuffer{max: outMax}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	// The server must not outlive a test binary that crashes or is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() { s.waitErr = cmd.Wait(); close(s.exited) }()
	return s, nil
}

// stop terminates the process; killed reports that it ignored SIGTERM for
// grace and was killed.
func (s *service) stop(grace time.Duration) (killed bool) {
	s.once.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(grace):
			_ = s.cmd.Process.Kill()
			<-s.exited
			killed = true
		}
	})
	return killed
}

// startFailed stops the process and explains err with its exit status and output.
func (s *service) startFailed(what string, err error) error {
	s.stop(time.Second)
	if s.waitErr != nil {
		err = fmt.Errorf("%w (exit: %v)", err, s.waitErr)
	}
	return fmt.Errorf("%s: %w; output:\n%s", what, err, s.out.String())
}

// startForTest starts a service with a bounded start-up and stops it when
// the test ends.
func startForTest[T any](tb testing.TB, what string, timeout time.Duration, start func(ctx context.Context) (T, func() error, error)) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	v, stop, err := start(ctx)
	if err != nil {
		tb.Fatalf("start %s: %v", what, err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("stop %s: %v", what, err)
		}
	})
	return v
}
