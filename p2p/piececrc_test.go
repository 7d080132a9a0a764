package p2p

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// failingReader returns err once it has given n bytes.
type failingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	k, err := f.r.Read(p)
	f.n -= int64(k)
	return k, err
}

func crc32Update(crc uint64, p []byte) uint64 {
	return uint64(crc32.Update(uint32(crc), crc32.IEEETable, p))
}

// checkPieceCRCs fails unless s has a CRC for every piece, each the CRC of
// the piece's bytes in data.
func checkPieceCRCs(t *testing.T, who string, s *Shard, data []byte) {
	t.Helper()
	got := s.PieceCRCs()
	if len(got) != s.Manifest().NumPieces() {
		t.Fatalf("%s: %d piece CRCs, want %d", who, len(got), s.Manifest().NumPieces())
	}
	for _, p := range got {
		if want := uint64(crc32.ChecksumIEEE(data[p.Off : p.Off+p.Len])); p.CRC != want {
			t.Fatalf("%s: CRC of %d+%d is %x, want %x", who, p.Off, p.Len, p.CRC, want)
		}
	}
}

// The CRC each piece is taken with, by the origin and by a follower alike,
// is the CRC of the piece's bytes, also when an origin response broke half
// way into a piece and the piece was read again.
func TestPieceCRCs(t *testing.T) {
	data := randomData(t, 16*testPiece)
	var mu sync.Mutex
	var requests [][2]int64
	src := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, [2]int64{off, n})
		var r io.Reader = bytes.NewReader(data[off : off+n])
		if len(requests) == 1 {
			// The first response breaks half way into its piece.
			r = &failingReader{r: r, n: testPiece / 2, err: errors.New("connection reset")}
		}
		return io.NopCloser(r), nil
	}
	origin := startNode(t, "origin", nil)
	spec := buildSpec(data, filepath.Join(origin.dir, "f"), origin.comp, src)
	spec.Concurrency, spec.PieceCRC = 1, crc32Update
	built, err := origin.Build(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer built.Close()
	mu.Lock()
	if len(requests) != 17 || requests[0] != requests[1] {
		t.Fatalf("origin requests %v, want 16 pieces and the first again", requests)
	}
	mu.Unlock()
	assertFileRange(t, filepath.Join(origin.dir, "f"), data, built.Manifest())
	checkPieceCRCs(t, "origin", built, data)

	follower := startNode(t, "follower", nil)
	s, err := follower.Open(context.Background(), built.Manifest(), filepath.Join(follower.dir, "f"), follower.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(origin.addr), PeerRefresh: 20 * time.Millisecond, PieceCRC: crc32Update}); err != nil {
		t.Fatal(err)
	}
	checkPieceCRCs(t, "follower", s, data)

	// Reopened from its completion record, the shard has no CRCs: those
	// pieces were verified by an earlier run, and must be read back.
	s.Close()
	again, err := follower.Open(context.Background(), built.Manifest(), filepath.Join(follower.dir, "f"), follower.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if !again.Complete() || len(again.PieceCRCs()) != 0 {
		t.Fatalf("reopened: complete %v with %d piece CRCs, want complete with none", again.Complete(), len(again.PieceCRCs()))
	}
}

// A follower free to help reads from S3, from the shard's end, the pieces
// its origin has not reached (helpGap or more past its run), once it knows what its peers hold; the
// origin then takes those from it. Between them the object is read once.
func TestHelperReadsTheTailOnce(t *testing.T) {
	data := randomData(t, 16*testPiece)
	open, reached := make(chan struct{}), make(chan struct{})
	gated, originRead := gatedSource(data, 8*testPiece, open)
	var once sync.Once
	originSrc := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		if off >= 8*testPiece {
			once.Do(func() { close(reached) }) // pieces 0-7 are in
		}
		return gated(ctx, off, n)
	}
	helperSrc, helperRead := gatedSource(data, int64(len(data)), nil) // never held
	var helperOffsets []int64
	var mu sync.Mutex
	helperLog := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		mu.Lock()
		helperOffsets = append(helperOffsets, off)
		mu.Unlock()
		return helperSrc(ctx, off, n)
	}
	origin := startNode(t, "origin", nil)
	follower := startNode(t, "follower", nil)
	spec := buildSpec(data, filepath.Join(origin.dir, "f"), origin.comp, originSrc)
	spec.Concurrency, spec.Peers = 1, peers(follower.addr)

	s, err := follower.OpenPartial(context.Background(), spec.Skeleton(), filepath.Join(follower.dir, "f"), follower.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	built := buildAsync(t, origin, spec)
	<-reached
	fetched := make(chan error, 1)
	go func() {
		_, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(origin.addr), Origin: helperLog, OriginAfter: time.Hour,
			OriginConcurrency: 1, PeerRefresh: 20 * time.Millisecond, OriginHelp: func() (int, int, bool) { return 0, 1, true }})
		fetched <- err
	}()
	// The origin is held at the half: the helper takes pieces 15 down to
	// 8+helpGap, leaving those nearer the origin's run to the origin.
	wait.For(t, "the follower holds all but the gap", func() bool { return s.Have().Count() == 8+16-(8+helpGap) })
	// The origin must know what the helper holds before it goes on: the
	// helper lists the origin as a subscriber once it has written its
	// bitfield, and the origin counts those pieces (or later haves) only
	// when it has read them, a moment after.
	wait.For(t, "the origin knows the helper's pieces", func() bool {
		for i := 8 + helpGap; i < 16; i++ {
			if !peerHolds(origin.Node, spec.Skeleton().ShardID, i) {
				return false
			}
		}
		return true
	})
	close(open)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, off := range helperOffsets {
		if off < (8+helpGap)*testPiece {
			t.Errorf("helper read at %d, before piece %d", off, 8+helpGap)
		}
	}
	if got := originRead.Load() + helperRead.Load(); got != int64(len(data)) {
		t.Errorf("origin read %d and helper %d bytes: %d in all, want %d", originRead.Load(), helperRead.Load(), got, len(data))
	}
	assertFileRange(t, filepath.Join(follower.dir, "f"), data, s.Manifest())
}
