// Package s3bench measures how fast a model's weights get from S3 onto
// local disk, against baselines measured in the same run: the warmfleet
// daemon as a user runs it (a child process, timed from `cache add` to
// ready), the s3origin library alone, PlainCopy (the parallel ranged-GET
// copy users write with the SDK) and `rclone copy`. It starts a real S3
// server (versitygw) on loopback, uploads a synthetic safetensors model,
// downloads it several times with each method, checks every byte of every
// copy, and reports the median, the range, CPU time and peak RSS of each.
// Optionally it also compares reading the daemon's cached files with
// reading a dd copy of the same bytes (the cache layout must not cost read
// speed).
package s3bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/internal/procstat"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/spec"
)

// Methods a benchmark can run.
const (
	// MethodDaemon runs `warmfleet daemon` as a child process and times
	// `cache add --wait`: what a user runs.
	MethodDaemon   = "daemon"
	MethodS3Origin = "s3origin"
	MethodPlain    = "plain"
	MethodRclone   = "rclone"
)

// AllMethods lists every method in the default order.
func AllMethods() []string {
	return []string{MethodDaemon, MethodPlain, MethodRclone, MethodS3Origin}
}

// Config describes a benchmark.
type Config struct {
	// Dir holds the S3 server's data and the downloads (needs about 3x
	// Size free, 4x with ReadBack), all removed at the end; daemon.log,
	// the daemon method's output, stays. Required.
	Dir string
	// Size is the model's tensor bytes (default 2 GiB) in Shards files
	// (default 4).
	Size   int64
	Shards int
	// Runs per method (default 3); the report gives the median.
	Runs int
	// Concurrency and PartSize for s3origin, PlainCopy and the daemon
	// (defaults 8 and 16 MiB, the daemon's own defaults).
	Concurrency int
	PartSize    int64
	// Methods to run (default AllMethods). rclone is skipped with a note
	// when not installed.
	Methods []string
	// DaemonBin is the warmfleet binary the daemon method runs (the CLI
	// passes its own executable). Required for MethodDaemon.
	DaemonBin string
	// DaemonArgs are extra flags for `warmfleet daemon`, after the
	// benchmark's own (so they win).
	DaemonArgs []string
	// ReadBack, with MethodDaemon, also measures reading the daemon's
	// cached files against a copy of the same bytes written by dd. The
	// page cache is dropped before every read (root only; otherwise the
	// figures are warm-cache and the report says so) unless KeepPageCache.
	ReadBack      bool
	KeepPageCache bool
	// ReadRuns is how many times each copy is read per reader (default 5:
	// reads are short, so noise needs more of them).
	ReadRuns int
	// Pause before each run after deleting the previous output: page
	// cache freed just before is slow to write into on ballooned VMs.
	// Default 1s; negative means none.
	Pause  time.Duration
	Logger *slog.Logger
}

// Sample is one timed run.
type Sample struct {
	Duration time.Duration
	// PeakRSS of the process doing the download, in bytes (for in-process
	// methods the benchmark process itself, with its peak reset first).
	PeakRSS int64
	// CPU is user+system time the downloading process spent.
	CPU time.Duration
	// Sync is how long a sync(2) right after the run took: the bytes the
	// method left dirty in the page cache. The daemon fsyncs before it
	// reports ready, the others do not; Duration+Sync compares durable
	// copies, and the sync keeps one run's writeback out of the next.
	Sync time.Duration
	// S3Bytes is what the daemon counted in warmfleet_s3_bytes_total
	// (daemon method only): more than the model means bytes fetched twice.
	S3Bytes int64
}

// Result sums up one method.
type Result struct {
	Method  string
	Command string // how it was run, for the report
	Samples []Sample
	Note    string // why it was skipped, if it was
}

// Median is the middle run.
func (r Result) Median() time.Duration { return quantile(r.Samples, 0.5) }

// Min is the fastest run.
func (r Result) Min() time.Duration { return quantile(r.Samples, 0) }

// Max is the slowest run.
func (r Result) Max() time.Duration { return quantile(r.Samples, 1) }

// MedianCPU is the median CPU time over the runs.
func (r Result) MedianCPU() time.Duration {
	cpu := make([]Sample, len(r.Samples))
	for i, s := range r.Samples {
		cpu[i] = Sample{Duration: s.CPU}
	}
	return quantile(cpu, 0.5)
}

// MedianDurable is the median of Duration+Sync: time to a copy on disk.
func (r Result) MedianDurable() time.Duration {
	d := make([]Sample, len(r.Samples))
	for i, s := range r.Samples {
		d[i] = Sample{Duration: s.Duration + s.Sync}
	}
	return quantile(d, 0.5)
}

// MedianSync is the median time of the sync after each run.
func (r Result) MedianSync() time.Duration {
	d := make([]Sample, len(r.Samples))
	for i, s := range r.Samples {
		d[i] = Sample{Duration: s.Sync}
	}
	return quantile(d, 0.5)
}

// MaxRSS is the largest peak RSS over the runs.
func (r Result) MaxRSS() int64 {
	var m int64
	for _, s := range r.Samples {
		m = max(m, s.PeakRSS)
	}
	return m
}

// quantile returns the q-quantile (0, 0.5 or 1 in practice) of the
// durations: the lower middle for an even count, so it is always a
// measured value.
func quantile(samples []Sample, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	d := make([]time.Duration, len(samples))
	for i, s := range samples {
		d[i] = s.Duration
	}
	slices.Sort(d)
	return d[int(q*float64(len(d)-1))]
}

// speedup is how many times faster than base a result's median is (base
// median / median); 0 when either has no samples.
func speedup(res, base Result) float64 {
	if len(res.Samples) == 0 || len(base.Samples) == 0 || res.Median() <= 0 {
		return 0
	}
	return base.Median().Seconds() / res.Median().Seconds()
}

// Report is a benchmark's outcome.
type Report struct {
	Bytes   int64 // downloaded per run
	Files   int
	Config  Config
	Results []Result
	// Verify is s3origin.Verify alone over the downloaded files (part of
	// every s3origin run), to show what the end-to-end check costs.
	Verify       Result
	VerifyMethod string
	// ReadBack compares reading the daemon's cache with a dd copy (nil
	// unless asked for and the daemon ran).
	ReadBack *ReadBack
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute
	// averages when the benchmark started and ended: other work on the
	// machine skews every figure.
	LoadStart, LoadEnd string
	CPUs               int
}

// Result returns the named method's result.
func (r *Report) Result(method string) (Result, bool) {
	for _, res := range r.Results {
		if res.Method == method {
			return res, true
		}
	}
	return Result{}, false
}

// Speedup is how many times faster method's median is than baseline's
// (0 if either did not run).
func (r *Report) Speedup(method, baseline string) float64 {
	res, ok := r.Result(method)
	base, okb := r.Result(baseline)
	if !ok || !okb {
		return 0
	}
	return speedup(res, base)
}

func (c Config) withDefaults() (Config, error) {
	if c.Dir == "" {
		return c, errors.New("s3 bench: a work directory is required")
	}
	if c.Size == 0 {
		c.Size = 2 << 30
	}
	if c.Shards == 0 {
		c.Shards = 4
	}
	if c.Runs == 0 {
		c.Runs = 3
	}
	if c.Runs < 1 || c.Runs > 100 {
		return c, fmt.Errorf("s3 bench: %d runs, want 1..100", c.Runs)
	}
	if c.ReadRuns == 0 {
		c.ReadRuns = 5
	}
	if c.ReadRuns < 1 || c.ReadRuns > 100 {
		return c, fmt.Errorf("s3 bench: %d read-back runs, want 1..100", c.ReadRuns)
	}
	if c.Concurrency == 0 {
		c.Concurrency = s3origin.DefaultConcurrency
	}
	if c.PartSize == 0 {
		c.PartSize = s3origin.DefaultPartSize
	}
	if c.Concurrency < 1 || c.PartSize < 1 {
		return c, fmt.Errorf("s3 bench: concurrency %d and part size %d must be positive", c.Concurrency, c.PartSize)
	}
	if len(c.Methods) == 0 {
		c.Methods = AllMethods()
	}
	seen := map[string]bool{}
	for _, m := range c.Methods {
		if !slices.Contains(AllMethods(), m) {
			return c, fmt.Errorf("s3 bench: unknown method %q (want some of %s)", m, strings.Join(AllMethods(), ", "))
		}
		if seen[m] {
			return c, fmt.Errorf("s3 bench: method %q given twice", m)
		}
		seen[m] = true
	}
	if seen[MethodDaemon] && c.DaemonBin == "" {
		return c, errors.New("s3 bench: the daemon method needs the warmfleet binary (DaemonBin)")
	}
	if c.Pause == 0 {
		c.Pause = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c, nil
}

// spaceNeeded is what the benchmark writes at most at once: the S3
// server's copy, one method's output, the daemon's cache kept for the
// read-back and its dd copy, plus slack for headers and metadata.
func spaceNeeded(c Config) int64 {
	copies := int64(2)
	if slices.Contains(c.Methods, MethodDaemon) {
		copies++
		if c.ReadBack {
			copies++
		}
	}
	return copies*c.Size + 64<<20
}

const (
	bucket = "bench"
	prefix = "model/"
)

// Run performs the benchmark.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	if err := checkSpace(cfg.Dir, spaceNeeded(cfg)); err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	rep := &Report{Config: cfg, LoadStart: loadAvg(), CPUs: runtime.NumCPU()}
	s3Dir := filepath.Join(cfg.Dir, "s3")
	s3, stop, err := testenv.StartS3Process(ctx, s3Dir, "")
	if err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	defer func() { _ = stop(); _ = os.RemoveAll(s3Dir) }()
	if err := s3.MakeBucket(ctx, bucket); err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	model, err := synthmodel.New(synthmodel.Options{Seed: 1, Size: cfg.Size, Shards: cfg.Shards})
	if err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	cfg.Logger.Info("uploading synthetic model", "bytes", model.TotalSize(), "files", len(model.Files()), "endpoint", s3.Endpoint)
	err = model.Upload(ctx, func(ctx context.Context, key string, r io.Reader, size int64) error {
		return s3.Put(ctx, bucket, prefix+key, r, size)
	})
	if err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	// The upload's writeback must not land in the first run.
	unix.Sync()

	origin, err := s3origin.New(ctx, s3origin.Options{
		Endpoint:    s3.Endpoint,
		Credentials: credentials.NewStaticCredentialsProvider(s3.AccessKey, s3.SecretKey, ""),
		Concurrency: cfg.Concurrency,
		PartSize:    cfg.PartSize,
		Logger:      cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	objs, err := origin.List(ctx, spec.S3URL{Bucket: bucket, Prefix: prefix})
	if err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	rep.Files = len(objs)
	for _, o := range objs {
		rep.Bytes += o.Size
	}

	out := filepath.Join(cfg.Dir, "out")
	daemonDir := filepath.Join(cfg.Dir, "daemon")
	defer func() { _ = os.RemoveAll(out); _ = os.RemoveAll(daemonDir) }()
	var cachedPath string
	results := map[string]*Result{}
	for _, m := range cfg.Methods {
		results[m] = &Result{Method: m}
	}
	rclone, rcloneErr := exec.LookPath("rclone")
	if r := results[MethodRclone]; r != nil && rcloneErr != nil {
		r.Note = "rclone not installed: " + rcloneErr.Error()
	}
	verify := Result{Method: "s3origin verify only"}
	for run := range cfg.Runs {
		// Rotate the order each run so no method always follows the same
		// one (page cache and memory balloon effects carry over).
		order := append(slices.Clone(cfg.Methods[run%len(cfg.Methods):]), cfg.Methods[:run%len(cfg.Methods)]...)
		for _, m := range order {
			res := results[m]
			if res.Note != "" {
				continue
			}
			if err := os.RemoveAll(out); err != nil {
				return nil, err
			}
			// Each run follows the deletion of one previous copy, except that
			// the daemon's last cache stays for the read-back.
			if m == MethodDaemon || run < cfg.Runs-1 {
				if err := os.RemoveAll(daemonDir); err != nil {
					return nil, err
				}
			}
			if cfg.Pause > 0 {
				time.Sleep(cfg.Pause)
			}
			var sample Sample
			dir := out
			switch m {
			case MethodDaemon:
				res.Command = fmt.Sprintf("%s daemon (child process, defaults but --s3-concurrency %d --part-size %dMiB%s), "+
					"timed from the API's cache add to ready (polled every %v), verify and fsync included",
					cfg.DaemonBin, cfg.Concurrency, cfg.PartSize>>20, strings.TrimSuffix(" "+strings.Join(cfg.DaemonArgs, " "), " "), pollEvery)
				sample, dir, err = runDaemon(ctx, cfg, s3, daemonDir, rep.Bytes)
				cachedPath = dir
			case MethodS3Origin:
				res.Command = fmt.Sprintf("s3origin.Download, %d files one after another, concurrency %d, parts of %d MiB, verify included, no fsync", len(objs), cfg.Concurrency, cfg.PartSize>>20)
				sample, err = inProcess(func() error { return downloadAll(ctx, origin, objs, out) })
			case MethodPlain:
				res.Command = fmt.Sprintf("s3origin.PlainCopy, %d files one after another, concurrency %d, parts of %d MiB, no verify, no fsync", len(objs), cfg.Concurrency, cfg.PartSize>>20)
				client := s3.NewClient()
				sample, err = inProcess(func() error {
					for _, o := range objs {
						if err := os.MkdirAll(filepath.Dir(filepath.Join(out, o.Path)), 0o755); err != nil {
							return err
						}
						if err := s3origin.PlainCopy(ctx, client, bucket, o.Key, filepath.Join(out, o.Path), cfg.Concurrency, cfg.PartSize); err != nil {
							return err
						}
					}
					return nil
				})
			case MethodRclone:
				args := []string{"copy", "--config", os.DevNull, "bench:" + bucket + "/" + strings.TrimSuffix(prefix, "/"), out}
				res.Command = "rclone " + strings.Join(args, " ") + " (defaults: 4 transfers, 4 streams per file, MD5 check, no fsync)"
				sample, err = runRclone(ctx, rclone, args, s3)
			}
			if err != nil {
				return nil, fmt.Errorf("s3 bench: %s run %d: %w", m, run+1, err)
			}
			syncStart := time.Now()
			unix.Sync()
			sample.Sync = time.Since(syncStart)
			// Outside the timing: a method that wrote wrong bytes fast
			// must not win.
			if err := checkContent(ctx, dir, model); err != nil {
				return nil, fmt.Errorf("s3 bench: %s run %d: %w", m, run+1, err)
			}
			cfg.Logger.Info("bench run", "method", m, "run", run+1, "seconds", sample.Duration.Seconds(),
				"MBps", mbps(rep.Bytes, sample.Duration), "peak_rss_MiB", sample.PeakRSS>>20, "cpu_seconds", sample.CPU.Seconds(), "sync_seconds", sample.Sync.Seconds())
			res.Samples = append(res.Samples, sample)

			if m == MethodS3Origin {
				var method string
				vs, err := inProcess(func() error {
					for _, o := range objs {
						v, err := verifyFile(ctx, origin, o, filepath.Join(out, o.Path))
						if err != nil {
							return err
						}
						method = v.Method
					}
					return nil
				})
				if err != nil {
					return nil, fmt.Errorf("s3 bench: verify: %w", err)
				}
				verify.Samples = append(verify.Samples, vs)
				verify.Command = "s3origin.Verify of the downloaded files (" + method + ")"
				rep.VerifyMethod = method
			}
		}
	}
	_ = os.RemoveAll(out)
	for _, m := range cfg.Methods {
		rep.Results = append(rep.Results, *results[m])
	}
	rep.Verify = verify
	if cfg.ReadBack && cachedPath != "" {
		rb, err := readBack(ctx, cfg, cachedPath, filepath.Join(cfg.Dir, "dd"), objs)
		if err != nil {
			return nil, fmt.Errorf("s3 bench: read-back: %w", err)
		}
		rep.ReadBack = rb
	}
	rep.LoadEnd = loadAvg()
	return rep, nil
}

// checkContent compares every file of the model with what dir holds.
func checkContent(ctx context.Context, dir string, model *synthmodel.Model) error {
	want := make([]byte, 4<<20)
	got := make([]byte, len(want))
	for _, f := range model.Files() {
		if err := checkFile(ctx, filepath.Join(dir, f.Name), f, want, got); err != nil {
			return err
		}
	}
	return nil
}

func checkFile(ctx context.Context, path string, f synthmodel.File, want, got []byte) error {
	local, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("check content: %w", err)
	}
	defer local.Close()
	st, err := local.Stat()
	if err != nil {
		return fmt.Errorf("check content: %w", err)
	}
	if st.Size() != f.Size {
		return fmt.Errorf("check content: %s: %d bytes, want %d", path, st.Size(), f.Size)
	}
	src := f.Open()
	for off := int64(0); off < f.Size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int(min(int64(len(want)), f.Size-off))
		if _, err := io.ReadFull(src, want[:n]); err != nil {
			return fmt.Errorf("check content: generate %s: %w", f.Name, err)
		}
		if _, err := io.ReadFull(local, got[:n]); err != nil {
			return fmt.Errorf("check content: read %s: %w", path, err)
		}
		if !bytes.Equal(want[:n], got[:n]) {
			return fmt.Errorf("check content: %s differs from the source within bytes %d..%d", path, off, off+int64(n)-1)
		}
		off += int64(n)
	}
	return nil
}

func checkSpace(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("free space in %s: %w", dir, err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return fmt.Errorf("%s has %d MiB free, the benchmark needs about %d MiB: use a smaller size or another directory", dir, free>>20, need>>20)
	}
	return nil
}

func downloadAll(ctx context.Context, c *s3origin.Client, objs []s3origin.Object, dir string) error {
	for _, o := range objs {
		path := filepath.Join(dir, o.Path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = c.Download(ctx, o, f, s3origin.Plan{})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func verifyFile(ctx context.Context, c *s3origin.Client, o s3origin.Object, path string) (s3origin.Verification, error) {
	f, err := os.Open(path)
	if err != nil {
		return s3origin.Verification{}, err
	}
	defer f.Close()
	return c.Verify(ctx, o, f)
}

// inProcess times fn and measures this process's peak RSS while it runs,
// after returning freed heap to the OS and resetting the kernel's
// high-water mark (writing 5 to /proc/self/clear_refs).
func inProcess(fn func() error) (Sample, error) {
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return Sample{}, fmt.Errorf("reset peak RSS: %w", err)
	}
	cpu0 := selfCPU()
	start := time.Now()
	err := fn()
	d := time.Since(start)
	rss, rerr := procstat.PeakRSS(0)
	return Sample{Duration: d, PeakRSS: rss, CPU: selfCPU() - cpu0}, errors.Join(err, rerr)
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func runRclone(ctx context.Context, bin string, args []string, s3 *testenv.S3) (Sample, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	// rclone's AWS SDK v1 cannot combine AWS_CA_BUNDLE with its own
	// transport and refuses to start; the endpoint is plain HTTP anyway.
	cmd.Env = append(withoutAWS(os.Environ()),
		"RCLONE_CONFIG_BENCH_TYPE=s3",
		"RCLONE_CONFIG_BENCH_PROVIDER=Other",
		"RCLONE_CONFIG_BENCH_ENDPOINT="+s3.Endpoint,
		"RCLONE_CONFIG_BENCH_ACCESS_KEY_ID="+s3.AccessKey,
		"RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY="+s3.SecretKey,
		"RCLONE_CONFIG_BENCH_REGION="+s3.Region,
		"RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE=true",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return Sample{}, fmt.Errorf("rclone: %w: %s", err, stderr.String())
	}
	s := Sample{Duration: time.Since(start), CPU: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		s.PeakRSS = ru.Maxrss << 10 // kB on Linux
	}
	return s, nil
}

func withoutAWS(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "AWS_") })
}

func mbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e6
}
