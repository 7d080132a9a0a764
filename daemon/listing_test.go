package daemon

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
)

func TestJudgeListing(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	s := model("a", "s3://bkt/a/")
	objs := func(paths ...string) []origin.Object {
		var out []origin.Object
		for _, p := range paths {
			out = append(out, origin.Object{Key: "a/" + p, Path: p, Size: 1, ETag: "e"})
		}
		return out
	}
	files := func(paths ...string) []fileRecord {
		var out []fileRecord
		for _, p := range paths {
			out = append(out, fileRecord{Key: "a/" + p, Path: p, Size: 1, ETag: "e"})
		}
		return out
	}
	pending := &api.FileSetChange{Gone: []string{"y"}, At: now}
	tests := []struct {
		name                string
		rec                 cacheRecord
		objs                []origin.Object
		accept, record      bool
		gone, came          []string
		confirmed, noChange bool
	}{
		{name: "first fetch", rec: cacheRecord{Spec: s}, objs: objs("x"), accept: true, noChange: true},
		{name: "same file set", rec: cacheRecord{Spec: s, Files: files("x", "y")}, objs: objs("x", "y"), accept: true, noChange: true},
		{name: "source moved", rec: cacheRecord{Spec: model("a", "s3://bkt/b/"), Files: files("x", "y")}, objs: objs("z"), accept: true, noChange: true},
		{name: "file gone: wait for a second listing", rec: cacheRecord{Spec: s, Files: files("x", "y")}, objs: objs("x"), record: true, gone: []string{"y"}},
		{name: "file came: wait too", rec: cacheRecord{Spec: s, Files: files("x")}, objs: objs("x", "z"), record: true, came: []string{"z"}},
		{name: "second listing agrees", rec: cacheRecord{Spec: s, Files: files("x", "y"), Listing: RevisionID("", objs("x")), FilesChanged: pending}, objs: objs("x"), accept: true, record: true, gone: []string{"y"}, confirmed: true},
		{name: "second listing differs: wait again", rec: cacheRecord{Spec: s, Files: files("x", "y"), Listing: RevisionID("", objs("x")), FilesChanged: pending}, objs: objs("x", "z"), record: true, gone: []string{"y"}, came: []string{"z"}},
		{name: "files came back: change forgotten", rec: cacheRecord{Spec: s, Files: files("x", "y"), Listing: RevisionID("", objs("x")), FilesChanged: pending}, objs: objs("x", "y"), accept: true, record: true, noChange: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judgeListing(tt.rec, s, tt.objs, now)
			if v.accept != tt.accept || v.record != tt.record {
				t.Fatalf("accept %v record %v, want %v %v", v.accept, v.record, tt.accept, tt.record)
			}
			if tt.noChange {
				if v.change != nil {
					t.Fatalf("change %+v, want none", v.change)
				}
				return
			}
			if v.change == nil || !slices.Equal(v.change.Gone, tt.gone) || !slices.Equal(v.change.Came, tt.came) || v.change.Confirmed != tt.confirmed {
				t.Fatalf("change %+v, want gone %v came %v confirmed %v", v.change, tt.gone, tt.came, tt.confirmed)
			}
		})
	}
}

// deleteMidDownload deletes one object from S3 as its first download
// starts, as when someone removes a file from the model's prefix.
type deleteMidDownload struct {
	Origin
	once   sync.Once
	delete func()
	path   string
}

func (o *deleteMidDownload) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	if obj.Path == o.path {
		o.once.Do(o.delete)
	}
	return o.Origin.Download(ctx, obj, dst, plan)
}

// TestObjectDeletedMidDownload: an object deleted while the model downloads
// fails that attempt; the next listing (without it) is not acted upon until
// the one after agrees, and the status shows which file went. A file that
// comes back before that is no change; one that stays gone makes a new
// revision without it (checked on a ready cache, at resync).
func TestObjectDeletedMidDownload(t *testing.T) { testObjectDeletedMidDownload(t, newFixture) }

func testObjectDeletedMidDownload(t *testing.T, newFixture func(*testing.T, map[string]int) *fixture) {
	fx := newFixture(t, map[string]int{"a.safetensors": 2 << 20, "b.safetensors": 1 << 20})
	del := func() { fx.delete(t, "llama/b.safetensors") }
	org := &deleteMidDownload{Origin: fx.origin(t, nil), delete: del, path: "b.safetensors"}
	clock := testclock.New()
	d := newDaemonCfg(t, t.TempDir(), org, func(c *Config) {
		c.Clock, c.ResyncInterval, c.FileConcurrency = clock.Now, time.Minute, 1
	})
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	const name = "meta/llama"
	wait.For(t, "download fails on the deleted object", func() bool { return status(t, d, name).Attempts >= 1 })
	clock.Advance(time.Hour)
	var st api.CacheStatus
	// The attempt's failure is recorded before the clock moves on, so that
	// its backoff runs from now.
	wait.For(t, "changed file set awaiting confirmation", func() bool {
		st = status(t, d, name)
		return st.FilesChanged != nil && st.Error != ""
	})
	if st.Ready || st.FilesChanged.Confirmed || !slices.Equal(st.FilesChanged.Gone, []string{"b.safetensors"}) {
		t.Fatalf("after one listing without b: %+v (change %+v), want not ready, change unconfirmed", st, st.FilesChanged)
	}

	// b comes back before the confirming listing: nothing changed after all.
	fx.put(t, "llama/b.safetensors", fx.files["b.safetensors"])
	clock.Advance(time.Hour)
	st = ready(t, d)
	checkFiles(t, st.Path, fx.files)
	if st.FilesChanged != nil || st.Files != 2 {
		t.Fatalf("ready after b came back: %+v (change %+v)", st, st.FilesChanged)
	}

	// b goes for good: the resync sees it, waits for a second listing, and
	// only then publishes a revision without it, the old one ready meanwhile.
	del()
	old := st
	clock.Advance(time.Hour)
	wait.For(t, "resync sees b gone", func() bool {
		st = status(t, d, name)
		return st.FilesChanged != nil && st.Error != ""
	})
	if !st.Ready || st.RevisionID != old.RevisionID || st.FilesChanged.Confirmed {
		t.Fatalf("after one listing without b: %+v (change %+v), want the old revision ready, change unconfirmed", st, st.FilesChanged)
	}
	clock.Advance(time.Hour)
	wait.For(t, "revision without b", func() bool {
		st = status(t, d, name)
		return st.Ready && st.RevisionID != old.RevisionID
	})
	if st.Files != 1 || st.FilesChanged == nil || !st.FilesChanged.Confirmed || !slices.Equal(st.FilesChanged.Gone, []string{"b.safetensors"}) {
		t.Fatalf("new revision: %+v (change %+v), want one file and b reported gone", st, st.FilesChanged)
	}
}
