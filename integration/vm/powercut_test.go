package vm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/integration/vm"
)

// Environment knobs of the suite: how many cuts (default defaultCuts, a
// few minutes on a two-core machine) and the seed of the run (default 1).
const (
	envCuts     = "WARMFLEET_VM_CUTS"
	envSeed     = "WARMFLEET_VM_SEED"
	defaultCuts = 2
	// publishBurst flushes in a row mark the start of a publish;
	// publishEvents writes and flushes after it, it is done.
	publishBurst  = 3
	publishEvents = 20
)

// sourceModel is one model in the host's S3 server, with what its files
// must hold.
type sourceModel struct {
	name   string
	files  map[string]string // path -> SHA-256
	sizes  map[string]int64
	source string
}

const bucket = "models"

// seedModel uploads a model of a few pseudo-random files (from rng).
func (l *lab) seedModel(t *testing.T, name string, rng *rand.Rand) sourceModel {
	t.Helper()
	m := sourceModel{name: name, files: map[string]string{}, sizes: map[string]int64{}, source: "s3://" + bucket + "/" + name + "/"}
	// The same sizes for every model, so that every warm-up takes about
	// as many writes as the first, which places the cuts.
	sizes := map[string]int64{
		"config.json":             700,
		"model-00001.safetensors": 2<<20 + 4321,
		"model-00002.safetensors": 3<<20 - 1234,
		"sub/tokenizer.json":      60 << 10,
	}
	for path, size := range sizes {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if err := l.s3.Put(t.Context(), bucket, name+"/"+path, bytes.NewReader(b), size); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		m.files[path], m.sizes[path] = hex.EncodeToString(sum[:]), size
	}
	return m
}

// figures are what the suite reports.
type figures struct {
	cuts, missed                       int
	readyAtBoot, resumed               int
	corruptReady, lost                 int
	boots                              []time.Duration
	modes                              map[string]int
	lossPending, lossTorn, lossSectors int
}

// TestPowerCuts cuts the guest's power at seeded points of model
// warm-ups, including their publish step, and after each cut boots the
// guest again on what the disk kept; see the package documentation.
func TestPowerCuts(t *testing.T) {
	cuts := envInt(t, envCuts, defaultCuts)
	seed := uint64(envInt(t, envSeed, 1))
	start := time.Now()
	l := newLab(t)
	if err := l.s3.MakeBucket(t.Context(), bucket); err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d, %d cuts (%s, %s)", seed, cuts, envSeed, envCuts)
	fig := figures{modes: map[string]int{}}

	m := l.boot(t, l.image, 0)
	fig.boots = append(fig.boots, m.booted)
	if !strings.Contains(m.vm.Console(), "write cache: write back") {
		t.Fatalf("the guest does not see a volatile write cache, so it would send no flush; console:\n%s", tail(m.vm.Console(), 4000))
	}
	m.waitAPI(t)

	// A warm-up without a cut: every later one is checked against it, and
	// its length (in writes and flushes) places the cuts.
	first := l.seedModel(t, "m0", rand.New(rand.NewPCG(seed, 0)))
	models := []sourceModel{first}
	m.add(t, first)
	before := m.disk.Events()
	m.waitReady(t, first)
	warmup := m.disk.Events() - before
	t.Logf("a warm-up takes %d writes and flushes of the data disk", warmup)
	if v := m.check(t, first); v != "" {
		t.Fatalf("without any cut: %s", v)
	}

	for i := 1; i <= cuts; i++ {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		mod := l.seedModel(t, fmt.Sprintf("m%d", i), rng)
		models = append(models, mod)
		m.add(t, mod)
		aim := "warm-up"
		if i%2 == 0 {
			aim = "publish"
			// The publish ends a warm-up. It starts with fsyncs of files
			// the part records made durable already, a burst of flushes
			// with nothing to write, then renames the revision in, swaps
			// the current link, fsyncs the directory and records the
			// revision ready: within the next publishEvents writes and
			// flushes.
			m.disk.CutAfterFlushBurst(publishBurst, 1+rng.IntN(publishEvents))
		} else {
			m.disk.CutAt(m.disk.Events() + 1 + rng.IntN(max(1, warmup)))
		}
		added := m.disk.Events()
		if !m.waitCutOrReady(t, mod) {
			fig.missed++
			t.Logf("cut %d (%s): %s was ready before the cut point", i, aim, mod.name)
			continue
		}
		mode := []vm.CrashMode{vm.LoseAll, vm.KeepSome, vm.KeepSome, vm.LoseAll, vm.KeepAll}[rng.IntN(5)]
		m.vm.Kill()
		cutAfter := m.disk.Events() - added
		trace := m.disk.Trace()
		lastEvents := strings.Join(trace[max(0, len(trace)-12):], " ")
		loss, err := m.disk.PowerLoss(mode, rng)
		if err != nil {
			t.Fatal(err)
		}
		m.stop(t)
		fig.cuts++
		fig.modes[mode.String()]++
		fig.lossPending += loss.Pending
		fig.lossTorn += loss.Torn
		fig.lossSectors += loss.LostSectors

		poweredOff := time.Now()
		m = l.boot(t, l.image, 0)
		fig.boots = append(fig.boots, m.booted)
		m.waitAPI(t) // the daemon started: its bbolt state opened
		// What the daemon says right after the reboot.
		readyBefore, lost, corrupt := m.audit(t, models, poweredOff)
		fig.lost += lost
		fig.corruptReady += corrupt
		wasReady := slices.Contains(readyBefore, mod.name)
		t.Logf("cut %d (%s) at write or flush %d of the warm-up (the disk's last ones: %s), %v: %d unflushed writes, %d kept whole, %d torn, %d sectors lost; %s was ready before the cut: %v",
			i, aim, cutAfter, lastEvents, mode, loss.Pending, loss.Kept, loss.Torn, loss.LostSectors, mod.name, wasReady)
		m.waitReady(t, mod)
		if v := m.check(t, mod); v != "" {
			fig.corruptReady++
			t.Errorf("cut %d: after resuming: %s", i, v)
		}
		if wasReady {
			fig.readyAtBoot++
		} else {
			fig.resumed++
		}
	}
	slices.Sort(fig.boots)
	t.Logf("power cuts: %d cut (%d missed: ready first), %d ready at reboot, %d resumed to ready, %d corrupt ready, %d entries lost; modes %v; "+
		"%d unflushed writes at the cuts, %d torn, %d sectors lost; boot median %v over %d boots; %v in all",
		fig.cuts, fig.missed, fig.readyAtBoot, fig.resumed, fig.corruptReady, fig.lost, fig.modes,
		fig.lossPending, fig.lossTorn, fig.lossSectors, fig.boots[len(fig.boots)/2].Round(100*time.Millisecond), len(fig.boots),
		time.Since(start).Round(time.Second))
	if fig.corruptReady > 0 || fig.lost > 0 {
		t.Errorf("%d corrupt ready, %d entries lost: both must be 0", fig.corruptReady, fig.lost)
	}
	if fig.cuts == 0 {
		t.Errorf("no cut happened: every warm-up ended before its cut point, so nothing was tested")
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a number >= 0", name, s)
	}
	return n
}

// waitAPI waits until the daemon answers.
func (m *machine) waitAPI(t *testing.T) {
	t.Helper()
	m.wait(t, "the daemon's API", 2*time.Minute, func(ctx context.Context) error {
		_, err := m.client.Caches(ctx)
		return err
	})
}

func (m *machine) add(t *testing.T, mod sourceModel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := m.client.AddCache(ctx, api.AddCacheRequest{Name: mod.name, Source: mod.source}); err != nil {
		t.Fatalf("add %s: %v\nconsole:\n%s", mod.name, err, tail(m.vm.Console(), 4000))
	}
}

// waitFor waits until mod's status satisfies cond.
func (m *machine) waitFor(t *testing.T, what string, cond func(api.CacheStatus) bool, mod sourceModel) {
	t.Helper()
	m.wait(t, what, 3*time.Minute, func(ctx context.Context) error {
		st, err := m.client.Cache(ctx, mod.name)
		if err != nil {
			return err
		}
		if !cond(st) {
			return fmt.Errorf("%s: %s, %d of %d bytes, error %q", mod.name, st.State, st.BytesDone, st.BytesTotal, st.Error)
		}
		return nil
	})
}

func (m *machine) waitReady(t *testing.T, mod sourceModel) {
	t.Helper()
	m.waitFor(t, mod.name+" ready", func(st api.CacheStatus) bool { return st.Ready }, mod)
}

// waitCutOrReady waits until the armed cut happens (true) or mod is ready
// first (false: the cut is disarmed).
func (m *machine) waitCutOrReady(t *testing.T, mod sourceModel) bool {
	t.Helper()
	cut := false
	m.wait(t, "the power cut or "+mod.name+" ready", 3*time.Minute, func(ctx context.Context) error {
		select {
		case <-m.disk.Cut():
			cut = true
			return nil
		default:
		}
		// Short: a guest whose disk just lost its power may not answer.
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		st, err := m.client.Cache(sctx, mod.name)
		if err != nil {
			return err
		}
		if !st.Ready {
			return fmt.Errorf("%s: %s, %d of %d bytes", mod.name, st.State, st.BytesDone, st.BytesTotal)
		}
		m.disk.CutAt(0)
		select {
		case <-m.disk.Cut():
			cut = true
		default:
		}
		return nil
	})
	return cut
}

// audit reads every model's status right after a reboot, in one call: a
// model whose add was acknowledged must still be known, and every model
// reported ready must hold its source's files exactly. It returns the
// models that were ready before the power went off (the daemon may have
// resumed and published others since it started), and counts the
// violations (each also fails the test).
func (m *machine) audit(t *testing.T, models []sourceModel, poweredOff time.Time) (readyBefore []string, lost, corrupt int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	all, err := m.client.Caches(ctx)
	if err != nil {
		t.Fatalf("caches after the reboot: %v", err)
	}
	status := map[string]api.CacheStatus{}
	for _, st := range all {
		status[st.Name] = st
	}
	for _, mod := range models {
		st, ok := status[mod.name]
		if !ok {
			lost++
			t.Errorf("%s was added (acknowledged) before the cut and is unknown after it", mod.name)
			continue
		}
		if !st.Ready {
			// Not ready, but a serving framework follows the current link
			// whatever the daemon says: if it is there, it must lead to
			// whole files.
			if v := m.checkCurrent(t, mod); v != "" {
				corrupt++
				t.Errorf("%s not ready after the reboot, but its current link leads to %s", mod.name, v)
			}
			continue
		}
		// The guest's clock comes from the host's at boot (whole seconds).
		if st.ReadyAt.Before(poweredOff.Add(time.Second)) {
			readyBefore = append(readyBefore, mod.name)
		}
		if v := m.check(t, mod); v != "" {
			corrupt++
			t.Errorf("reported ready after the reboot: %s", v)
		}
	}
	return readyBefore, lost, corrupt
}

// check compares a ready model, as the daemon reports it and through its
// current link, with the source: every file there with its size and
// SHA-256, nothing else. It returns what is wrong, or "".
func (m *machine) check(t *testing.T, mod sourceModel) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	st, err := m.client.Cache(ctx, mod.name)
	if err != nil {
		t.Fatalf("status of %s: %v", mod.name, err)
	}
	if !st.Ready {
		return fmt.Sprintf("%s is not ready (%s)", mod.name, st.State)
	}
	var problems []string
	// Through the current link first; the reported path is hashed again
	// only when the link leads elsewhere.
	for _, dir := range []string{currentLink(mod), st.Path} {
		l, err := m.hash(ctx, dir)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		if p := compare(l, mod); p != "" {
			problems = append(problems, dir+": "+p)
		}
		if l.Dir == st.Path {
			break
		}
	}
	if len(problems) == 0 {
		return ""
	}
	return mod.name + " ready with " + strings.Join(problems, "; ")
}

// checkCurrent compares what the model's current link leads to, if it is
// there, with the source; "" when it matches or is not there.
func (m *machine) checkCurrent(t *testing.T, mod sourceModel) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l, err := m.hash(ctx, currentLink(mod))
	var ae *agentError
	if errors.As(err, &ae) && ae.code == http.StatusNotFound {
		return ""
	}
	if err != nil {
		return err.Error()
	}
	return compare(l, mod)
}

func currentLink(mod sourceModel) string { return dataDir + "/models/" + mod.name + "/current" }

// compare lists how a guest directory differs from the model's source.
func compare(l listing, mod sourceModel) string {
	var bad []string
	seen := map[string]bool{}
	for _, f := range l.Files {
		seen[f.Path] = true
		want, ok := mod.files[f.Path]
		switch {
		case !ok:
			bad = append(bad, f.Path+" is not in the source")
		case f.Size != mod.sizes[f.Path]:
			bad = append(bad, fmt.Sprintf("%s has %d bytes, want %d", f.Path, f.Size, mod.sizes[f.Path]))
		case f.SHA256 != want:
			bad = append(bad, fmt.Sprintf("%s has SHA-256 %.12s, want %.12s", f.Path, f.SHA256, want))
		}
	}
	for path := range mod.files {
		if !seen[path] {
			bad = append(bad, path+" is missing")
		}
	}
	slices.Sort(bad)
	return strings.Join(bad, ", ")
}
