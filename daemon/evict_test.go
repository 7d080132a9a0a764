package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// TestPickEvictions: the capacity rules as a table. Candidates are
// written "name:bytes:priority:last-used-minute[:pin|:busy]".
func TestPickEvictions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		need, free int64
		priority   int
		cands      string
		want       string // victims, or "insufficient" when it cannot fit
		evictable  int64
		wait       string // the busy victim to wait for
	}{
		{"fits as it is", 10, 10, 0, "a:50:0:1", "", 50, ""},
		{"least recently used first", 30, 10, 0, "a:50:0:5 b:50:0:1 c:50:0:3", "b", 150, ""},
		{"as many as it takes, oldest first", 90, 10, 0, "a:50:0:5 b:50:0:1 c:50:0:3", "b c", 150, ""},
		{"lowest priority before recency", 30, 10, 5, "a:50:0:9 b:50:3:1 c:50:5:0", "a", 150, ""},
		{"pinned is never evicted", 30, 10, 0, "a:50:0:1:pin b:50:0:2", "b", 50, ""},
		{"higher priority is never evicted", 30, 10, 1, "a:50:2:1 b:50:1:2", "b", 50, ""},
		{"not enough even with every candidate: evict nothing", 120, 10, 0, "a:50:0:1 b:50:0:2 c:50:9:0 d:80:0:0:pin", "insufficient", 100, ""},
		{"only pinned ones", 20, 10, 0, "a:50:0:1:pin", "insufficient", 0, ""},
		{"name breaks ties", 30, 10, 0, "b:50:0:1 a:50:0:1", "a", 100, ""},
		{"nothing to evict, nothing free", 1, 0, 0, "", "insufficient", 0, ""},
		{"a busy cache keeps its place: wait for it", 30, 10, 0, "a:50:0:5 b:50:0:1:busy", "b", 100, "b"},
		{"the first busy victim is waited for", 90, 10, 0, "a:50:0:5:busy b:50:0:1 c:50:0:3:busy", "b c", 150, "c"},
		{"a busy cache not needed is no reason to wait", 30, 10, 0, "a:50:0:5:busy b:50:0:1", "b", 100, ""},
		{"a busy cache of a higher priority is no reason to wait", 30, 10, 0, "a:50:1:1:busy b:50:0:5 c:50:0:9", "b", 100, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cands []evictable
			base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for _, c := range strings.Fields(tc.cands) {
				var e evictable
				var minute int
				f := strings.Split(c, ":")
				e.Name = f[0]
				if _, err := fmt.Sscan(f[1], &e.Bytes); err != nil {
					t.Fatal(err)
				}
				if _, err := fmt.Sscan(f[2], &e.Priority); err != nil {
					t.Fatal(err)
				}
				if _, err := fmt.Sscan(f[3], &minute); err != nil {
					t.Fatal(err)
				}
				e.LastUsed = base.Add(time.Duration(minute) * time.Minute)
				e.Pin = len(f) > 4 && f[4] == "pin"
				e.Busy = len(f) > 4 && f[4] == "busy"
				cands = append(cands, e)
			}
			got := pickEvictions(tc.need, tc.free, tc.priority, cands)
			victims := strings.Join(got.Victims, " ")
			if !got.Fits {
				victims = "insufficient"
				if len(got.Victims) > 0 {
					t.Fatalf("does not fit, yet evicts %v", got.Victims)
				}
			}
			if victims != tc.want || got.Evictable != tc.evictable || got.Needed != tc.need || got.Free != tc.free || got.WaitFor != tc.wait {
				t.Fatalf("got %+v, want victims %q, evictable %d, wait for %q", got, tc.want, tc.evictable, tc.wait)
			}
		})
	}
}

// readAfter reads the file at path once the kernel's file clock is past
// since. File times come from a coarse clock, some milliseconds behind
// time.Now: read at once, the read's access time can be older than since.
func readAfter(t *testing.T, path string, since time.Time) {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "clock")
	wait.For(t, "the file clock past "+since.String(), func() bool {
		if err := os.WriteFile(probe, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(probe)
		return err == nil && st.ModTime().After(since)
	})
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
}

// TestEvictionOnSmallDisk runs the capacity rules on a real 4 MiB tmpfs
// that holds two of the test's 1.5 MiB models, not three: a new cache
// evicts the least recently read one; a pinned cache is never evicted; a
// cache that may evict nothing that would make it fit says so with the
// numbers; an evicted cache stays evicted rather than evicting back.
func TestEvictionOnSmallDisk(t *testing.T) {
	fx := newFixture(t, nil)
	const size = 3 << 19
	for _, m := range []string{"a", "b", "c", "d"} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i*7) ^ m[0]
		}
		fx.put(t, m+"/model.safetensors", data)
	}
	dir := mountTmpfs(t, "4m")
	d := newDaemon(t, dir, fx.origin(t, nil))
	run(t, d)
	model := func(name string, pin bool, priority int) spec.Spec {
		return spec.Spec{Kind: spec.KindModel, Name: name, Source: "s3://" + fx.bucket + "/" + name + "/", Pin: pin, Priority: priority}
	}
	add := func(s spec.Spec) {
		t.Helper()
		if err := d.AddCache(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	waitState := func(name, state string) api.CacheStatus {
		t.Helper()
		var st api.CacheStatus
		wait.For(t, name+" "+state, func() bool {
			st = status(t, d, name)
			return st.State == state
		}, wait.Timeout(60*time.Second))
		return st
	}
	add(model("a", false, 0))
	a := waitState("a", api.StateReady)
	add(model("b", false, 0))
	b := waitState("b", api.StateReady)
	// a became ready first, but is read after b is ready: b is the least
	// recently used.
	readAfter(t, filepath.Join(a.Path, "model.safetensors"), b.ReadyAt)
	add(model("c", false, 0))
	waitState("c", api.StateReady)
	if st := waitState("b", api.StateEvicted); !strings.Contains(st.Error, "evicted to make room for c") {
		t.Fatalf("b: %+v", st)
	}
	if st := status(t, d, "a"); !st.Ready {
		t.Fatalf("a, the recently read cache, was not kept: %+v", st)
	}

	// a is pinned; d, of a lower priority than c, may evict nothing.
	add(model("a", true, 0))
	wait.For(t, "a pinned and ready", func() bool { st := status(t, d, "a"); return st.Ready && st.Pin })
	add(model("d", false, -1))
	st := waitState("d", api.StateInsufficientSpace)
	if st.Space == nil || st.Space.Needed != size || st.Space.Evictable != 0 || st.Space.Free >= size ||
		!strings.Contains(st.Error, "insufficient space: need 1.5 MiB") {
		t.Fatalf("d: %+v (space %+v)", st, st.Space)
	}
	// At c's priority, d evicts c, never the pinned a, though c was read
	// after a was last used (pinning made a ready anew).
	if _, err := os.ReadFile(filepath.Join(status(t, d, "c").Path, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	add(model("d", false, 0))
	waitState("d", api.StateReady)
	waitState("c", api.StateEvicted)
	for _, name := range []string{"a", "d"} {
		if st := status(t, d, name); !st.Ready {
			t.Fatalf("%s not ready at the end: %+v", name, st)
		}
	}
	// b tries again after its backoff, and stays evicted: it may not
	// evict to come back.
	// Attempts counts an attempt from its start: wait for its end.
	wait.For(t, "b tried again", func() bool {
		st := status(t, d, "b")
		return st.Attempts >= 2 && st.Error != ""
	}, wait.Timeout(60*time.Second))
	if st := status(t, d, "b"); st.State != api.StateEvicted || st.Space == nil || st.Space.Needed != size {
		t.Fatalf("b at the end: %+v", st)
	}
	var evicted []string
	for _, name := range []string{"a", "b", "c", "d"} {
		if status(t, d, name).State == api.StateEvicted {
			evicted = append(evicted, name)
		}
	}
	if !slices.Equal(evicted, []string{"b", "c"}) {
		t.Fatalf("evicted %v, want b and c", evicted)
	}
}

// holdList blocks the listings of one source while armed, as a slow S3
// holds a ready cache's re-check.
type holdList struct {
	Origin
	source string
	held   atomic.Int64 // listings of source that are blocked now
	gate   atomic.Pointer[chan struct{}]
}

func (o *holdList) List(ctx context.Context, src string) ([]origin.Object, error) {
	if g := o.gate.Load(); g != nil && src == o.source {
		o.held.Add(1)
		defer o.held.Add(-1)
		select {
		case <-*g:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return o.Origin.List(ctx, src)
}

// TestEvictionWaitsForABusyVictim: the least recently used cache is being
// re-checked (its fetch runs, its listing held) when a new cache needs its
// space. The newcomer waits for the check to end and evicts it then; it
// does not evict the recently read cache in its place (it did when a busy
// cache was left out of the order: the end of a download, still running
// after its cache was ready, was enough).
func TestEvictionWaitsForABusyVictim(t *testing.T) {
	fx := newFixture(t, nil)
	const size = 3 << 19
	for _, m := range []string{"a", "b", "c"} {
		fx.put(t, m+"/model.safetensors", bytes.Repeat([]byte(m), size))
	}
	source := func(name string) string { return "s3://" + fx.bucket + "/" + name + "/" }
	org := &holdList{Origin: fx.origin(t, nil), source: source("b")}
	d := newDaemonResync(t, mountTmpfs(t, "4m"), org, 100*time.Millisecond)
	run(t, d)
	readyOne := func(name string) api.CacheStatus {
		t.Helper()
		if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: name, Source: source(name)}); err != nil {
			t.Fatal(err)
		}
		var st api.CacheStatus
		wait.For(t, name+" ready", func() bool { st = status(t, d, name); return st.Ready })
		return st
	}
	a := readyOne("a")
	b := readyOne("b")
	gate := make(chan struct{})
	org.gate.Store(&gate)
	wait.For(t, "b's re-check held", func() bool { return org.held.Load() > 0 })
	readAfter(t, filepath.Join(a.Path, "model.safetensors"), b.ReadyAt)

	if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: "c", Source: source("c")}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "c under way", func() bool {
		st := status(t, d, "c")
		return st.State == api.StateDownloading || st.Ready
	})
	if st := status(t, d, "a"); !st.Ready || status(t, d, "c").Ready {
		t.Fatalf("a, read after b was ready, was evicted while b was busy: %+v", st)
	}
	org.gate.Store(nil)
	close(gate)
	wait.For(t, "c ready", func() bool { return status(t, d, "c").Ready })
	if st := status(t, d, "b"); st.State != api.StateEvicted || !strings.Contains(st.Error, "evicted to make room for c") {
		t.Fatalf("b: %+v", st)
	}
	if st := status(t, d, "a"); !st.Ready {
		t.Fatalf("a at the end: %+v", st)
	}
}
