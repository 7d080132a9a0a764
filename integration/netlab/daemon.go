package netlab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	daemonapi "github.com/warmfleet/warmfleet/daemon/api"
)

// DaemonSpec says how to run the warmfleet daemon on a host.
type DaemonSpec struct {
	// Bin is the warmfleet binary.
	Bin string
	// Args are extra `warmfleet daemon` flags.
	Args []string
	// Env is the daemon's extra environment, e.g. S3Host.Env().
	Env []string
}

// Daemon is a warmfleet daemon on a host, with its API on a unix socket the
// harness reaches without entering the namespace.
type Daemon struct {
	*Process
	Bin string
	// API is the --api address the daemon and its clients use.
	API    string
	client *daemonapi.Client
}

// StartDaemon runs `warmfleet daemon` inside the host with the host's data
// directory, node name and a unix-socket API, and waits until the API
// answers. Process hooks (Kill, Restart, Stats, Log) work on the result.
func (h *Host) StartDaemon(ctx context.Context, spec DaemonSpec) (*Daemon, error) {
	if spec.Bin == "" {
		return nil, errors.New("start daemon: no warmfleet binary given")
	}
	api := "unix://" + filepath.Join(h.lab.RunDir(), h.Name+".sock")
	args := append([]string{"daemon", "--node-name", h.Name, "--data-dir", h.DataDir, "--api", api}, spec.Args...)
	p, err := h.Start(ProcSpec{Name: "warmfleet", Path: spec.Bin, Args: args, Env: spec.Env})
	if err != nil {
		return nil, err
	}
	d, err := AttachDaemon(p, spec.Bin, api)
	if err != nil {
		return nil, err
	}
	if err := d.WaitAPI(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// AttachDaemon returns the handle on a daemon that p runs with its own
// arguments (a chart's, say) and --api api, a unix:// socket, without
// waiting for the API. bin is the warmfleet binary CLI runs.
func AttachDaemon(p *Process, bin, api string) (*Daemon, error) {
	if !strings.HasPrefix(api, "unix://") {
		return nil, fmt.Errorf("attach daemon on %s: API %q is not a unix:// socket", p.host.Name, api)
	}
	client, err := daemonapi.NewClient(api, "")
	if err != nil {
		return nil, fmt.Errorf("attach daemon on %s: %w", p.host.Name, err)
	}
	return &Daemon{Process: p, Bin: bin, API: api, client: client}, nil
}

// WaitAPI waits until the daemon's API answers /healthz, e.g. after Restart.
func (d *Daemon) WaitAPI(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		err := d.client.Health(ctx)
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-d.Done():
			return fmt.Errorf("daemon on %s exited before its API answered: %w; log:\n%s", d.host.Name, d.Wait(), tail(d.Log(), 4<<10))
		case <-ctx.Done():
			return fmt.Errorf("daemon on %s: API not answering: %w (last error: %v); log:\n%s", d.host.Name, ctx.Err(), last, tail(d.Log(), 4<<10))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Restart stops the daemon (SIGTERM, SIGKILL after timeout), starts it again
// with the same flags and data directory, and waits for its API.
func (d *Daemon) Restart(ctx context.Context, timeout time.Duration) error {
	if err := d.Process.Restart(timeout); err != nil {
		return err
	}
	return d.WaitAPI(ctx)
}

// CLI runs `warmfleet ARGS... --api API` inside the daemon's host and
// returns its stdout; a failure carries its stderr.
func (d *Daemon) CLI(ctx context.Context, args ...string) ([]byte, error) {
	cmd := d.host.Command(ctx, d.Bin, append(args, "--api", d.API)...)
	cmd.Env = baseEnv(os.Environ())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("warmfleet %s on %s: %w: %s", strings.Join(args, " "), d.host.Name, err, tail(stderr.String(), 4<<10))
	}
	return stdout.Bytes(), nil
}

// CacheStatus is the part of `warmfleet cache status -o json` the harness
// reads.
type CacheStatus struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	Ready      bool   `json:"ready"`
	Path       string `json:"path"`
	BytesDone  int64  `json:"bytes_done"`
	BytesTotal int64  `json:"bytes_total"`
	Error      string `json:"error"`
	// Commit is the Hub commit an hf:// cache was read at.
	Commit string `json:"commit"`
	// UpdatedAt is the daemon's clock at the cache's last change.
	UpdatedAt time.Time `json:"updated_at"`
}

// CacheAdd runs `warmfleet cache add NAME --source SOURCE --wait -o json`
// (plus extra flags) in the host and returns the final status.
func (d *Daemon) CacheAdd(ctx context.Context, name, source string, extra ...string) (CacheStatus, error) {
	out, err := d.CLI(ctx, append([]string{"cache", "add", name, "--source", source, "--wait", "-o", "json"}, extra...)...)
	if err != nil {
		return CacheStatus{}, err
	}
	return parseCacheStatus(out)
}

// CacheStatus runs `warmfleet cache status NAME -o json` in the host.
func (d *Daemon) CacheStatus(ctx context.Context, name string) (CacheStatus, error) {
	out, err := d.CLI(ctx, "cache", "status", name, "-o", "json")
	if err != nil {
		return CacheStatus{}, err
	}
	return parseCacheStatus(out)
}

func parseCacheStatus(out []byte) (CacheStatus, error) {
	var st CacheStatus
	if err := json.Unmarshal(out, &st); err != nil {
		return CacheStatus{}, fmt.Errorf("parse cache status %q: %w", tail(string(out), 512), err)
	}
	return st, nil
}

// Metrics fetches the daemon's /metrics text.
func (d *Daemon) Metrics(ctx context.Context) (string, error) {
	text, err := d.client.Metrics(ctx)
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", d.host.Name, err)
	}
	return text, nil
}

// Metric returns the sum of a metric over all its label sets, and whether
// the daemon exports it at all.
func (d *Daemon) Metric(ctx context.Context, name string) (float64, bool, error) {
	text, err := d.Metrics(ctx)
	if err != nil {
		return 0, false, err
	}
	return MetricSum(text, name)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
