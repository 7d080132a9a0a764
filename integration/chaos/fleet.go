package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// Fleet is what a scenario works with: its lab, the daemons it started,
// and the desired-state entries the shared checks hold it to.
type Fleet struct {
	Lab *netlab.Lab
	// Bin is the daemon binary; Key the cluster key file every member
	// shares.
	Bin, Key string
	// LabBin is the warmfleet-lab binary, for daemons that need its test
	// hooks (StartSkewed); empty when the run has none.
	LabBin string
	Log    *slog.Logger
	// Long asks for the long variant of the scenario (Options.Long).
	Long bool

	figures map[string]float64

	daemons []*netlab.Daemon
	// outsiders are daemons that are not members (another cluster key):
	// the shared checks hold them to nothing but stopping with the lab.
	outsiders []*netlab.Daemon
	// desired maps each cache name added to the revisions its ready
	// directory may hold (one of them, whole).
	desired map[string][]netlab.Model
}

// Figure records one of the scenario's figures for the report.
func (f *Fleet) Figure(name string, v float64) { f.figures[name] = v }

// seedHost is the fleet's gossip seed: the first host.
func (f *Fleet) seedHost() *netlab.Host { return f.Lab.Hosts()[0] }

// Start runs a swarm daemon on h joining the fleet; p2p replaces the
// default --p2p flag when given, extra flags follow.
func (f *Fleet) Start(ctx context.Context, h *netlab.Host, p2p []string, extra ...string) (*netlab.Daemon, error) {
	return f.start(ctx, h, netlab.DaemonSpec{Bin: f.Bin, Env: f.Lab.S3().Env(), Args: append(netlab.SwarmArgs(h, f.seedHost(), f.Key, p2p...), extra...)})
}

// clockSkewEnv is the lab binary's hook that skews its daemon's wall clock
// (internal/lab.ClockSkewEnv; the lab imports this package, so the name is
// repeated here).
const clockSkewEnv = "WARMFLEET_LAB_CLOCK_SKEW"

// StartSkewed runs the lab binary's swarm daemon on h joining the fleet,
// with its wall clock skew off the host's: network namespaces share one
// clock, so the skew is made inside the process.
func (f *Fleet) StartSkewed(ctx context.Context, h *netlab.Host, skew time.Duration) (*netlab.Daemon, error) {
	if f.LabBin == "" {
		return nil, errors.New("no warmfleet-lab binary (Options.LabBin): only its daemon can run with a skewed clock")
	}
	env := append(f.Lab.S3().Env(), clockSkewEnv+"="+skew.String())
	return f.start(ctx, h, netlab.DaemonSpec{Bin: f.LabBin, Env: env, Args: netlab.SwarmArgs(h, f.seedHost(), f.Key)})
}

func (f *Fleet) start(ctx context.Context, h *netlab.Host, spec netlab.DaemonSpec) (*netlab.Daemon, error) {
	d, err := h.StartDaemon(ctx, spec)
	if err != nil {
		return nil, err
	}
	f.daemons = append(f.daemons, d)
	return d, nil
}

// StartFleet runs a swarm daemon on each of the first n hosts and waits
// until the first sees all n alive.
func (f *Fleet) StartFleet(ctx context.Context, n int) ([]*netlab.Daemon, error) {
	var ds []*netlab.Daemon
	for _, h := range f.Lab.Hosts()[:n] {
		d, err := f.Start(ctx, h, nil)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, ds[0].WaitMembers(ctx, n)
}

// Seed puts a model of files pseudo-random files (from seed) totalling
// size bytes under prefix in bucket "models".
func (f *Fleet) Seed(ctx context.Context, prefix string, files int, size int64, seed uint64) (netlab.Model, error) {
	return f.Lab.S3().SeedModel(ctx, "models", prefix, files, size, seed)
}

// Cold seeds a model of files files totalling size bytes (from seed) under
// name/, starts a fleet on the first hosts hosts and adds it as cache name,
// without waiting for it.
func (f *Fleet) Cold(ctx context.Context, name string, hosts, files int, size int64, seed uint64) (netlab.Model, []*netlab.Daemon, error) {
	model, err := f.Seed(ctx, name+"/", files, size, seed)
	if err != nil {
		return netlab.Model{}, nil, err
	}
	ds, err := f.StartFleet(ctx, hosts)
	if err != nil {
		return netlab.Model{}, nil, err
	}
	return model, ds, f.Add(ctx, ds[0], name, model)
}

// Warm is Cold, then waits until the fleet has the model ready.
func (f *Fleet) Warm(ctx context.Context, name string, hosts, files int, size int64, seed uint64) (netlab.Model, []*netlab.Daemon, error) {
	model, ds, err := f.Cold(ctx, name, hosts, files, size, seed)
	if err != nil {
		return model, ds, err
	}
	return model, ds, f.WaitReady(ctx, name, model, ds...)
}

// Add adds cache name with m's source through d, without waiting, and
// holds the fleet to it: the shared checks count it lost on any running
// daemon that no longer knows it. More revisions may be allowed.
func (f *Fleet) Add(ctx context.Context, d *netlab.Daemon, name string, m netlab.Model, alsoAllowed ...netlab.Model) error {
	if _, err := d.CLI(ctx, "cache", "add", name, "--source", m.Source()); err != nil {
		return err
	}
	f.desired[name] = append([]netlab.Model{m}, alsoAllowed...)
	return nil
}

// WaitReady waits until every one of ds has name ready with m's bytes.
func (f *Fleet) WaitReady(ctx context.Context, name string, m netlab.Model, ds ...*netlab.Daemon) error {
	for _, d := range ds {
		if err := d.WaitReady(ctx, name, m); err != nil {
			return err
		}
	}
	return nil
}

// Sum adds up metric over ds.
func (f *Fleet) Sum(ctx context.Context, metric string, ds ...*netlab.Daemon) (float64, error) {
	var sum float64
	for _, d := range ds {
		v, err := d.MetricValue(ctx, metric)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// Metric names the scenarios read.
const (
	metricS3       = "warmfleet_s3_bytes_total"
	metricPeerIn   = `warmfleet_peer_bytes_total{direction="in"}`
	metricVerified = `warmfleet_pieces_total{result="verified"}`
	metricFailed   = `warmfleet_pieces_total{result="failed"}`
	metricBanned   = "warmfleet_peers_banned_total"
	metricAuthFail = "warmfleet_peer_auth_failures_total"
)

// checkReady is the shared check of ready files and desired entries on
// every daemon still running.
func (f *Fleet) checkReady(ctx context.Context, res *ScenarioResult) error {
	var errs []error
	for _, d := range f.daemons {
		if !d.Running() {
			continue
		}
		for name, revs := range f.desired {
			st, err := d.CacheStatus(ctx, name)
			if err != nil {
				res.LostEntries++
				errs = append(errs, fmt.Errorf("%s lost %s: %w", d.Host().Name, name, err))
				continue
			}
			if !st.Ready {
				continue
			}
			ok, bad, err := checkDir(st.Path, revs)
			res.FilesVerified += ok
			res.CorruptReady += bad
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s ready: %w", d.Host().Name, name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkDir checks a ready directory against the revisions it may hold: it
// must hold exactly one of them, every file with its size and SHA-256, and
// nothing else. It returns the files that matched and the bad ones (of the
// revision it came closest to).
func checkDir(dir string, revs []netlab.Model) (ok, bad int, err error) {
	sums := map[string]string{}
	werr := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		sum, err := fileSHA256(path)
		if err != nil {
			return err
		}
		sums[filepath.ToSlash(rel)] = sum
		return nil
	})
	if werr != nil {
		return 0, 1, fmt.Errorf("read %s: %w", dir, werr)
	}
	bad = -1
	var worst error
	for _, m := range revs {
		good, wrong := 0, 0
		var first error
		for _, mf := range m.Files {
			switch got, found := sums[mf.Name]; {
			case !found:
				wrong++
				first = cmpOr(first, fmt.Errorf("%s missing", mf.Name))
			case got != mf.SHA256:
				wrong++
				first = cmpOr(first, fmt.Errorf("%s has sha256 %s, want %s", mf.Name, got, mf.SHA256))
			default:
				good++
			}
		}
		if extra := len(sums) - (len(m.Files) - missing(m, sums)); extra > 0 {
			wrong += extra
			first = cmpOr(first, fmt.Errorf("%d files that are not in the source", extra))
		}
		if wrong == 0 {
			return good, 0, nil
		}
		if bad < 0 || wrong < bad {
			ok, bad, worst = good, wrong, first
		}
	}
	return ok, bad, worst
}

// missing counts m's files absent from sums.
func missing(m netlab.Model, sums map[string]string) int {
	n := 0
	for _, mf := range m.Files {
		if _, ok := sums[mf.Name]; !ok {
			n++
		}
	}
	return n
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func fileSHA256(path string) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// closeAndCheck closes the lab and checks that it left no daemon running
// and no network namespace behind.
func (f *Fleet) closeAndCheck() error {
	errs := []error{f.Lab.Close()}
	for _, d := range append(f.daemons, f.outsiders...) {
		if d.Running() {
			errs = append(errs, fmt.Errorf("daemon on %s (pid %d) still runs after the lab closed", d.Host().Name, d.PID()))
		}
	}
	for _, ns := range f.Lab.Namespaces() {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("network namespace %s left behind", ns))
		}
	}
	return errors.Join(errs...)
}
