package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
)

// logCounter is a slog handler that counts records by message.
type logCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCounter) WithGroup(string) slog.Handler            { return l }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[r.Message]++
	l.n[""]++
	return nil
}

// count is how many records had msg; "" counts every record.
func (l *logCounter) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[msg]
}

// mountTmpfs mounts a tmpfs of size (as mount(8) spells it) on a new
// directory, unmounted when the test ends.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes a file in dir until its file system is full and returns
// the file's path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, chunk := range []int{64 << 10, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", dir, err)
				}
				break
			}
		}
	}
	return path
}

// gatedDownload holds every download until gate is closed.
type gatedDownload struct {
	Origin
	gate    chan struct{}
	waiting atomic.Int64
}

func (o *gatedDownload) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	o.waiting.Add(1)
	select {
	case <-o.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return o.Origin.Download(ctx, obj, dst, plan)
}

// TestFullDiskBacksOff: when the data dir's disk is full, so that not even
// the failure and its backoff can be written to state.db, the fetch still
// backs off (in memory), the status shows the error and the next try, and
// the cache becomes ready once space is freed.
func TestFullDiskBacksOff(t *testing.T) {
	// Many files make a large cache record, which a full disk cannot take
	// (bbolt finds no free pages for it), as in the field.
	files := map[string]int{}
	for i := range 100 {
		files[fmt.Sprintf("shard-%03d.safetensors", i)] = 4 << 10
	}
	fx := newFixture(t, files)
	dir := mountTmpfs(t, "4m")
	logs := &logCounter{}
	org := &gatedDownload{Origin: fx.origin(t, nil), gate: make(chan struct{})}
	d := newDaemonCfg(t, dir, org, func(c *Config) { c.Logger = slog.New(logs) })
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	// The download has begun (its record is written); then the disk fills.
	wait.For(t, "download started", func() bool { return org.waiting.Load() > 0 })
	filler := fillDisk(t, dir)
	close(org.gate)

	// Each failed attempt logs a few lines; a tight loop logs thousands.
	const maxLines = 200
	delays := map[int]time.Duration{}
	var st api.CacheStatus
	wait.For(t, "three failed attempts", func() bool {
		if n := logs.count(""); n > maxLines {
			t.Fatalf("%d log lines (%d failed fetches) before the third attempt: the retry does not back off", n, logs.count("fetch failed"))
		}
		st = status(t, d, "meta/llama")
		if st.Error != "" && !st.NextTry.IsZero() {
			delays[st.Attempts] = st.NextTry.Sub(st.UpdatedAt)
		}
		return st.Attempts >= 3
	}, wait.Timeout(90*time.Second))
	if st.State != api.StateFailed || st.Ready || !strings.Contains(st.Error, "no space left on device") {
		t.Fatalf("status on a full disk: %+v, want failed with the disk's error", st)
	}
	if n := logs.count("fetch failed"); n > 4 {
		t.Fatalf("%d failed fetches logged for %d attempts", n, st.Attempts)
	}
	var last time.Duration
	for a := 1; a <= 3; a++ {
		got, ok := delays[a]
		if !ok {
			continue // polled between two attempts
		}
		if got <= last {
			t.Fatalf("backoff after attempt %d is %v, not longer than the one before (%v); all: %v", a, got, last, delays)
		}
		last = got
	}
	if len(delays) < 2 {
		t.Fatalf("saw the backoff of too few attempts to compare: %v", delays)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready once space is freed", func() bool { return status(t, d, "meta/llama").Ready }, wait.Timeout(90*time.Second))
	if st := status(t, d, "meta/llama"); st.Error != "" || !st.NextTry.IsZero() {
		t.Fatalf("ready but still reports a failure: %+v", st)
	}
}
