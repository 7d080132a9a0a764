package daemon

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/origin"
)

// pausable holds downloads while paused, so a test can look at a cache
// between its repair and its re-fetch.
type pausable struct {
	Origin
	mu   sync.Mutex
	gate chan struct{} // nil: downloads run
}

func (o *pausable) pause() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.gate = make(chan struct{})
}

func (o *pausable) resume() {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.gate)
	o.gate = nil
}

func (o *pausable) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	o.mu.Lock()
	gate := o.gate
	o.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return o.Origin.Download(ctx, obj, dst, plan)
}

func ready(t *testing.T, d *Daemon) api.CacheStatus {
	t.Helper()
	var st api.CacheStatus
	wait.For(t, "cache ready", func() bool { st = status(t, d, "meta/llama"); return st.Ready })
	return st
}

// TestVerifyRepairsFlippedByte: `cache verify` re-hashes a ready cache; an
// intact one stays ready and nothing is fetched, a flipped byte is found,
// the cache is not ready until that file (and only it) is fetched again.
func TestVerifyRepairsFlippedByte(t *testing.T) { testVerifyRepairsFlippedByte(t, newFixture) }

func testVerifyRepairsFlippedByte(t *testing.T, newFixture func(*testing.T, map[string]int) *fixture) {
	fx := newFixture(t, map[string]int{"a.safetensors": 1 << 20, "b.safetensors": 300 << 10})
	var s3Bytes atomic.Int64
	org := &pausable{Origin: fx.origin(t, func(n int) { s3Bytes.Add(int64(n)) })}
	d := newDaemon(t, t.TempDir(), org)
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	st := ready(t, d)
	fetched := s3Bytes.Load()

	// Through the API, as `warmfleet cache verify` asks.
	srv := httptest.NewServer(d.Handler(""))
	defer srv.Close()
	cl, err := api.NewClient(srv.Listener.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := cl.Verify(t.Context(), "meta/llama")
	if err != nil {
		t.Fatal(err)
	}
	if res.Checked != 2 || len(res.Damaged) != 0 || res.Repairing || len(res.Unverifiable) != 0 {
		t.Fatalf("verify of an intact cache: %+v", res)
	}
	if now := status(t, d, "meta/llama"); !now.Ready || now.Path != st.Path || s3Bytes.Load() != fetched {
		t.Fatalf("after verifying an intact cache: %+v, %d bytes fetched again", now, s3Bytes.Load()-fetched)
	}

	flipByte(t, filepath.Join(st.Path, "a.safetensors"), 12345)
	org.pause()
	res, err = d.Verify(t.Context(), "meta/llama")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Damaged) != 1 || res.Damaged[0].Path != "a.safetensors" || !res.Repairing || res.Checked != 1 {
		t.Fatalf("verify of a flipped byte: %+v", res)
	}
	if now := status(t, d, "meta/llama"); now.Ready || now.State == api.StateReady {
		t.Fatalf("damaged cache still reported ready: %+v", now)
	}
	org.resume()
	st = ready(t, d)
	checkFiles(t, st.Path, fx.files)
	if got := s3Bytes.Load() - fetched; got != 1<<20 {
		t.Fatalf("repair fetched %d bytes, want only the damaged file's %d", got, 1<<20)
	}
	if _, err := d.Verify(t.Context(), "nope"); err == nil {
		t.Fatal("verify of an unknown cache succeeded")
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestDamageFoundAtStartAndResync: a deleted file or current link of a
// ready cache is noticed when the daemon starts and at each resync (stat
// only), and repaired: the cache is fetched again where it is damaged.
func TestDamageFoundAtStartAndResync(t *testing.T) {
	fx := newFixture(t, map[string]int{"a.safetensors": 1 << 20, "b.safetensors": 300 << 10})
	dir := t.TempDir()
	d := newDaemon(t, dir, fx.origin(t, nil))
	stop := run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	st := ready(t, d)
	stop()

	// Restart with a file gone: noticed at start.
	if err := os.Remove(filepath.Join(st.Path, "b.safetensors")); err != nil {
		t.Fatal(err)
	}
	var s3Bytes atomic.Int64
	d = newDaemonResync(t, dir, fx.origin(t, func(n int) { s3Bytes.Add(int64(n)) }), 50*time.Millisecond)
	run(t, d)
	wait.For(t, "damage noticed at start", func() bool { return testutil.ToFloat64(d.metrics.damaged.WithLabelValues("meta/llama")) >= 1 })
	st = ready(t, d)
	checkFiles(t, st.Path, fx.files)
	if got := s3Bytes.Load(); got != 300<<10 {
		t.Fatalf("repair fetched %d bytes, want only the deleted file's %d", got, 300<<10)
	}

	// While running: a truncated file, then a deleted link, at resync.
	if err := os.Truncate(filepath.Join(st.Path, "a.safetensors"), 10); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "truncated file noticed", func() bool { return testutil.ToFloat64(d.metrics.damaged.WithLabelValues("meta/llama")) >= 2 })
	st = ready(t, d)
	checkFiles(t, st.Path, fx.files)

	link := filepath.Join(filepath.Dir(st.Path), nvme.CurrentLink)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	before := s3Bytes.Load()
	wait.For(t, "current link re-made", func() bool {
		target, err := os.Readlink(link)
		return err == nil && target == st.RevisionID && status(t, d, "meta/llama").Ready
	})
	if got := s3Bytes.Load() - before; got != 0 {
		t.Fatalf("re-making the link fetched %d bytes", got)
	}
	if n := testutil.ToFloat64(d.metrics.damaged.WithLabelValues("meta/llama")); n < 3 {
		t.Fatalf("damage counter %v after three repairs", n)
	}
}
