package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// DefaultCuts is the number of cuts in model warm-ups a run makes unless
// told otherwise; DefaultImageCuts the number in image pulls.
const (
	DefaultCuts      = 2
	DefaultImageCuts = 2
)

// Tools are the host programs a run needs.
type Tools struct {
	Qemu, Mkfs, Fsck, Busybox string
	Kernel                    Kernel
}

// FindTools finds qemu, mkfs.ext4, e2fsck, a static busybox and a kernel
// with its modules; the error names the Debian package that brings what is
// missing.
func FindTools() (Tools, error) {
	var tl Tools
	var err error
	if tl.Qemu, err = testenv.ToolPath("qemu-system-x86_64", "Debian package qemu-system-x86"); err != nil {
		return tl, err
	}
	if tl.Mkfs, err = testenv.ToolPath("mkfs.ext4", "Debian package e2fsprogs"); err != nil {
		return tl, err
	}
	if tl.Fsck, err = testenv.ToolPath("e2fsck", "Debian package e2fsprogs"); err != nil {
		return tl, err
	}
	if tl.Busybox, err = testenv.ToolPath("busybox", "Debian package busybox-static"); err != nil {
		return tl, err
	}
	if static, err := IsStatic(tl.Busybox); err != nil || !static {
		return tl, fmt.Errorf("%s is not a static binary (%v): install Debian package busybox-static", tl.Busybox, err)
	}
	if tl.Kernel, err = FindKernel("/"); err != nil {
		return tl, err
	}
	return tl, nil
}

// PowerCutOptions say how to run power cuts (RunPowerCuts).
type PowerCutOptions struct {
	Tools Tools
	// Daemon is a static binary with warmfleet's daemon command (warmfleet
	// or warmfleet-lab). Agent is a static binary that runs the guest
	// agent (integration/vm/agent) when given AgentArgs and --listen:
	// guestagent, or warmfleet-lab with AgentArgs vm-agent; empty: Daemon.
	Daemon, Agent string
	AgentArgs     []string
	// S3 is the server the models come from (the guest reaches it on the
	// host's loopback); RunPowerCuts makes its bucket.
	S3 S3
	// Dir holds the images and sockets; it must exist.
	Dir string
	// Cuts is the number of power cuts; Seed makes their points, crash
	// modes and models: a run with the same seed cuts at the same places.
	Cuts int
	Seed uint64
	// ImageCuts, after the model cuts, makes that many cuts in image
	// pulls: the guest then also runs containerd (the binary Containerd,
	// with the shared libraries ldd lists), its root and state on the
	// data disk, and the daemon pre-pulls, through it, images pushed to
	// Registry, a plain-HTTP registry's host:port on the host's loopback.
	ImageCuts            int
	Registry, Containerd string
	// Logf gets a line per cut and the summary; nil discards.
	Logf func(format string, args ...any)
}

// S3 is the host's S3 server as RunPowerCuts uses it (*testenv.S3 is
// one): a bucket to make, objects to put, and where the guest finds it.
type S3 interface {
	MakeBucket(ctx context.Context, bucket string) error
	Put(ctx context.Context, bucket, key string, body io.Reader, size int64) error
	// Access is the server's host:port and the credentials to use.
	Access() (addr, accessKey, secretKey, region string)
}

// CutCounts are the figures of one kind of cut: in model warm-ups, or in
// image pulls.
type CutCounts struct {
	// Cuts were made; Missed were armed but the model (image) was ready
	// first.
	Cuts, Missed int
	// ReadyAtBoot models (images) were ready right after the reboot;
	// Resumed ones resumed to ready after it. Each passed the check.
	ReadyAtBoot, Resumed int
	// CorruptReady counts checks that found a model reported ready (or
	// its current link) with a missing, short, wrong or extra file, or an
	// image reported ready that containerd does not hold complete; Lost
	// models (image claims) acknowledged before a cut and unknown after
	// it. Both must be 0; Violations says what each was.
	CorruptReady, Lost int
	// Refetched counts image cuts after which the daemon found blobs that
	// containerd recorded but no longer held, and fetched them again (it
	// says so on the console: refetchLogs).
	Refetched int
	// Time is what these cuts took, each from its warm-up's (pull's) start
	// to the end of its recovery.
	Time time.Duration
}

// Recovered counts cuts after which the model was ready and whole.
func (c CutCounts) Recovered() int { return c.ReadyAtBoot + c.Resumed }

// PerCut is the time a cut took, on average.
func (c CutCounts) PerCut() time.Duration {
	if c.Cuts+c.Missed == 0 {
		return 0
	}
	return c.Time / time.Duration(c.Cuts+c.Missed)
}

// PowerCutResult is what a run found.
type PowerCutResult struct {
	Seed uint64
	// CutCounts are the cuts in model warm-ups and publishes.
	CutCounts
	// Images are the cuts in image pulls (PowerCutOptions.ImageCuts);
	// their violations are in Violations too.
	Images     CutCounts
	Violations []string
	// Modes counts the crash modes drawn; LossPending, LossTorn and
	// LossSectors add up what the cuts did to the disks' caches.
	Modes                              map[string]int
	LossPending, LossTorn, LossSectors int
	// Fscks counts the boots whose data disk did not mount until e2fsck
	// repaired it (see bootMachine).
	Fscks int
	Boots []time.Duration
	// Setup is the time to build the guest's images and boot it once to
	// save the state every boot restores, First the first boot
	// and uncut warm-up; the cuts share the rest: Booting, Recovering
	// (the daemon's start, the audit, the resume to ready and its check)
	// and WarmingUp (a new model's warm-up up to its cut).
	Setup, First, Booting, Recovering, WarmingUp time.Duration
	Elapsed                                      time.Duration
}

// Summary is the run's figures on one line.
func (r PowerCutResult) Summary() string {
	boots := slices.Clone(r.Boots)
	slices.Sort(boots)
	median := time.Duration(0)
	if len(boots) > 0 {
		median = boots[len(boots)/2]
	}
	perCut := r.PerCut()
	return fmt.Sprintf("power cuts (seed %d): %d cut (%d missed: ready first), %d ready at reboot, %d resumed to ready, %d corrupt ready, %d entries lost; modes %v; "+
		"%d unflushed writes at the cuts, %d torn, %d sectors lost; %d disks repaired by e2fsck at boot; boot median %v over %d boots; %v in all: %v setting up, %v to boot and warm up without a cut, then %v per cut (in all %v booting, %v recovering, %v warming up to the cuts)",
		r.Seed, r.Cuts, r.Missed, r.ReadyAtBoot, r.Resumed, r.CorruptReady, r.Lost, r.Modes,
		r.LossPending, r.LossTorn, r.LossSectors, r.Fscks, median.Round(100*time.Millisecond), len(r.Boots),
		r.Elapsed.Round(time.Second), r.Setup.Round(time.Second), r.First.Round(time.Second), perCut.Round(100*time.Millisecond),
		r.Booting.Round(time.Second), r.Recovering.Round(time.Second), r.WarmingUp.Round(time.Second)) + r.imageSummary()
}

func (r PowerCutResult) imageSummary() string {
	im := r.Images
	if im.Cuts+im.Missed == 0 {
		return ""
	}
	return fmt.Sprintf("; image pulls: %d cut (%d missed: ready first), %d ready at reboot, %d resumed to ready, %d corrupt ready, %d claims lost, %d with lost blobs fetched again, %v per cut",
		im.Cuts, im.Missed, im.ReadyAtBoot, im.Resumed, im.CorruptReady, im.Lost, im.Refetched, im.PerCut().Round(100*time.Millisecond))
}

// guestDataDir is the daemon's --data-dir in the guest.
const guestDataDir = DataDir + "/warmfleet"

const (
	bucket = "models"
	// publishBurst flushes in a row mark the start of a publish;
	// publishEvents writes and flushes after it, it is done.
	publishBurst  = 3
	publishEvents = 20
)

// run is one RunPowerCuts: its options, the guest's images and what it
// found so far.
type run struct {
	opts                  PowerCutOptions
	dir, initramfs, image string
	toolsImg, token       string
	state                 string // the guest's saved state (saveState)
	res                   PowerCutResult
	logf                  func(format string, args ...any)
	workloads             []workload // what was added so far, to audit
}

// RunPowerCuts boots the guest, warms a first model up without a cut,
// then makes opts.Cuts power cuts at seeded points of later warm-ups and
// publishes, booting the guest again after each on what its disk kept
// (see the package documentation). Violations are counted in the result;
// the error is for a run that could not go on (a boot that failed, a
// model that never became ready).
func RunPowerCuts(ctx context.Context, opts PowerCutOptions) (PowerCutResult, error) {
	start := time.Now()
	r := &run{opts: opts, dir: opts.Dir, logf: opts.Logf}
	r.res = PowerCutResult{Seed: opts.Seed, Modes: map[string]int{}}
	if r.logf == nil {
		r.logf = func(string, ...any) {}
	}
	err := r.setup(ctx)
	r.res.Setup = time.Since(start)
	if err == nil {
		err = r.cuts(ctx)
	}
	r.res.Elapsed = time.Since(start)
	r.logf("%s", r.res.Summary())
	return r.res, err
}

// setup makes the guest's initramfs, tools disk and data disk, and the
// saved state every boot restores.
func (r *run) setup(ctx context.Context) error {
	if err := r.opts.S3.MakeBucket(ctx, bucket); err != nil {
		return fmt.Errorf("power cuts: %w", err)
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return fmt.Errorf("power cuts: %w", err)
	}
	r.token = hex.EncodeToString(tok)
	addr, accessKey, secretKey, region := r.opts.S3.Access()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("power cuts: %w", err)
	}
	env := testenv.AWSEnv("http://"+net.JoinHostPort(HostFromVM, port), accessKey, secretKey, region)
	agentBin, agentCmd := r.opts.Agent, []string{"/opt/guestagent"}
	if agentBin == "" || agentBin == r.opts.Daemon {
		agentBin, agentCmd = "", []string{"/opt/warmfleet"}
	}
	spec := GuestSpec{
		Kernel: r.opts.Tools.Kernel, Busybox: r.opts.Tools.Busybox,
		DaemonArgs: []string{
			"--node-name", "vm", "--data-dir", guestDataDir,
			"--api", fmt.Sprintf("%s:%d", GuestIP, APIPort), "--api-token-file", "/etc/warmfleet-token",
			"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off", "--kubernetes=false",
			"--resync-interval", "0", "--part-size", "1MiB", "--log-level", "info",
		},
		DaemonEnv: env,
		Agent:     append(agentCmd, r.opts.AgentArgs...),
		Files:     map[string][]byte{"etc/warmfleet-token": []byte(r.token + "\n")},
	}
	var extra []string
	if r.opts.ImageCuts > 0 {
		if err := r.withContainerd(ctx, &spec); err != nil {
			return err
		}
		extra = append(extra, r.opts.Containerd)
	}
	r.initramfs = filepath.Join(r.dir, "initramfs.cpio")
	if err := BuildInitramfs(r.initramfs, spec); err != nil {
		return err
	}
	r.toolsImg = filepath.Join(r.dir, "tools.img")
	if err := BuildToolsImage(ctx, r.opts.Tools.Mkfs, r.toolsImg, r.opts.Daemon, agentBin, extra...); err != nil {
		return err
	}
	r.image = filepath.Join(r.dir, "base.img")
	if err := MakeImage(ctx, r.opts.Tools.Mkfs, r.image, 256<<20); err != nil {
		return err
	}
	return r.saveState(ctx)
}

// sourceModel is one model in the host's S3 server, with what its files
// must hold.
type sourceModel struct {
	name   string
	files  map[string]string // path -> SHA-256
	sizes  map[string]int64
	source string
}

// seedModel uploads a model of a few pseudo-random files (from rng).
func (r *run) seedModel(ctx context.Context, name string, rng *mrand.Rand) (sourceModel, error) {
	m := sourceModel{name: name, files: map[string]string{}, sizes: map[string]int64{}, source: "s3://" + bucket + "/" + name + "/"}
	// The same sizes for every model, so that every warm-up takes about
	// as many writes as the first, which places the cuts.
	sizes := map[string]int64{
		"config.json":             700,
		"model-00001.safetensors": 2<<20 + 4321,
		"model-00002.safetensors": 3<<20 - 1234,
		"sub/tokenizer.json":      60 << 10,
	}
	for _, path := range slices.Sorted(maps.Keys(sizes)) {
		size := sizes[path]
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if err := r.opts.S3.Put(ctx, bucket, name+"/"+path, bytes.NewReader(b), size); err != nil {
			return m, fmt.Errorf("power cuts: seed %s: %w", name, err)
		}
		sum := sha256.Sum256(b)
		m.files[path], m.sizes[path] = hex.EncodeToString(sum[:]), size
	}
	return m, nil
}

// violation records what a check found wrong.
func (r *run) violation(format string, args ...any) {
	v := fmt.Sprintf(format, args...)
	r.res.Violations = append(r.res.Violations, v)
	r.logf("VIOLATION: %s", v)
}

// bootMachine boots the guest and counts the boot in the figures. A data
// disk the guest's kernel will not mount is checked with e2fsck -fy and
// booted again, as a node's boot-time fsck does: a KeepSome cut can tear a
// journal block (4 KiB over 512-byte sectors) so that the kernel finds a
// transaction corrupt and refuses the journal. Only unflushed writes
// tear, so no fsync that returned depended on what the repair discards,
// and the audit after the boot still judges what the daemon kept.
func (r *run) bootMachine(ctx context.Context) (*machine, error) {
	t0 := time.Now()
	m, err := r.boot(ctx, 0)
	if err != nil && m != nil && m.vm != nil && m.vm.ConsoleHas(markerMountFailed) {
		console := tail(m.vm.Console(), 600)
		if serr := m.stop(); serr != nil {
			return m, errors.Join(err, serr)
		}
		out, ferr := r.fsck(ctx)
		if ferr != nil {
			return m, fmt.Errorf("%w\nthen: %w", err, ferr)
		}
		r.res.Fscks++
		r.logf("the data disk did not mount (console: %s); e2fsck repaired it: %s", oneLine(console), oneLine(out))
		m, err = r.boot(ctx, 0)
	}
	if len(r.res.Boots) > 0 {
		r.res.Booting += time.Since(t0)
	}
	if m != nil {
		r.res.Boots = append(r.res.Boots, m.booted)
	}
	return m, err
}

// fsck checks and repairs the data disk's image (no machine may be using
// it) and returns e2fsck's report. Exit codes 1 and 2 mean it corrected
// errors; 4 and above that it could not, which a node would not boot from.
func (r *run) fsck(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, r.opts.Tools.Fsck, "-fy", r.image).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() < 4 {
		err = nil
	}
	if err != nil {
		return "", fmt.Errorf("e2fsck -fy %s: %w\n%s", r.image, err, out)
	}
	return string(out), nil
}

// oneLine joins s's lines with " | " for a log line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(s), "\n", " | ")), " ")
}

// workload is what a cut interrupts: model warm-ups (models) or image
// pulls (images). The one driver, cut, asks it to make the next item on
// the host, add it, arm the cut, and to audit and check after the reboot.
type workload interface {
	// what names the step a cut interrupts ("warm-up", "pull").
	what() string
	// counts are the figures its cuts add to.
	counts() *CutCounts
	// next makes the i-th item on the host (uploads its model, pushes
	// its image) and returns its name.
	next(ctx context.Context, i int, rng *mrand.Rand) (string, error)
	add(ctx context.Context, m *machine, name string) error
	// ready says whether the daemon reports the item ready, and if not,
	// what it reports.
	ready(ctx context.Context, m *machine, name string) (bool, string, error)
	// check compares a ready item with its source; "" when whole.
	check(ctx context.Context, m *machine, name string) (string, error)
	// arm arms the i-th cut of an item whose uncut run took length writes
	// and flushes, and names where it aims.
	arm(m *machine, i, length int, rng *mrand.Rand) string
	// audit reads every item added so far right after a reboot: those
	// ready before the power went off, the lost and the corrupt.
	audit(ctx context.Context, m *machine, poweredOff time.Time) (readyBefore, lost, corrupt []string, err error)
}

// cuts runs the first, uncut warm-up and then the cuts; then, with
// images, an uncut pull and the image cuts.
func (r *run) cuts(ctx context.Context) (err error) {
	t0 := time.Now()
	m, err := r.bootMachine(ctx)
	defer func() {
		if m != nil {
			err = errors.Join(err, m.stop())
		}
	}()
	if err != nil {
		return err
	}
	if !strings.Contains(m.vm.Console(), "write cache: write back") {
		return fmt.Errorf("the guest does not see a volatile write cache, so it would send no flush; console:\n%s", tail(m.vm.Console(), 4000))
	}
	if err := m.waitAPI(ctx); err != nil {
		return err
	}
	models := &models{r: r}
	r.workloads = []workload{models}
	if m, err = r.series(ctx, m, models, r.opts.Cuts); err != nil {
		return err
	}
	r.res.First = time.Since(t0) - r.res.Time
	if r.opts.ImageCuts == 0 {
		return nil
	}
	images := &images{r: r}
	r.workloads = append(r.workloads, images)
	m, err = r.series(ctx, m, images, r.opts.ImageCuts)
	return err
}

// series runs w's first item without a cut (every later one is checked
// against it, and its length in writes and flushes places the cuts), then
// n cuts; it returns the machine now running.
func (r *run) series(ctx context.Context, m *machine, w workload, n int) (*machine, error) {
	seed := r.opts.Seed
	name, err := w.next(ctx, 0, mrand.New(mrand.NewPCG(seed, 0)))
	if err != nil {
		return m, err
	}
	if err := w.add(ctx, m, name); err != nil {
		return m, err
	}
	before := m.disk.Events()
	if err := m.waitItem(ctx, w, name); err != nil {
		return m, err
	}
	length := m.disk.Events() - before
	r.logf("a %s takes %d writes and flushes of the data disk", w.what(), length)
	if v, err := w.check(ctx, m, name); err != nil || v != "" {
		return m, errors.Join(err, fmt.Errorf("without any cut: %s", v))
	}
	cc := w.counts()
	for i := 1; i <= n; i++ {
		t0 := time.Now()
		m, err = r.cut(ctx, m, w, i, length)
		cc.Time += time.Since(t0)
		if err != nil {
			return m, fmt.Errorf("%s cut %d (seed %d): %w", w.what(), i, seed, err)
		}
	}
	if cc.Cuts == 0 && n > 0 {
		return m, fmt.Errorf("no cut happened: every %s ended before its cut point, so nothing was tested", w.what())
	}
	return m, nil
}

// cut adds an item of w, cuts the power at a seeded point of its warm-up
// or pull (w.arm), boots again, audits every item and checks this one; it
// returns the machine now running.
func (r *run) cut(ctx context.Context, m *machine, w workload, i, length int) (*machine, error) {
	t0 := time.Now()
	cc := w.counts()
	rng := mrand.New(mrand.NewPCG(r.opts.Seed, uint64(i)))
	name, err := w.next(ctx, i, rng)
	if err != nil {
		return m, err
	}
	if err := w.add(ctx, m, name); err != nil {
		return m, err
	}
	aim := w.arm(m, i, length, rng)
	added := m.disk.Events()
	cut, err := m.waitCutOrReady(ctx, w, name)
	r.res.WarmingUp += time.Since(t0)
	if err != nil {
		return m, err
	}
	if !cut {
		cc.Missed++
		r.logf("%s cut %d (%s): %s was ready before the cut point, after %d writes and flushes", w.what(), i, aim, name, m.disk.Events()-added)
		return m, nil
	}
	mode := []CrashMode{LoseAll, KeepSome, KeepSome, LoseAll, KeepAll}[rng.IntN(5)]
	m.vm.Kill()
	cutAfter := m.disk.Events() - added
	trace := m.disk.Trace()
	lastEvents := strings.Join(trace[max(0, len(trace)-12):], " ")
	loss, err := m.disk.PowerLoss(mode, rng)
	if err != nil {
		return m, err
	}
	if err := m.stop(); err != nil {
		return m, err
	}
	cc.Cuts++
	r.res.Modes[mode.String()]++
	r.res.LossPending += loss.Pending
	r.res.LossTorn += loss.Torn
	r.res.LossSectors += loss.LostSectors

	poweredOff := time.Now()
	if m, err = r.bootMachine(ctx); err != nil {
		return m, err
	}
	t1 := time.Now()
	defer func() { r.res.Recovering += time.Since(t1) }()
	if err := m.waitAPI(ctx); err != nil { // the daemon started: its bbolt state opened
		return m, err
	}
	t2 := time.Now()
	// What the daemon says right after the reboot, of everything added.
	var wasReady bool
	for _, aw := range r.workloads {
		readyBefore, lost, corrupt, err := aw.audit(ctx, m, poweredOff)
		if err != nil {
			return m, err
		}
		ac := aw.counts()
		ac.Lost += len(lost)
		ac.CorruptReady += len(corrupt)
		for _, v := range append(lost, corrupt...) {
			r.violation("%s cut %d: %s", w.what(), i, v)
		}
		if aw == w {
			wasReady = slices.Contains(readyBefore, name)
		}
	}
	took := fmt.Sprintf("boot %v, daemon's API %v, audit %v", m.booted.Round(100*time.Millisecond),
		t2.Sub(t1).Round(100*time.Millisecond), time.Since(t2).Round(100*time.Millisecond))
	r.logf("%s cut %d (%s) at write or flush %d (the disk's last ones: %s), %v: %d unflushed writes, %d kept whole, %d torn, %d sectors lost; %s was ready before the cut: %v; %s",
		w.what(), i, aim, cutAfter, lastEvents, mode, loss.Pending, loss.Kept, loss.Torn, loss.LostSectors, name, wasReady, took)
	if err := m.waitItem(ctx, w, name); err != nil {
		return m, err
	}
	v, err := w.check(ctx, m, name)
	if err != nil {
		return m, err
	}
	if slices.ContainsFunc(refetchLogs, func(s string) bool { return strings.Contains(m.vm.Console(), s) }) {
		cc.Refetched++
		r.logf("%s cut %d: the daemon found blobs containerd recorded but lost, and fetched them again", w.what(), i)
	}
	switch {
	case v != "":
		cc.CorruptReady++
		r.violation("%s cut %d: after resuming: %s", w.what(), i, v)
	case wasReady:
		cc.ReadyAtBoot++
	default:
		cc.Resumed++
	}
	return m, nil
}

// models are the model warm-ups a run cuts: each a few files in S3.
type models struct {
	r   *run
	all []sourceModel
}

func (w *models) what() string       { return "warm-up" }
func (w *models) counts() *CutCounts { return &w.r.res.CutCounts }

func (w *models) next(ctx context.Context, i int, rng *mrand.Rand) (string, error) {
	mod, err := w.r.seedModel(ctx, fmt.Sprintf("m%d", i), rng)
	if err != nil {
		return "", err
	}
	w.all = append(w.all, mod)
	return mod.name, nil
}

func (w *models) model(name string) sourceModel {
	i := slices.IndexFunc(w.all, func(m sourceModel) bool { return m.name == name })
	return w.all[i]
}

func (w *models) add(ctx context.Context, m *machine, name string) error {
	return m.add(ctx, w.model(name))
}

func (w *models) ready(ctx context.Context, m *machine, name string) (bool, string, error) {
	st, err := m.client.Cache(ctx, name)
	if err != nil {
		return false, "", err
	}
	return st.Ready, fmt.Sprintf("%s, %d of %d bytes, error %q", st.State, st.BytesDone, st.BytesTotal, st.Error), nil
}

func (w *models) check(ctx context.Context, m *machine, name string) (string, error) {
	return m.check(ctx, w.model(name))
}

// arm cuts odd cuts uniformly within the warm-up and even ones within its
// publish: it starts with fsyncs of files the part records made durable
// already, a burst of flushes with nothing to write, then renames the
// revision in, swaps the current link, fsyncs the directory and records
// the revision ready: within the next publishEvents writes and flushes.
func (w *models) arm(m *machine, i, length int, rng *mrand.Rand) string {
	if i%2 == 0 {
		m.disk.CutAfterFlushBurst(publishBurst, 1+rng.IntN(publishEvents))
		return "publish"
	}
	m.disk.CutAt(m.disk.Events() + 1 + rng.IntN(max(1, length)))
	return "warm-up"
}

func (w *models) audit(ctx context.Context, m *machine, poweredOff time.Time) (readyBefore, lost, corrupt []string, err error) {
	return m.audit(ctx, w.all, poweredOff)
}
