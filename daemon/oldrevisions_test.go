package daemon

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/nvme"
)

// newDaemonCfg builds a daemon like newDaemon, with mod applied to its config.
func newDaemonCfg(t *testing.T, dir string, org Origin, mod func(*Config)) *Daemon {
	t.Helper()
	cfg := testConfig(dir)
	mod(&cfg)
	return openDaemon(t, cfg, org, Deps{})
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

func retiredOf(t *testing.T, d *Daemon) []retiredRevision {
	t.Helper()
	old, err := d.state.retired()
	if err != nil {
		t.Fatal(err)
	}
	return old
}

// resync is how often the tests' daemons re-list the source, in the
// injected clock's time: an update is noticed once the clock moves by it.
const resync = time.Minute

// update changes one object of the model and moves the clock so the daemon
// re-lists, then waits until a new revision is ready; it returns the
// status of the new revision and a copy of the files the old one held.
func update(t *testing.T, d *Daemon, fx *fixture, clock *testclock.Clock, content string) (newSt, oldSt api.CacheStatus, oldFiles map[string][]byte) {
	t.Helper()
	oldSt = status(t, d, "meta/llama")
	oldFiles = maps.Clone(fx.files)
	fx.put(t, "llama/config.json", []byte(content))
	clock.Advance(resync)
	d.Kick()
	wait.For(t, "new revision", func() bool {
		s := status(t, d, "meta/llama")
		return s.Ready && s.RevisionID != oldSt.RevisionID || s.Error != ""
	})
	newSt = status(t, d, "meta/llama")
	if newSt.Error != "" || !newSt.Ready {
		t.Fatalf("update failed: %+v", newSt)
	}
	return newSt, oldSt, oldFiles
}

// TestOldRevisionKeptForGrace: after an update the previous revision stays
// readable, and unreported, until its grace passes on the daemon's clock;
// then the reconcile loop deletes it.
func TestOldRevisionKeptForGrace(t *testing.T) {
	const grace = 10 * time.Minute
	fx := newFixture(t, map[string]int{"model-00001.safetensors": 2<<20 + 5, "config.json": 100})
	clock := testclock.New()
	dir := t.TempDir()
	d := newDaemonCfg(t, dir, fx.origin(t, nil), func(c *Config) {
		c.Clock, c.ResyncInterval, c.OldRevisionGrace = clock.Now, resync, grace
	})
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })

	st, old, oldFiles := update(t, d, fx, clock, `{"v":2}`)
	retiredAt := clock.Now()
	if !exists(t, old.Path) {
		t.Fatalf("old revision %s deleted at once, want it kept for %v", old.Path, grace)
	}
	checkFiles(t, old.Path, oldFiles)
	checkFiles(t, st.Path, fx.files)
	checkFiles(t, filepath.Join(dir, "models", "meta--llama", "current"), fx.files)
	if st.Path == old.Path || st.RevisionID == old.RevisionID {
		t.Fatalf("status reports the old revision: %+v", st)
	}
	if got := retiredOf(t, d); len(got) != 1 || got[0].Revision != old.RevisionID || !got[0].RetiredAt.Equal(retiredAt) || got[0].Bytes < int64(len(oldFiles["model-00001.safetensors"])) {
		t.Fatalf("retired = %+v, want %s retired at %v holding its bytes", got, old.RevisionID, retiredAt)
	}
	if got := testutil.ToFloat64(d.oldBytes.WithLabelValues("meta/llama")); got < float64(old.BytesTotal) {
		t.Fatalf("old revision bytes gauge = %v, want >= %d", got, old.BytesTotal)
	}

	// Just before the grace ends a prune pass keeps it.
	clock.Set(retiredAt.Add(grace - time.Second))
	if err := d.pruneRetired(0); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, old.Path, oldFiles)

	// Once it ends the loop deletes it, and only it.
	clock.Set(retiredAt.Add(grace))
	d.Kick()
	// The directory goes first, then its record: wait for both.
	wait.For(t, "old revision pruned", func() bool { return !exists(t, old.Path) && len(retiredOf(t, d)) == 0 })
	checkFiles(t, st.Path, fx.files)
	if s := status(t, d, "meta/llama"); !s.Ready || s.RevisionID != st.RevisionID {
		t.Fatalf("after pruning: %+v", s)
	}
}

// TestOldRevisionScheduleSurvivesRestart: the grace period is durable; a
// daemon restarted in the middle of it neither deletes the old revision
// early nor forgets it.
func TestOldRevisionScheduleSurvivesRestart(t *testing.T) {
	const grace = 30 * time.Minute
	fx := newFixture(t, map[string]int{"model.safetensors": 1<<20 + 3, "config.json": 10})
	clock := testclock.New()
	dir := t.TempDir()
	mod := func(c *Config) { c.Clock, c.ResyncInterval, c.OldRevisionGrace = clock.Now, resync, grace }
	d := newDaemonCfg(t, dir, fx.origin(t, nil), mod)
	stop := run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	st, old, oldFiles := update(t, d, fx, clock, `{"v":2}`)
	retiredAt := clock.Now()
	stop()

	clock.Set(retiredAt.Add(grace - time.Second))
	d2 := newDaemonCfg(t, dir, fx.origin(t, nil), mod)
	if got := testutil.ToFloat64(d2.oldBytes.WithLabelValues("meta/llama")); got < float64(old.BytesTotal) {
		t.Fatalf("after restart old revision bytes gauge = %v, want >= %d", got, old.BytesTotal)
	}
	if err := d2.pruneRetired(0); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, old.Path, oldFiles)
	run(t, d2)
	wait.For(t, "ready after restart", func() bool { return status(t, d2, "meta/llama").Ready })
	checkFiles(t, old.Path, oldFiles)

	clock.Set(retiredAt.Add(grace))
	d2.Kick()
	// The directory goes first, then its record: wait for both.
	wait.For(t, "old revision pruned after restart", func() bool { return !exists(t, old.Path) && len(retiredOf(t, d2)) == 0 })
	checkFiles(t, st.Path, fx.files)
}

// TestOldRevisionNoGrace: with no grace the previous revision goes as soon
// as the new one is ready, on a clock that never moves past the update, as
// before grace periods existed.
func TestOldRevisionNoGrace(t *testing.T) {
	fx := newFixture(t, map[string]int{"model.safetensors": 1<<20 + 3, "config.json": 10})
	clock := testclock.New()
	d := newDaemonCfg(t, t.TempDir(), fx.origin(t, nil), func(c *Config) { c.Clock, c.ResyncInterval = clock.Now, resync })
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	st, old, _ := update(t, d, fx, clock, `{"v":2}`)
	// The directory goes first, then its record: wait for both.
	wait.For(t, "old revision pruned", func() bool { return !exists(t, old.Path) && len(retiredOf(t, d)) == 0 })
	checkFiles(t, st.Path, fx.files)
}

// diskUsage is the allocated bytes of the files below dirs.
func diskUsage(t *testing.T, dirs ...string) int64 {
	var n int64
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			n += info.Sys().(*syscall.Stat_t).Blocks * 512
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Error(err)
		}
	}
	return n
}

// TestDownloadTakesOldRevisionSpace: on a cache file system with room for
// little more than two revisions, a second update needs the space of the
// oldest revision, still in its grace period: it is deleted early (and the
// newer old one kept) rather than the download failing. Removing the model
// then takes every revision at once.
func TestDownloadTakesOldRevisionSpace(t *testing.T) {
	const size = 3 << 20
	fx := newFixture(t, map[string]int{"model.safetensors": size, "config.json": 10})
	clock := testclock.New()
	dir := t.TempDir()
	// The data dir's file system holds 2.5 revisions: the cache's own
	// files count against it, as on a dedicated NVMe.
	quota := int64(size * 5 / 2)
	statFS := func(string) (nvme.Space, error) {
		used := diskUsage(t, filepath.Join(dir, "models"), filepath.Join(dir, "partial"))
		return nvme.Space{Total: quota, Free: quota - used}, nil
	}
	d := newDaemonCfg(t, dir, fx.origin(t, nil), func(c *Config) {
		c.Clock, c.ResyncInterval, c.OldRevisionGrace, c.StatFS = clock.Now, resync, time.Hour, statFS
	})
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	stB, stA, filesA := update(t, d, fx, clock, `{"v":2}`)
	checkFiles(t, stA.Path, filesA)

	_, _, filesB := update(t, d, fx, clock, `{"v":3}`)
	if exists(t, stA.Path) {
		t.Fatalf("oldest revision %s kept although the download needed its space", stA.Path)
	}
	checkFiles(t, stB.Path, filesB)
	if got := retiredOf(t, d); len(got) != 1 || got[0].Revision != stB.RevisionID {
		t.Fatalf("retired = %+v, want only %s", got, stB.RevisionID)
	}

	if _, err := d.RemoveCache(t.Context(), "meta/llama"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "removal", func() bool { _, found, _ := d.Cache("meta/llama"); return !found })
	if exists(t, filepath.Join(dir, "models", "meta--llama")) {
		t.Fatal("model dir still there after removal")
	}
	if got := retiredOf(t, d); len(got) != 0 {
		t.Fatalf("retired after removal = %+v", got)
	}
}

func TestPickPrunes(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const grace = 10 * time.Minute
	r := func(model, rev string, age time.Duration, bytes int64) retiredRevision {
		return retiredRevision{Model: model, Revision: rev, RetiredAt: now.Add(-age), Bytes: bytes}
	}
	a1 := r("a", "r1", 20*time.Minute, 100) // expired
	a2 := r("a", "r2", 5*time.Minute, 200)  // in grace, older
	b1 := r("b", "r1", time.Minute, 300)    // in grace, newest
	edge := r("c", "r1", grace, 50)         // grace ends exactly now
	c2 := r("c", "r2", 5*time.Minute, 200)  // same age as a2: by model name
	neg := r("d", "r1", 2*time.Minute, -1)  // unmeasured
	tests := []struct {
		name  string
		old   []retiredRevision
		grace time.Duration
		short int64
		want  []retiredRevision
	}{
		{"nothing retired", nil, grace, 0, nil},
		{"nothing retired, space short", nil, grace, 1000, nil},
		{"only expired", []retiredRevision{b1, a1, a2}, grace, 0, []retiredRevision{a1}},
		{"grace ends exactly now", []retiredRevision{edge, b1}, grace, 0, []retiredRevision{edge}},
		{"no grace takes all", []retiredRevision{b1, a2}, 0, 0, []retiredRevision{a2, b1}},
		{"expired covers the shortfall", []retiredRevision{a1, a2, b1}, grace, 100, []retiredRevision{a1}},
		{"shortfall takes the oldest in grace", []retiredRevision{b1, a2, a1}, grace, 150, []retiredRevision{a1, a2}},
		{"shortfall takes as many as it needs", []retiredRevision{b1, a2, a1}, grace, 301, []retiredRevision{a1, a2, b1}},
		{"shortfall of exactly all", []retiredRevision{b1, a2}, grace, 500, []retiredRevision{a2, b1}},
		{"shortfall beyond all: only expired", []retiredRevision{b1, a2, a1}, grace, 601, []retiredRevision{a1}},
		{"same age: by model", []retiredRevision{c2, a2}, grace, 1, []retiredRevision{a2}},
		{"unmeasured counts zero", []retiredRevision{neg, b1}, grace, 250, []retiredRevision{neg, b1}},
		{"negative shortfall", []retiredRevision{a2}, grace, -5, nil},
	}
	name := func(rs []retiredRevision) []string {
		var out []string
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s@%s", r.Model, r.Revision))
		}
		return out
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.old)
			got := pickPrunes(tt.old, now, tt.grace, tt.short)
			if !slices.Equal(name(got), name(tt.want)) {
				t.Fatalf("pickPrunes = %v, want %v", name(got), name(tt.want))
			}
			if !slices.Equal(in, tt.old) {
				t.Fatal("pickPrunes reordered its input")
			}
		})
	}
}

// TestRevertWithinGraceReusesOldRevision: a source changed back while the
// previous revision is still kept makes that revision current again without
// downloading it, takes it off the deletion schedule and retires the other.
func TestRevertWithinGraceReusesOldRevision(t *testing.T) {
	fx := newFixture(t, map[string]int{"model.safetensors": 1<<20 + 3, "config.json": 10})
	var s3Bytes atomic.Int64
	clock := testclock.New()
	d := newDaemonCfg(t, t.TempDir(), fx.origin(t, func(n int) { s3Bytes.Add(int64(n)) }), func(c *Config) {
		c.Clock, c.ResyncInterval, c.OldRevisionGrace = clock.Now, resync, time.Hour
	})
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	stB, stA, filesA := update(t, d, fx, clock, `{"v":2}`)

	before := s3Bytes.Load()
	st, _, _ := update(t, d, fx, clock, string(filesA["config.json"]))
	if st.RevisionID != stA.RevisionID || st.Path != stA.Path {
		t.Fatalf("after the revert: %+v, want revision %s again", st, stA.RevisionID)
	}
	if got := s3Bytes.Load() - before; got != 0 {
		t.Fatalf("the revert read %d bytes from S3, want none (the old revision was on disk)", got)
	}
	checkFiles(t, st.Path, filesA)
	if got := retiredOf(t, d); len(got) != 1 || got[0].Revision != stB.RevisionID {
		t.Fatalf("retired = %+v, want only %s", got, stB.RevisionID)
	}
	clock.Advance(2 * time.Hour)
	d.Kick()
	wait.For(t, "the other revision pruned", func() bool { return !exists(t, stB.Path) })
	checkFiles(t, st.Path, filesA)
}

func TestConfigRejectsNegativeGrace(t *testing.T) {
	_, err := Open(Config{DataDir: t.TempDir(), PartSize: testPartSize, OldRevisionGrace: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "old revision grace") {
		t.Fatalf("Open with a negative grace = %v", err)
	}
}
