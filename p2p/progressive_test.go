package p2p

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// gatedSource serves data like an origin but holds every read at or past
// offset gate until open is closed, so a test can look at the fleet while the
// origin is half way through a shard.
func gatedSource(data []byte, gate int64, open <-chan struct{}) (ByteSource, *atomic.Int64) {
	var read atomic.Int64
	return func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		if off >= gate {
			select {
			case <-open:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		read.Add(n)
		return io.NopCloser(bytes.NewReader(data[off : off+n])), nil
	}, &read
}

func buildSpec(data []byte, path string, comp Completion, src ByteSource) BuildSpec {
	return BuildSpec{ShardID: "test/file#0", Name: "file", Path: path, FileSize: int64(len(data)),
		Length: int64(len(data)), PieceLength: testPiece, Algo: BLAKE3, Source: src, Completion: comp}
}

// A follower gets the pieces an origin has read before the origin has read
// the whole shard, verified against hashes the origin announces with them.
func TestFollowerGetsPiecesWhileOriginBuilds(t *testing.T) {
	data := randomData(t, 16*testPiece)
	half := int64(8 * testPiece)
	open := make(chan struct{})
	src, _ := gatedSource(data, half, open)
	origin := startNode(t, "origin", nil)
	follower := startNode(t, "follower", nil)
	spec := buildSpec(data, filepath.Join(origin.dir, "f"), origin.comp, src)

	built := make(chan error, 1)
	var originShard *Shard
	go func() {
		s, err := origin.Build(context.Background(), spec)
		originShard = s
		built <- err
	}()
	wait.For(t, "the origin serving its manifest in progress", func() bool {
		_, err := origin.FetchManifest(context.Background(), origin.addr, spec.ShardID)
		return errors.Is(err, ErrInProgress)
	})

	s, err := follower.OpenPartial(context.Background(), spec.Skeleton(), filepath.Join(follower.dir, "f"), follower.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	fetched := make(chan error, 1)
	go func() {
		_, err := s.Fetch(ctx, FetchOptions{Peers: peers(origin.addr), PeerRefresh: 20 * time.Millisecond})
		fetched <- err
	}()
	// The origin is stuck at the half: the follower must still get that half.
	wait.For(t, "all 8 pieces held", func() bool { return s.Have().Count() == 8 })
	if s.Complete() {
		t.Fatal("complete before the origin read the second half")
	}
	close(open)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	defer originShard.Close()
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	cancel()
	want := originShard.Manifest()
	if got := s.Manifest(); got.ID() != want.ID() {
		t.Fatalf("follower's manifest %s differs from the origin's %s", got.ID(), want.ID())
	}
	if ref := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3); !bytes.Equal(ref.Hashes, want.Hashes) {
		t.Fatal("origin's hashes are not the hashes of the data")
	}
	assertFileRange(t, filepath.Join(follower.dir, "f"), data, want)
	if m, err := follower.FetchManifest(context.Background(), follower.addr, spec.ShardID); err != nil || m.ID() != want.ID() {
		t.Fatalf("follower serves manifest %v, %v", m, err)
	}
}

// An interrupted build keeps the pieces (and hashes) it made durable, and
// the next build reads only the rest from the origin.
func TestBuildResumesAfterInterruption(t *testing.T) {
	data := randomData(t, 16*testPiece)
	half := int64(8 * testPiece)
	open := make(chan struct{})
	src, read := gatedSource(data, half, open)
	n := startNode(t, "origin", nil)
	spec := buildSpec(data, filepath.Join(n.dir, "f"), n.comp, src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := n.Build(ctx, spec)
		done <- err
	}()
	wait.For(t, "8 pieces verified", func() bool { return n.Stats().PiecesVerified == 8 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("build finished with its source held")
	}
	close(open)
	read.Store(0)
	s, err := n.Build(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := read.Load(); got != int64(len(data))-half {
		t.Fatalf("second build read %d bytes from the origin, want %d", got, int64(len(data))-half)
	}
	if ref := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3); s.Manifest().ID() != ref.ID() {
		t.Fatal("resumed build made a different manifest")
	}
	assertFileRange(t, spec.Path, data, s.Manifest())
}

// A peer announcing a hash that contradicts one already known is banned,
// and its pieces are not used.
func TestConflictingHashBansPeer(t *testing.T) {
	data := randomData(t, 4*testPiece)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3)
	liarData := bytes.Clone(data)
	liarData[0] ^= 1
	liarM := manifestFor(t, liarData, 0, int64(len(liarData)), testPiece, BLAKE3)
	liar := startNode(t, "liar", nil)
	seedNode(t, liar, liarData, liarM, nil)
	x := startNode(t, "x", nil)
	s, err := x.OpenPartial(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// x learned the true hash of piece 0 (from the origin, say).
	if err := s.learn(0, m.PieceHash(0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = s.Fetch(ctx, FetchOptions{Peers: peers(liar.addr), PeerRefresh: 20 * time.Millisecond})
	if err == nil {
		t.Fatal("fetched from a peer that lied about a hash")
	}
	if !x.bannedID("liar") {
		t.Fatal("lying peer not banned")
	}
	if s.Have().Count() != 0 {
		t.Fatalf("kept %d pieces from a lying peer", s.Have().Count())
	}
}

// A partial shard's verified pieces and their hashes survive a reopen.
func TestPartialShardResumesAcrossReopen(t *testing.T) {
	data := randomData(t, 8*testPiece)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3)
	seed := startNode(t, "seed", func(c *Config) { c.UploadLimit = 4 * testPiece })
	seedNode(t, seed, data, m, nil)
	x := startNode(t, "x", nil)
	path := filepath.Join(x.dir, "f")
	s, err := x.OpenPartial(context.Background(), m, path, x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Fetch(ctx, FetchOptions{Peers: peers(seed.addr), PeerRefresh: 20 * time.Millisecond})
		done <- err
	}()
	wait.For(t, "2 pieces held", func() bool { return s.Have().Count() >= 2 })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	kept := s.Have()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = x.OpenPartial(context.Background(), m, path, x.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Have(); got.Count() != kept.Count() || got.Count() == 0 {
		t.Fatalf("reopened with %d pieces, had %d", got.Count(), kept.Count())
	}
	for i := range m.NumPieces() {
		if kept.Has(i) && !bytes.Equal(s.pieceHash(i), m.PieceHash(i)) {
			t.Fatalf("piece %d: hash not restored", i)
		}
	}
	if _, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(seed.addr), PeerRefresh: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	assertFileRange(t, path, data, m)
}

func FuzzLearnBitfield(f *testing.F) {
	data := make([]byte, 4*MinPieceLength)
	m := manifestFor(f, data, 0, int64(len(data)), MinPieceLength, BLAKE3)
	f.Add(append([]byte{0xf0}, m.Hashes...))
	f.Add([]byte{0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, payload []byte) {
		s := &Shard{m: m.clone(), known: NewBitfield(4), have: NewBitfield(4)}
		clear(s.m.Hashes)
		fe := &fetch{s: s}
		has, err := fe.learnBitfield(payload)
		if err != nil {
			return
		}
		for i := range 4 {
			if has.Has(i) && s.pieceHash(i) == nil {
				t.Fatalf("piece %d announced without a hash", i)
			}
		}
	})
}

// ReadsStarted fires once, while the last reads are still streaming: the
// daemon starts its next build then.
func TestBuildReportsReadsStarted(t *testing.T) {
	data := randomData(t, 8*testPiece)
	open := make(chan struct{})
	src, _ := gatedSource(data, int64(7*testPiece), open) // the last piece is held
	n := startNode(t, "origin", nil)
	spec := buildSpec(data, filepath.Join(n.dir, "f"), n.comp, src)
	var calls atomic.Int32
	started := make(chan struct{})
	spec.ReadsStarted = func() {
		if calls.Add(1) == 1 {
			close(started)
		}
	}
	built := buildAsync(t, n, spec)
	<-started // must come although the last piece is still being read
	select {
	case err := <-built:
		t.Fatalf("build ended (%v) with its last read held", err)
	default:
	}
	close(open)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	if c := calls.Load(); c != 1 {
		t.Fatalf("ReadsStarted called %d times", c)
	}
}
