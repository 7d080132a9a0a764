package p2p

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

const testPiece = 64 << 10

// A cold shard: node A is its origin and builds the manifest from S3 (an
// HTTP range server here); B and C then fill from A and from each other.
func TestSwarmColdBuildThenFill(t *testing.T) {
	data := randomData(t, 3<<20+12345)
	origin := newHTTPOrigin(t, data)
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil)
	c := startNode(t, "c", nil)
	ctx := context.Background()

	sa, err := a.Build(ctx, BuildSpec{ShardID: "m/f#0", Name: "f", Path: filepath.Join(a.dir, "f"),
		FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: testPiece,
		Source: origin.Source(), Completion: a.comp})
	if err != nil {
		t.Fatal(err)
	}
	m := sa.Manifest()
	if want := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3); m.Algo != BLAKE3 || !bytes.Equal(m.Hashes, want.Hashes) {
		t.Fatal("built manifest differs from the hashes of the data")
	}
	// The manifest travels by gossip: encode and decode it on the way.
	enc, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, x := range []struct {
		n     *testNode
		other *testNode
	}{{b, c}, {c, b}} {
		wg.Go(func() {
			mm, err := DecodeManifest(enc)
			if err != nil {
				t.Error(err)
				return
			}
			s, err := x.n.Open(ctx, mm, filepath.Join(x.n.dir, "f"), x.n.comp)
			if err != nil {
				t.Error(err)
				return
			}
			res, err := s.Fetch(ctx, FetchOptions{Peers: peers(a.addr, x.other.addr, x.n.addr)})
			if err != nil {
				t.Error(err)
				return
			}
			if res.OriginBytes != 0 || res.PeerBytes != m.Length {
				t.Errorf("%s: %+v, want all %d bytes from peers", x.n.cfg.NodeID, res, m.Length)
			}
		})
	}
	wg.Wait()
	for _, n := range []*testNode{a, b, c} {
		assertFileRange(t, filepath.Join(n.dir, "f"), data, m)
	}
	if sent := origin.Sent(); sent != int64(len(data)) {
		t.Fatalf("origin sent %d bytes, want exactly one copy (%d)", sent, len(data))
	}
	if got := a.Stats().PeerBytesOut + b.Stats().PeerBytesOut + c.Stats().PeerBytesOut; got != 2*m.Length {
		t.Fatalf("peers uploaded %d bytes, want %d", got, 2*m.Length)
	}
}

// With a manifest already known, all three start at once: A reads from the
// origin and serves pieces as they verify while B and C pull from A and each
// other. Two shards of one file are fetched into the same file.
func TestSwarmPipelinedFromOrigin(t *testing.T) {
	data := randomData(t, 4<<20+777)
	origin := newHTTPOrigin(t, data)
	shards, err := SplitFile(int64(len(data)), 2<<20, testPiece)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*testNode{startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)}
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, sh := range shards {
		m := manifestFor(t, data, sh.Offset, sh.Length, testPiece, SHA1)
		for k, n := range nodes {
			wg.Go(func() {
				s, err := n.Open(ctx, m, filepath.Join(n.dir, "f"), n.comp)
				if err != nil {
					t.Error(err)
					return
				}
				o := FetchOptions{Peers: peers(nodes[0].addr, nodes[1].addr, nodes[2].addr), PeerRefresh: 50 * time.Millisecond}
				if k == 0 {
					o.Origin = origin.Source()
				}
				if _, err := s.Fetch(ctx, o); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	for _, n := range nodes {
		assertFileRange(t, filepath.Join(n.dir, "f"), data, &Manifest{FileSize: int64(len(data)), Length: int64(len(data))})
	}
	if sent := origin.Sent(); sent != int64(len(data)) {
		t.Fatalf("origin sent %d bytes, want exactly %d", sent, len(data))
	}
	var in int64
	for _, n := range nodes {
		in += n.Stats().PeerBytesIn
	}
	if in != 2*int64(len(data)) {
		t.Fatalf("peers received %d bytes, want %d", in, 2*len(data))
	}
}

// seedNode opens a complete copy of the shard on n. A non-nil corrupt
// changes the copy first, and its pieces are then claimed without checking,
// as a lying or broken peer would.
func seedNode(t *testing.T, n *testNode, data []byte, m *Manifest, corrupt func(b []byte)) *Shard {
	t.Helper()
	b := append([]byte(nil), data...)
	if corrupt != nil {
		corrupt(b)
	}
	path := filepath.Join(n.dir, "f")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := n.Open(context.Background(), m, path, n.comp)
	if err != nil {
		t.Fatal(err)
	}
	if corrupt != nil {
		for i := range m.NumPieces() {
			s.markVerified(i, nil)
		}
	} else if _, err := s.Recheck(context.Background()); err != nil || !s.Complete() {
		t.Fatalf("recheck: complete=%v err=%v", s.Complete(), err)
	}
	if !s.Complete() {
		t.Fatal("seed not complete after open")
	}
	return s
}

// switchingPeers lists only the first peer until ready() holds, then all.
func switchingPeers(ready func() bool, first string, rest ...string) PeerSource {
	return PeerFunc(func() []string {
		if ready() {
			return append([]string{first}, rest...)
		}
		return []string{first}
	})
}

// fetchPastBadPeer fills m on x, offering only bad until x bans it and good
// after that, so bad is certainly asked first; it checks that the file came
// out right, bad is banned and good is not.
func fetchPastBadPeer(t *testing.T, x, bad, good *testNode, data []byte, m *Manifest) FetchResult {
	t.Helper()
	s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := switchingPeers(func() bool { return x.Stats().PeersBanned > 0 }, bad.addr, good.addr)
	res, err := s.Fetch(ctx, FetchOptions{Peers: src, PeerRefresh: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
	if !x.bannedID("bad") || x.bannedID("good") {
		t.Fatalf("banned bad=%v good=%v, result %+v", x.bannedID("bad"), x.bannedID("good"), res)
	}
	return res
}

func TestSwarmBansCorruptingPeer(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	bad := startNode(t, "bad", nil)
	good := startNode(t, "good", nil)
	x := startNode(t, "x", func(c *Config) { c.StallTimeout = time.Second })
	seedNode(t, bad, data, m, func(b []byte) {
		for i := range b {
			b[i] ^= 0x55
		}
	})
	seedNode(t, good, data, m, nil)
	if res := fetchPastBadPeer(t, x, bad, good, data, m); res.PiecesFailed == 0 || x.Stats().PiecesFailed == 0 {
		t.Fatalf("no failed piece counted: result %+v", res)
	}
	// The ban holds the other way too: x now refuses to serve "bad".
	again := startNode(t, "bad", nil)
	s2, err := again.Open(context.Background(), m, filepath.Join(again.dir, "f"), again.comp)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	out := x.Stats().PeerBytesOut
	if _, err := s2.Fetch(short, FetchOptions{Peers: peers(x.addr), PeerRefresh: 50 * time.Millisecond}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("banned node fetched from x: %v", err)
	}
	if x.Stats().PeerBytesOut != out {
		t.Fatal("x served a banned node")
	}
}

// stallingPeer is a member (it holds the key) that claims every piece and,
// when asked, sends a piece header and then nothing.
func stallingPeer(t *testing.T, m *Manifest) (addr string, requests func() int) {
	var mu sync.Mutex
	n := 0
	addr = fakeMember(t, "stall", m, func(c net.Conn, br *bufio.Reader) {
		fr, err := readFrame(br)
		if err != nil {
			return
		}
		mu.Lock()
		n++
		mu.Unlock()
		_ = writeFrame(c, msgPiece, append(fr.payload[:4:4], u32(testPiece)...))
		_, _ = io.Copy(io.Discard, br) // hold the connection open, silent
	})
	return addr, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestSwarmAbandonsStalledPeer(t *testing.T) {
	data := randomData(t, 512<<10)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	stall, requests := stallingPeer(t, m)
	good := startNode(t, "good", nil)
	x := startNode(t, "x", func(c *Config) { c.StallTimeout = 200 * time.Millisecond })
	seedNode(t, good, data, m, nil)
	s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The good peer is offered only once the staller holds a request, so
	// the download can only finish if the stalled piece is given back.
	src := switchingPeers(func() bool { return requests() > 0 }, stall, good.addr)
	if _, err := s.Fetch(ctx, FetchOptions{Peers: src, PeerRefresh: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
	if requests() == 0 {
		t.Fatal("stalling peer never asked")
	}
	if x.bannedID("stall") {
		t.Fatal("a stalled peer is not a bad peer")
	}
}

func TestSwarmResumeFetchesOnlyMissingPieces(t *testing.T) {
	data := randomData(t, 2<<20)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	seed := startNode(t, "seed", func(c *Config) { c.UploadLimit = 4 << 20 })
	seedNode(t, seed, data, m, nil)
	x := startNode(t, "x", nil)
	path := filepath.Join(x.dir, "f")

	s, err := x.Open(context.Background(), m, path, x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Poll, not For: it may not end the test from this goroutine; the
		// fetch's own error reports a wait that ended early.
		_ = wait.Poll(t, func() error {
			if s.Have().Count() < m.NumPieces()/3 {
				return errors.New("a third not yet fetched")
			}
			return nil
		})
		cancel()
	}()
	if _, err := s.Fetch(ctx, FetchOptions{Peers: peers(seed.addr)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted fetch: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart: a new shard handle over the same file and completion store.
	s, err = x.Open(context.Background(), m, path, x.comp)
	if err != nil {
		t.Fatal(err)
	}
	kept := s.Have().Count()
	if kept == 0 || kept == m.NumPieces() {
		t.Fatalf("after restart %d of %d pieces kept", kept, m.NumPieces())
	}
	// The seed may still be finishing the upload the first fetch abandoned.
	wait.For(t, "the seed to drop the stopped fetch", func() bool { return seed.Stats().PeersConnected == 0 })
	outBefore := seed.Stats().PeerBytesOut
	res, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(seed.addr)})
	if err != nil {
		t.Fatal(err)
	}
	assertFileRange(t, path, data, m)
	missing := int64(m.NumPieces() - kept)
	if res.PiecesFromPeers != missing || res.PeerBytes != missing*testPiece || seed.Stats().PeerBytesOut-outBefore != missing*testPiece {
		t.Fatalf("resume moved %+v (seed sent %d), want exactly %d missing pieces", res, seed.Stats().PeerBytesOut-outBefore, missing)
	}
}

func TestResumeIgnoresCompletionWhenFileIsReplaced(t *testing.T) {
	data := randomData(t, 256<<10)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	x := startNode(t, "x", nil)
	path := filepath.Join(x.dir, "f")
	cases := map[string]func(){
		"deleted": func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		},
		"cut short": func() {
			if err := os.Truncate(path, m.FileSize/2); err != nil {
				t.Fatal(err)
			}
		},
		"recreated at full size": func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, make([]byte, len(data)), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			seedNode(t, x, data, m, nil).Close()
			damage()
			s, err := x.Open(context.Background(), m, path, x.comp)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.Have().Count(); got != 0 {
				t.Fatalf("%d pieces trusted from a stale completion record", got)
			}
		})
	}
	t.Run("untouched file resumes", func(t *testing.T) {
		seedNode(t, x, data, m, nil).Close()
		s, err := x.Open(context.Background(), m, path, x.comp)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Complete() {
			t.Fatal("complete shard not trusted after reopen")
		}
	})
}

func TestOriginFallbackAndCorruptOrigin(t *testing.T) {
	data := randomData(t, 512<<10)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	origin := newHTTPOrigin(t, data)

	t.Run("alone node falls back after delay", func(t *testing.T) {
		x := startNode(t, "x", nil)
		s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(), Origin: origin.Source(), OriginAfter: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if res.OriginBytes != m.Length || res.PiecesFromOrigin != int64(m.NumPieces()) {
			t.Fatalf("result %+v", res)
		}
		assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
	})
	t.Run("origin that changed is reported", func(t *testing.T) {
		x := startNode(t, "y", nil)
		s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
		if err != nil {
			t.Fatal(err)
		}
		wrong := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(strings.Repeat("x", int(n)))), nil
		}
		_, err = s.Fetch(context.Background(), FetchOptions{Origin: wrong})
		if !errors.Is(err, ErrOriginCorrupt) {
			t.Fatalf("err = %v, want ErrOriginCorrupt", err)
		}
		if s.Have().Count() != 0 {
			t.Fatal("corrupt origin pieces counted as present")
		}
	})
}

// With one upload slot, three downloaders of the same seed get busy answers
// and retry; all still finish with identical files.
func TestSwarmUploadCap(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3)
	seed := startNode(t, "seed", func(c *Config) { c.MaxUploads = 1 })
	seedNode(t, seed, data, m, nil)
	var wg sync.WaitGroup
	for _, id := range []string{"x", "y", "z"} {
		n := startNode(t, id, nil)
		wg.Go(func() {
			s, err := n.Open(context.Background(), m, filepath.Join(n.dir, "f"), n.comp)
			if err != nil {
				t.Error(err)
				return
			}
			// Only the seed: every piece must come through its one slot.
			if _, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(seed.addr)}); err != nil {
				t.Error(err)
				return
			}
			assertFileRange(t, filepath.Join(n.dir, "f"), data, m)
		})
	}
	wg.Wait()
	if got := seed.Stats().PeerBytesOut; got != 3*m.Length {
		t.Fatalf("seed sent %d bytes, want %d", got, 3*m.Length)
	}
}

func TestRecheckCountsOnlyMatchingPieces(t *testing.T) {
	data := randomData(t, 8*testPiece)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3)
	x := startNode(t, "x", nil)
	b := append([]byte(nil), data...)
	b[2*testPiece+5] ^= 1 // piece 2 damaged
	b[7*testPiece] ^= 1   // piece 7 damaged
	path := filepath.Join(x.dir, "f")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := x.Open(context.Background(), m, path, x.comp)
	if err != nil {
		t.Fatal(err)
	}
	found, err := s.Recheck(context.Background())
	if err != nil || found != 6 || s.Have().Has(2) || s.Have().Has(7) {
		t.Fatalf("found %d (%08b), err %v", found, s.Have().Bytes(), err)
	}
	s.Close()
	// The result is durable: a reopen trusts it without hashing.
	s, err = x.Open(context.Background(), m, path, x.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Have().Count() != 6 {
		t.Fatalf("after reopen %d pieces", s.Have().Count())
	}
}

// A shard knows whether the file at its path is still the one it holds:
// a file removed and written again under the same name is not.
func TestHoldsFileAt(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), 256<<10, BLAKE3)
	a := startNode(t, "a", nil)
	s := seedNode(t, a, data, m, nil)
	path := filepath.Join(a.dir, "f")
	if !s.HoldsFileAt(path) {
		t.Fatal("the shard does not hold the file it opened")
	}
	if s.HoldsFileAt(filepath.Join(a.dir, "other")) {
		t.Fatal("the shard holds a file that does not exist")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if s.HoldsFileAt(path) {
		t.Fatal("a file recreated under the shard's path counts as the one it holds")
	}
}
