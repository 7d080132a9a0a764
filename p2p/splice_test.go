//go:build linux

package p2p

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// seedWithBadPiece opens a copy of the shard on n whose piece bad has one
// byte flipped at offset at within the piece, and claims every piece, as a
// lying or broken peer would.
func seedWithBadPiece(t *testing.T, n *testNode, data []byte, m *Manifest, bad int, at int64) {
	t.Helper()
	off, _ := m.PieceRange(bad)
	seedNode(t, n, data, m, func(b []byte) { b[off+at] ^= 0x55 })
}

// Over plain TCP the receiver splices piece bodies into the file and hashes
// them from it: good pieces count, the one bad piece gets its sender banned
// and is fetched again elsewhere. Over TLS the buffered path does the same.
func TestFetchSplicedPiecesBansCorruptPeer(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		name := map[bool]string{false: "splice", true: "tls"}[encrypt]
		t.Run(name, func(t *testing.T) {
			data := randomData(t, 1<<20)
			m := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3)
			withTLS := func(c *Config) { c.Encrypt = encrypt }
			bad := startNode(t, "bad", withTLS)
			good := startNode(t, "good", withTLS)
			x := startNode(t, "x", withTLS)
			seedWithBadPiece(t, bad, data, m, m.NumPieces()/2, testPiece/2)
			seedNode(t, good, data, m, nil)
			if res := fetchPastBadPeer(t, x, bad, good, data, m); res.PiecesFailed != 1 {
				t.Fatalf("result %+v, want one failed piece", res)
			}
			if st := x.Stats(); st.PiecesVerified != int64(m.NumPieces()) || st.PeerBytesIn < m.Length {
				t.Fatalf("stats %+v", st)
			}
			// The buffered path takes a receive buffer for every chunk;
			// the spliced one (mapping the file to hash it) takes none.
			if usedBuffers := len(x.recv.slots) > 0; usedBuffers != encrypt {
				t.Fatalf("receive buffers used: %v, want %v", usedBuffers, encrypt)
			}
		})
	}
}

// scriptedPeer serves the shard from data, sending each piece's header with
// the first prefix bytes of its body in one write and the rest in another,
// so the receiver's bufio.Reader holds the start of the body when the rest
// is spliced. With stall it never sends the rest.
func scriptedPeer(t *testing.T, m *Manifest, data []byte, prefix int, stall bool) string {
	return fakeMember(t, "script", m, func(c net.Conn, br *bufio.Reader) {
		for {
			fr, err := readFrame(br)
			if err != nil {
				return
			}
			i, err := fr.index(m.NumPieces())
			if err != nil {
				return
			}
			off, n := m.PieceRange(i)
			body := data[off : off+n]
			head := []byte{msgPiece, 0, 0, 0, 8}
			head = append(append(append(head, u32(i)...), u32(int(n))...), body[:prefix]...)
			if _, err := c.Write(head); err != nil {
				return
			}
			if stall {
				_, _ = io.Copy(io.Discard, br)
				return
			}
			if _, err := c.Write(body[prefix:]); err != nil {
				return
			}
		}
	})
}

// A piece body that arrives partly buffered is written from the buffer and
// spliced for the rest; a bad byte in either part is caught.
func TestFetchSplicesAfterBufferedPrefix(t *testing.T) {
	const prefix = 1000
	cases := []struct {
		name    string
		corrupt int64 // offset of a flipped byte within piece 3; -1: none
	}{
		{"clean", -1},
		{"bad byte in buffered prefix", prefix / 2},
		{"bad byte in spliced rest", testPiece - 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := randomData(t, 8*testPiece+4321)
			m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
			served := data
			if c.corrupt >= 0 {
				served = bytes.Clone(data)
				served[3*testPiece+c.corrupt] ^= 1
			}
			script := scriptedPeer(t, m, served, prefix, false)
			good := startNode(t, "good", nil)
			seedNode(t, good, data, m, nil)
			x := startNode(t, "x", nil)
			s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			src := switchingPeers(func() bool { return x.Stats().PeersBanned > 0 }, script, good.addr)
			res, err := s.Fetch(ctx, FetchOptions{Peers: src, PeerRefresh: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
			wantBan := c.corrupt >= 0
			if x.bannedID("script") != wantBan || res.PiecesFailed != map[bool]int64{false: 0, true: 1}[wantBan] {
				t.Fatalf("banned %v, want %v; result %+v", x.bannedID("script"), wantBan, res)
			}
			if len(x.recv.slots) > 0 {
				t.Fatal("receive buffers used: pieces were not spliced")
			}
		})
	}
}

// Waiting for a slow peer mid-piece does not hold the shard's file, so
// closing the shard does not wait for the peer.
func TestSpliceWaitDoesNotHoldFile(t *testing.T) {
	const prefix = 1000
	data := randomData(t, 4*testPiece)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	script := scriptedPeer(t, m, data, prefix, true)
	x := startNode(t, "x", func(c *Config) { c.StallTimeout = time.Hour })
	s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var fetchErr error
	fetched := make(chan struct{})
	go func() {
		_, fetchErr = s.Fetch(ctx, FetchOptions{Peers: peers(script), RequestDepth: 1})
		close(fetched)
	}()
	defer func() { cancel(); <-fetched }()
	// The buffered prefix is in; the receiver now waits for the rest.
	for x.Stats().PeerBytesIn < prefix {
		select {
		case <-fetched:
			t.Fatalf("fetch ended early: %v", fetchErr)
		case <-time.After(time.Millisecond):
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a stalled peer")
	}
}

// hashMapped and hashRead (its fallback) agree with hashing the bytes
// directly, for pieces on and off page boundaries and across map windows.
func TestHashFileRanges(t *testing.T) {
	data := randomData(t, 2*mapWindow+12345)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := int64(os.Getpagesize())
	cases := []struct {
		name   string
		off, n int64
	}{
		{"aligned piece", page, 16 << 10},
		{"unaligned start", 1234, 16 << 10},
		{"one byte", 4097, 1},
		{"across windows", page - 1, mapWindow + 2},
		{"whole file", 0, int64(len(data))},
		{"tail", int64(len(data)) - 100, 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := BLAKE3.new()
			want.Write(data[c.off : c.off+c.n])
			mapped := BLAKE3.new()
			if err := hashMapped(mapped, f, c.off, c.n); err != nil {
				t.Fatal(err)
			}
			read := BLAKE3.new()
			if err := hashRead(read, f, c.off, c.n, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(mapped.Sum(nil), want.Sum(nil)) || !bytes.Equal(read.Sum(nil), want.Sum(nil)) {
				t.Fatal("hash differs from the bytes' hash")
			}
		})
	}
}

// A file shorter than the range (truncated behind our back) is an error,
// not a crash or a silently short hash.
func TestHashFileShortFile(t *testing.T) {
	page := int64(os.Getpagesize())
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, randomData(t, int(page)), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := hashMapped(BLAKE3.new(), f, 0, 3*page); err == nil {
		t.Fatal("hashMapped past the end of the file succeeded")
	}
	if err := hashRead(BLAKE3.new(), f, 0, 3*page, make([]byte, 1000)); err == nil {
		t.Fatal("hashRead past the end of the file succeeded")
	}
}

// TestOpenReservesShardBlocks: opening a shard reserves its byte range on
// disk (a full disk fails the open, not a write halfway), and only its range.
func TestOpenReservesShardBlocks(t *testing.T) {
	data := randomData(t, 6<<20)
	m := manifestFor(t, data, 2<<20, 3<<20, 1<<20, SHA256)
	path := filepath.Join(t.TempDir(), "f")
	f, _, fresh, err := openShardFile(path, m)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if !fresh || st.Size != m.FileSize {
		t.Fatalf("fresh %v size %d, want a fresh file of %d bytes", fresh, st.Size, m.FileSize)
	}
	if got := st.Blocks * 512; got < m.Length || got >= m.FileSize {
		t.Fatalf("%d bytes allocated, want the shard's %d (file %d)", got, m.Length, m.FileSize)
	}
}
