package netlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warmfleet/warmfleet/internal/procstat"
)

// ProcSpec says how to run a process on a host.
type ProcSpec struct {
	// Name labels the process; its output goes to Host.Dir/Name.log.
	Name string
	Path string
	Args []string
	// Env is added to a base environment: the harness's own, minus AWS_*
	// and WARMFLEET_* so only what the test says reaches the process.
	Env []string
	// Dir is the working directory; default the host's Dir.
	Dir string
}

// Process is a program running inside a host's namespace. Its output is
// appended to a log file; Restart runs it again with the same spec.
type Process struct {
	host    *Host
	spec    ProcSpec
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	starts int
}

var errNotRunning = errors.New("process is not running")

// Start runs spec inside the host. The lab stops the process at Close, and
// the process is killed if the harness itself dies.
func (h *Host) Start(spec ProcSpec) (*Process, error) {
	if spec.Name == "" || strings.ContainsAny(spec.Name, "/ ") {
		return nil, fmt.Errorf("start on %s: process name %q: want a plain word", h.Name, spec.Name)
	}
	if spec.Dir == "" {
		spec.Dir = h.Dir
	}
	p := &Process{host: h, spec: spec, logPath: filepath.Join(h.Dir, spec.Name+".log")}
	if err := p.start(); err != nil {
		return nil, err
	}
	h.lab.track(p)
	return p, nil
}

func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("start %s on %s: already running", p.spec.Name, p.host.Name)
		}
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s on %s: %w", p.spec.Name, p.host.Name, err)
	}
	defer logf.Close() // the child holds its own copy
	fmt.Fprintf(logf, "=== netlab: start #%d on %s at %s: %s %s\n", p.starts+1, p.host.Name,
		time.Now().Format(time.RFC3339Nano), p.spec.Path, strings.Join(p.spec.Args, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", string(p.host.NS), p.spec.Path}, p.spec.Args...)...)
	cmd.Env = append(baseEnv(os.Environ()), p.spec.Env...)
	cmd.Dir = p.spec.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: signals reach the program's children too. Pdeathsig
	// (kept across the exec by ip) kills it if the harness dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s on %s: %w", p.spec.Name, p.host.Name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	p.starts++
	done := p.done
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// baseEnv drops the variables that configure warmfleet and the AWS SDK, so
// a process sees only the ones its spec gives.
func baseEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, "AWS_") || strings.HasPrefix(kv, "WARMFLEET_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Host is where the process runs.
func (p *Process) Host() *Host { return p.host }

// LogPath is the file that collects the process's output.
func (p *Process) LogPath() string { return p.logPath }

// Log returns the process's output so far.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// PID of the current (or last) run.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Done is closed when the current run exits.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Running reports whether the current run has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.Done():
		return false
	default:
		return true
	}
}

// Wait waits for the current run to exit and returns its exit error.
func (p *Process) Wait() error {
	<-p.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the process group of the current run.
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return errNotRunning
	}
	if err := syscall.Kill(-p.PID(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s on %s: %w", p.spec.Name, p.host.Name, err)
	}
	return nil
}

// Kill crashes the process (SIGKILL) and waits for it.
func (p *Process) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.Done()
	return nil
}

// Stop asks the process to exit (SIGTERM), and kills it after timeout.
func (p *Process) Stop(timeout time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.Done():
		return nil
	case <-time.After(timeout):
	}
	if err := p.Kill(); err != nil && !errors.Is(err, errNotRunning) {
		return err
	}
	return fmt.Errorf("%s on %s ignored SIGTERM for %s; killed", p.spec.Name, p.host.Name, timeout)
}

// Restart stops the process if it runs and starts it again.
func (p *Process) Restart(timeout time.Duration) error {
	if err := p.Stop(timeout); err != nil && !errors.Is(err, errNotRunning) {
		return err
	}
	return p.start()
}

// ProcStats are resource figures of one run of a process.
type ProcStats struct {
	PeakRSS int64         // bytes: VmHWM while running, ru_maxrss after exit
	CPU     time.Duration // user + system
	Running bool
}

// Stats returns the figures of the current (or last) run.
func (p *Process) Stats() (ProcStats, error) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	select {
	case <-done:
		st := cmd.ProcessState
		ru, ok := st.SysUsage().(*syscall.Rusage)
		if !ok {
			return ProcStats{}, errors.New("no rusage for exited process")
		}
		return ProcStats{PeakRSS: ru.Maxrss * 1024, CPU: st.UserTime() + st.SystemTime()}, nil
	default:
	}
	pid := cmd.Process.Pid
	rss, err := procstat.PeakRSS(pid)
	if err != nil {
		return ProcStats{}, fmt.Errorf("stats of %s on %s: %w", p.spec.Name, p.host.Name, err)
	}
	cpu, err := procstat.CPU(pid)
	if err != nil {
		return ProcStats{}, fmt.Errorf("stats of %s on %s: %w", p.spec.Name, p.host.Name, err)
	}
	return ProcStats{PeakRSS: rss, CPU: cpu, Running: true}, nil
}
