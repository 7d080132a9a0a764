package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/hforigin"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// These tests warm hf:// caches from a local Hub (internal/testutil/hubserver)
// through internal/hforigin, the origin the daemon wires for hf:// sources.

// hubFiles is a model repository: LFS weights (verified by sha256) and
// small git files (verified by their blob id).
func hubFiles(seed uint64) map[string]hubserver.File {
	return map[string]hubserver.File{
		"model-00001.safetensors": {Data: origintest.Bytes(seed, 2<<20+11), LFS: true},
		"onnx/model.onnx":         {Data: origintest.Bytes(seed+1, 1<<20), LFS: true},
		"config.json":             {Data: fmt.Appendf(nil, `{"seed":%d}`, seed)},
		"README.md":               {Data: []byte("# a model\n")},
	}
}

func hubOrigin(t *testing.T, hub *hubserver.Server, onBytes func(int)) *hforigin.Client {
	t.Helper()
	c, err := hforigin.New(hforigin.Options{Endpoint: hub.Endpoint(), PartSize: testPartSize, OnBytes: onBytes, RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fileData is what a cache of files should hold, by path.
func fileData(files map[string]hubserver.File, keep func(string) bool) map[string][]byte {
	out := map[string][]byte{}
	for p, f := range files {
		if keep(p) {
			out[p] = f.Data
		}
	}
	return out
}

func TestCacheFromHub(t *testing.T) {
	hub := hubserver.New(t)
	files := hubFiles(1)
	commit := hub.Push("org/m", "main", files)
	var d *Daemon
	dir := t.TempDir()
	d = newDaemon(t, dir, hubOrigin(t, hub, func(n int) { d.AddOriginBytes("hf", n) }))
	run(t, d)
	s := spec.Spec{Kind: spec.KindModel, Name: "org/m", Source: "hf://org/m", Include: []string{"*.safetensors", "*.json", "onnx/*"}, Exclude: []string{"*.onnx"}}
	if err := d.AddCache(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "org/m").Ready })
	st := status(t, d, "org/m")
	if st.Commit != commit || st.Files != 2 || st.BytesDone != st.BytesTotal {
		t.Fatalf("status %+v, want commit %s and 2 files (the others excluded)", st, commit)
	}
	checkFiles(t, st.Path, fileData(files, s.Keeps))
	for _, p := range []string{"README.md", "onnx/model.onnx"} {
		if _, err := os.Stat(filepath.Join(st.Path, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s cached though the patterns drop it (%v)", p, err)
		}
	}
	want := float64(st.BytesTotal)
	if got := testutil.ToFloat64(d.metrics.originBytes.WithLabelValues("hf")); got != want {
		t.Errorf(`warmfleet_origin_bytes_total{source="hf"} = %v, want %v`, got, want)
	}
	if got := d.metrics.s3Bytes.Load(); got != 0 {
		t.Errorf("S3 bytes %d for a Hub source", got)
	}

	// Patterns that keep nothing: a clear failure that needs the spec
	// changed, not a ready cache of nothing.
	s.Name, s.Include = "org/none", []string{"*.gguf"}
	if err := d.AddCache(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "failed", func() bool { return status(t, d, "org/none").State == api.StateFailed })
	if st := status(t, d, "org/none"); !st.NeedsAction || !strings.Contains(st.Error, "none of its 4 files matches") {
		t.Errorf("status %+v, want needs-action naming the patterns", st)
	}
}

// TestHubListingFailureNamesTheListingOnce: a revision the Hub does not
// have fails while the listing resolves it; the cache's error says "list
// SOURCE" once, the daemon adding no second one to what the origin says.
func TestHubListingFailureNamesTheListingOnce(t *testing.T) {
	hub := hubserver.New(t)
	hub.Push("org/m", "main", hubFiles(1))
	d := newDaemon(t, t.TempDir(), hubOrigin(t, hub, nil))
	run(t, d)
	s := spec.Spec{Kind: spec.KindModel, Name: "org/m", Source: "hf://org/m@nope"}
	if err := d.AddCache(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "failed", func() bool { return status(t, d, "org/m").State == api.StateFailed })
	if st := status(t, d, "org/m"); !strings.HasPrefix(st.Error, "list hf://org/m@nope: ") || strings.Count(st.Error, "list ") != 1 {
		t.Errorf("error %q, want one that begins with the listing and names it once", st.Error)
	}
}

// A file whose bytes do not match the sha256 the Hub lists is never
// ready: every attempt fails, nothing is published, and once the bytes are
// right the cache becomes ready.
func TestHubFileNotMatchingItsSHA256IsNeverReady(t *testing.T) {
	hub := hubserver.New(t)
	files := hubFiles(2)
	hub.Push("org/m", "main", files)
	good := files["model-00001.safetensors"].Data
	bad := bytes.Clone(good)
	bad[len(bad)-3] ^= 0x40
	hub.CorruptCDN(hubserver.SHA256(good), bad)
	clock := testclock.New()
	dir := t.TempDir()
	d := newDaemonCfg(t, dir, hubOrigin(t, hub, nil), func(c *Config) { c.Clock = clock.Now })
	run(t, d)
	if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: "org/m", Source: "hf://org/m"}); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		// Attempts counts an attempt from its start: wait for its end.
		wait.For(t, "a failed attempt", func() bool {
			st := status(t, d, "org/m")
			return st.Attempts >= attempt && (st.Error != "" || st.Ready)
		})
		st := status(t, d, "org/m")
		if st.Ready || st.State != api.StateFailed || !strings.Contains(st.Error, origin.ErrCorrupt.Error()) {
			t.Fatalf("attempt %d: %+v, want failed with %q", attempt, st, origin.ErrCorrupt)
		}
		if _, err := os.Lstat(filepath.Join(dir, "models", "org--m", "current")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("attempt %d: a current link exists (%v)", attempt, err)
		}
		if got := testutil.ToFloat64(d.metrics.originCorrupt.WithLabelValues("hf")); got != float64(attempt) {
			t.Fatalf(`attempt %d: warmfleet_origin_corrupt_total{source="hf"} = %v`, attempt, got)
		}
		clock.Advance(retryDelay(st.Attempts))
		d.Kick()
	}
	hub.CorruptCDN(hubserver.SHA256(good), good)
	clock.Advance(retryDelay(status(t, d, "org/m").Attempts))
	d.Kick()
	wait.For(t, "ready once the bytes are right", func() bool { return status(t, d, "org/m").Ready })
	checkFiles(t, status(t, d, "org/m").Path, fileData(files, func(string) bool { return true }))
}

// moveBranch pushes a new commit to the branch when the first download
// starts.
type moveBranch struct {
	Origin
	once sync.Once
	move func()
}

func (o *moveBranch) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	o.once.Do(o.move)
	return o.Origin.Download(ctx, obj, dst, plan)
}

// A branch that moves while its files download gives one revision, all of
// the commit it resolved to, never a mix; the next listing sees the new
// commit as a new revision.
func TestHubBranchMovedMidDownloadIsOneRevision(t *testing.T) {
	hub := hubserver.New(t)
	first, second := hubFiles(3), hubFiles(4)
	c1 := hub.Push("org/m", "main", first)
	var c2 atomic.Value
	org := &moveBranch{Origin: hubOrigin(t, hub, nil), move: func() { c2.Store(hub.Push("org/m", "main", second)) }}
	d := newDaemonResync(t, t.TempDir(), org, 100*time.Millisecond)
	run(t, d)
	if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: "org/m", Source: "hf://org/m"}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "org/m").Ready })
	st := status(t, d, "org/m")
	if st.Commit != c1 {
		t.Fatalf("ready at commit %s, want %s (the one resolved before the branch moved)", st.Commit, c1)
	}
	all := func(string) bool { return true }
	checkFiles(t, st.Path, fileData(first, all))

	wait.For(t, "the moved branch's revision", func() bool {
		s := status(t, d, "org/m")
		return s.Ready && s.RevisionID != st.RevisionID
	})
	st2 := status(t, d, "org/m")
	if st2.Commit != c2.Load() {
		t.Fatalf("new revision at commit %s, want %s", st2.Commit, c2.Load())
	}
	checkFiles(t, st2.Path, fileData(second, all))
}

// A failed fetch waits for its backoff, even when the loop looks at the
// caches just as it fails: the loop reads the records and the running
// fetches as one snapshot, or a fetch that wrote its failure and left
// between the two reads looks like one a restart interrupted ("downloading",
// none running) and starts again at once. Here the test is the loop,
// reconciling back to back while the one attempt fails on a corrupt file.
func TestFailedFetchWaitsForItsBackoffWhileTheLoopRuns(t *testing.T) {
	hub := hubserver.New(t)
	files := hubFiles(2)
	hub.Push("org/m", "main", files)
	good := files["model-00001.safetensors"].Data
	hub.CorruptCDN(hubserver.SHA256(good), append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1))
	clock := testclock.New()
	d := newDaemonCfg(t, t.TempDir(), hubOrigin(t, hub, nil), func(c *Config) { c.Clock = clock.Now })
	t.Cleanup(func() { _ = d.Close() })
	if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: "org/m", Source: "hf://org/m"}); err != nil {
		t.Fatal(err)
	}
	failed := func() float64 { return testutil.ToFloat64(d.metrics.fetches.WithLabelValues("failed")) }
	wait.For(t, "the attempt failed", func() bool {
		if err := d.reconcile(t.Context()); err != nil {
			t.Fatal(err)
		}
		return failed() > 0
	})
	for range 200 {
		if err := d.reconcile(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	d.mu.Lock()
	_, running := d.fetches["org/m"]
	d.mu.Unlock()
	if st := status(t, d, "org/m"); running || failed() != 1 || st.Attempts != 1 {
		t.Fatalf("with the clock still: a fetch running %v, %v failed, %d attempts, want none running, 1 and 1", running, failed(), st.Attempts)
	}
}
