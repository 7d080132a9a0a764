package p2p

import (
	"context"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// Two models cached from identical files share their shard IDs (the
// revision names the content). Opening the shard a second time, at the
// other model's path, must not fail: the twin copies the pieces the first
// one gets, so the origin is read once, and it takes over serving the
// content when the first closes.
func TestShardOpenTwiceIsFetchedOnceAndServedByTheTwinAfterClose(t *testing.T) {
	const piece = 64 << 10
	data := randomData(t, 8*piece+100)
	origin := newHTTPOrigin(t, data)
	gate := make(chan struct{})
	gated := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return origin.Source()(ctx, off, n)
	}
	a := startNode(t, "a", nil)
	spec := func(model string) BuildSpec {
		dir := filepath.Join(a.dir, model)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return BuildSpec{ShardID: "rev/f0.bin#0", Name: "f0.bin", Path: filepath.Join(dir, "f0.bin"),
			FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: piece,
			Source: gated, Completion: a.comp, Concurrency: 1}
	}
	open := func() (primary *Shard, twins int) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.shards["rev/f0.bin#0"], len(a.twins["rev/f0.bin#0"])
	}
	type built struct {
		s   *Shard
		err error
	}
	first, second := make(chan built, 1), make(chan built, 1)
	go func() { s, err := a.Build(context.Background(), spec("m1")); first <- built{s, err} }()
	wait.For(t, "the first model's shard to open", func() bool { p, _ := open(); return p != nil })
	go func() { s, err := a.Build(context.Background(), spec("m2")); second <- built{s, err} }()
	wait.For(t, "the second model's shard to open as a twin, or fail", func() bool { _, n := open(); return n == 1 || len(second) == 1 })
	close(gate) // the origin answers only once both are open: the twin follows a shard in progress
	b1, b2 := <-first, <-second
	if b1.err != nil || b2.err != nil {
		t.Fatalf("build m1: %v; build m2: %v", b1.err, b2.err)
	}
	assertFileRange(t, spec("m1").Path, data, b1.s.Manifest())
	assertFileRange(t, spec("m2").Path, data, b2.s.Manifest())
	if got := origin.Sent(); got != int64(len(data)) {
		t.Fatalf("origin sent %d bytes for two opens of a %d-byte shard, want it read once", got, len(data))
	}

	// The first model goes: its twin now serves the content to the fleet.
	if err := b1.s.Close(); err != nil {
		t.Fatal(err)
	}
	if p, n := open(); p != b2.s || n != 0 {
		t.Fatalf("after closing the first, serving %p with %d twins, want the twin %p alone", p, n, b2.s)
	}
	b := startNode(t, "b", nil)
	s, err := b.Open(context.Background(), b2.s.Manifest(), filepath.Join(b.dir, "f0.bin"), b.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(a.addr)}); err != nil {
		t.Fatalf("fetch from the twin after the first closed: %v", err)
	}
	assertFileRange(t, filepath.Join(b.dir, "f0.bin"), data, s.Manifest())
	b2.s.Close()
}

// A second open at the same path is the same file twice, not a twin.
func TestShardOpenTwiceAtOnePathFails(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), 256<<10, BLAKE3)
	a := startNode(t, "a", nil)
	s := seedNode(t, a, data, m, nil)
	defer s.Close()
	if s2, err := a.Open(context.Background(), m, s.Path(), a.comp); err == nil {
		s2.Close()
		t.Fatal("a second open of a shard at the same path succeeded")
	}
}

// A shard is fetched in a staging directory and served from the published
// one: after the rename (the same file), reopening it at its new path must
// find its completion, or a restarted node serves nothing it holds.
func TestCompletionFollowsTheFileAcrossARename(t *testing.T) {
	const piece = 64 << 10
	data := randomData(t, 4*piece+10)
	origin := newHTTPOrigin(t, data)
	a := startNode(t, "a", nil)
	staged := filepath.Join(a.dir, "partial", "f0.bin")
	if err := os.MkdirAll(filepath.Dir(staged), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := a.Build(context.Background(), BuildSpec{ShardID: "rev/f0.bin#0", Name: "f0.bin", Path: staged,
		FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: piece,
		Source: origin.Source(), Completion: a.comp, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := s.Manifest()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	published := filepath.Join(a.dir, "current", "f0.bin")
	if err := os.MkdirAll(filepath.Dir(published), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(staged, published); err != nil {
		t.Fatal(err)
	}
	r, err := a.Open(context.Background(), m, published, a.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Complete() {
		t.Fatal("the renamed shard lost its completion: a restarted node would not serve it")
	}
}

// A completion record written before keys named the file (keyed by the
// skeleton alone) is still found, so an upgraded node serves what it holds
// without fetching it again; its file identity still has to match.
func TestCompletionUnderTheSkeletonKeyIsStillRead(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), 256<<10, BLAKE3)
	a := startNode(t, "a", nil)
	s := seedNode(t, a, data, m, nil)
	key, legacy := s.key, hex.EncodeToString(s.skel[:])
	path := s.Path()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := a.comp.Load(key)
	if err != nil || rec == nil {
		t.Fatalf("no completion record under %s: %v", key, err)
	}
	if err := a.comp.Store(legacy, rec); err != nil {
		t.Fatal(err)
	}
	if err := a.comp.Delete(key); err != nil {
		t.Fatal(err)
	}
	r, err := a.Open(context.Background(), m, path, a.comp)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Complete() {
		t.Fatal("the record under the skeleton key was not read: an upgraded node would fetch what it holds")
	}
	r.Close()

	// Another file of the same shard (recreated: another identity) does
	// not take the record over.
	if err := a.comp.Delete(r.key); err != nil {
		t.Fatal(err)
	}
	// Written beside the old file, then renamed over it: the old inode is
	// still held while the new one is made, so their numbers differ.
	if err := os.WriteFile(path+".new", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	r2, err := a.Open(context.Background(), m, path, a.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if r2.Complete() {
		t.Fatal("a recreated file took over the record of the file it replaced")
	}
}
