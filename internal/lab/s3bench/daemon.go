package s3bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/procstat"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

const (
	// pollEvery is how often the benchmark asks the daemon whether the
	// cache is ready: the timing's resolution (`cache add --wait` polls
	// every 200ms; a benchmark wants finer).
	pollEvery = 10 * time.Millisecond
	// daemonStartTimeout bounds the wait for the API socket.
	daemonStartTimeout = 30 * time.Second
	// daemonStopTimeout is how long a daemon gets to exit after SIGTERM.
	daemonStopTimeout = 15 * time.Second
	modelName         = "bench"
)

// runDaemon starts `warmfleet daemon` on a fresh data directory under dir,
// asks it to cache the model and times the request until the cache is
// ready. It returns the sample and the ready revision's directory. The
// daemon's start-up is not timed: a node runs one daemon for its lifetime.
func runDaemon(ctx context.Context, cfg Config, s3 *testenv.S3, dir string, wantBytes int64) (Sample, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Sample{}, "", err
	}
	sock := filepath.Join(dir, "api.sock")
	d, err := startDaemon(cfg, s3, dir, sock)
	if err != nil {
		return Sample{}, "", err
	}
	sample, path, err := cacheModel(ctx, d, "unix://"+sock, wantBytes)
	if serr := d.stop(); serr != nil {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return Sample{}, "", fmt.Errorf("%w\ndaemon log (%s):\n%s", err, d.logPath, tail(d.logPath, 4<<10))
	}
	return sample, path, nil
}

func cacheModel(ctx context.Context, d *daemonProc, addr string, wantBytes int64) (Sample, string, error) {
	client, err := api.NewClient(addr, "")
	if err != nil {
		return Sample{}, "", err
	}
	if err := d.waitAPI(ctx, client); err != nil {
		return Sample{}, "", err
	}
	cpu0, err := d.cpu()
	if err != nil {
		return Sample{}, "", err
	}
	start := time.Now()
	if _, err := client.AddCache(ctx, api.AddCacheRequest{Name: modelName, Source: "s3://" + bucket + "/" + prefix}); err != nil {
		return Sample{}, "", fmt.Errorf("cache add: %w", err)
	}
	st, err := waitReady(ctx, client, d)
	if err != nil {
		return Sample{}, "", err
	}
	elapsed := time.Since(start)
	cpu1, err := d.cpu()
	if err != nil {
		return Sample{}, "", err
	}
	rss, err := d.peakRSS()
	if err != nil {
		return Sample{}, "", err
	}
	if st.BytesTotal != wantBytes {
		return Sample{}, "", fmt.Errorf("daemon cached %d bytes, the model has %d", st.BytesTotal, wantBytes)
	}
	metrics, err := client.Metrics(ctx)
	if err != nil {
		return Sample{}, "", fmt.Errorf("metrics: %w", err)
	}
	s3Bytes, err := metricValue(metrics, "warmfleet_s3_bytes_total")
	if err != nil {
		return Sample{}, "", err
	}
	return Sample{Duration: elapsed, PeakRSS: rss, CPU: cpu1 - cpu0, S3Bytes: int64(s3Bytes)}, st.Path, nil
}

// waitReady polls until the cache is ready, failing fast when the daemon
// reports the cache failed or exits.
func waitReady(ctx context.Context, client *api.Client, d *daemonProc) (api.CacheStatus, error) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		st, err := client.Cache(ctx, modelName)
		switch {
		case err != nil:
			return st, fmt.Errorf("cache status: %w", err)
		case st.Ready && st.Path != "":
			return st, nil
		case st.State == api.StateFailed:
			return st, fmt.Errorf("daemon failed to cache the model: %s", st.Error)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-d.exited:
			return st, fmt.Errorf("daemon exited while caching: %v", d.waitErr)
		case <-tick.C:
		}
	}
}

// daemonProc is a running `warmfleet daemon`.
type daemonProc struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	waitErr error // set before exited closes
}

func startDaemon(cfg Config, s3 *testenv.S3, dir, sock string) (*daemonProc, error) {
	args := append([]string{"daemon",
		"--data-dir", filepath.Join(dir, "data"),
		"--api", "unix://" + sock,
		"--node-name", "s3bench",
		// The benchmark's directory may sit on a nearly full disk; the
		// space check at start already made sure the model fits.
		"--reserve", "0", "--reserve-fraction", "0",
		"--resync-interval", "0",
		"--s3-concurrency", strconv.Itoa(cfg.Concurrency),
		"--part-size", strconv.FormatInt(cfg.PartSize, 10),
		"--log-level", "info",
	}, cfg.DaemonArgs...)
	logPath := filepath.Join(filepath.Dir(dir), "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own copy
	fmt.Fprintf(logf, "=== s3bench %s: %s %s\n", time.Now().Format(time.RFC3339), cfg.DaemonBin, strings.Join(args, " "))
	cmd := exec.Command(cfg.DaemonBin, args...)
	cmd.Env = append(daemonEnv(os.Environ()), s3.Env()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Dies with the benchmark instead of lingering if the benchmark is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	d := &daemonProc{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		d.waitErr = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

// daemonEnv drops what would configure the daemon behind the benchmark's
// back: WARMFLEET_* flags (a user's WARMFLEET_API, say) and AWS settings
// (the test server's come after).
func daemonEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "WARMFLEET_") {
			out = append(out, kv)
		}
	}
	return out
}

func (d *daemonProc) waitAPI(ctx context.Context, client *api.Client) error {
	ctx, cancel := context.WithTimeout(ctx, daemonStartTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := client.Node(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("daemon API did not come up: %w", err)
		case <-d.exited:
			return fmt.Errorf("daemon exited at start: %v", d.waitErr)
		case <-tick.C:
		}
	}
}

func (d *daemonProc) cpu() (time.Duration, error) {
	c, err := procstat.CPU(d.cmd.Process.Pid)
	if err != nil {
		return 0, fmt.Errorf("daemon stat: %w", err)
	}
	return c, nil
}

func (d *daemonProc) peakRSS() (int64, error) {
	n, err := procstat.PeakRSS(d.cmd.Process.Pid)
	if err != nil {
		return 0, fmt.Errorf("daemon status: %w", err)
	}
	return n, nil
}

// stop sends SIGTERM and waits; a daemon that does not exit in time is
// killed and reported.
func (d *daemonProc) stop() error {
	select {
	case <-d.exited:
		return fmt.Errorf("daemon had exited: %v", d.waitErr)
	default:
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop daemon: %w", err)
	}
	t := time.NewTimer(daemonStopTimeout)
	defer t.Stop()
	select {
	case <-d.exited:
		if d.waitErr != nil {
			return fmt.Errorf("daemon exit: %w", d.waitErr)
		}
		return nil
	case <-t.C:
		_ = d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("daemon did not exit within %v of SIGTERM; killed", daemonStopTimeout)
	}
}

// tail returns the last n bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(0, st.Size()-n)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil {
		return err.Error()
	}
	return string(b)
}
