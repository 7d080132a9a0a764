package p2p

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// liveHeap is the heap still reachable after a full collection (two, so
// sync.Pool's victim cache is emptied too).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// An encrypted connection cannot use sendfile, so uploads copy through a
// buffer; that buffer belongs to the upload, not to the connection. A node
// serving a shard keeps a connection open to every member fetching it, and
// a buffer per connection made the memory of an encrypted node grow with
// its peers rather than with its upload slots.
func TestTLSServingHoldsNoBufferPerConnection(t *testing.T) {
	const piece, conns = 64 << 10, 24
	data := randomData(t, 4*piece)
	m := manifestFor(t, data, 0, int64(len(data)), piece, BLAKE3)
	seed := startNode(t, "seed", func(c *Config) { c.Encrypt = true })
	seedNode(t, seed, data, m, nil)
	a, err := newAuth("member", oneKey(testKey), true)
	if err != nil {
		t.Fatal(err)
	}
	skel := m.SkeletonID()

	before := liveHeap()
	open := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range conns {
		raw, err := net.Dial("tcp", seed.addr)
		if err != nil {
			t.Fatal(err)
		}
		c, _, err := a.client(raw, time.Now().Add(5*time.Second), "")
		if err != nil {
			raw.Close()
			t.Fatal(err)
		}
		open = append(open, c)
		// Each member fetches a piece, so the seed has uploaded on every
		// connection, and stays connected as a fetching member does.
		if err := writeFrame(c, msgSubscribe, append(skel[:], m.ShardID...)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		if fr, err := readFrameMax(br, maxBitfieldFrame); err != nil || fr.typ != msgBitfield {
			t.Fatalf("subscribe: %v, frame %d", err, fr.typ)
		}
		if err := writeFrame(c, msgRequest, u32(i%m.NumPieces())); err != nil {
			t.Fatal(err)
		}
		if fr, err := readFrame(br); err != nil || fr.typ != msgPiece {
			t.Fatalf("request: %v, frame %d", err, fr.typ)
		}
		if _, err := io.CopyN(io.Discard, br, piece); err != nil {
			t.Fatal(err)
		}
	}
	perConn := (int64(liveHeap()) - int64(before)) / conns
	t.Logf("%d KiB live per encrypted member connection (both ends)", perConn>>10)
	// Both ends' TLS state is a few records' worth; a piece-sized copy
	// buffer per connection is several times that.
	if perConn > 96<<10 {
		t.Fatalf("%d KiB live per connection: the seed holds a copy buffer per member rather than per upload", perConn>>10)
	}
}

// Over TLS, piece bytes pass through the receive pool on their way to the
// hasher and the disk. While the disk lags, a connection keeps reading
// until it holds its share of buffers: what that share costs is what every
// encrypted connection may hold, and it need not be more than a few TLS
// records per buffer.
func TestTLSReceiveHoldsLittleWhileTheDiskLags(t *testing.T) {
	const piece = 1 << 20
	data := randomData(t, 4*piece)
	m := manifestFor(t, data, 0, int64(len(data)), piece, BLAKE3)
	tlsOn := func(c *Config) { c.Encrypt = true }
	seed := startNode(t, "seed", tlsOn)
	seedNode(t, seed, data, m, nil)
	x := startNode(t, "x", tlsOn)
	s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	s.fileMu.Lock() // the disk stalls: no piece bytes can be written
	locked := true
	defer func() {
		if locked {
			s.fileMu.Unlock()
		}
	}()
	fetched := make(chan error, 1)
	go func() {
		_, err := s.Fetch(context.Background(), FetchOptions{Peers: peers(seed.addr)})
		fetched <- err
	}()
	wait.For(t, "the connection to hold all the buffers it may", func() bool {
		return len(x.recv.slots) == buffersPerPeerConn
	})
	held := len(x.recv.slots) * x.recv.size
	t.Logf("%d KiB held by one encrypted connection while the disk lags", held>>10)
	if held > 512<<10 {
		t.Errorf("one encrypted connection holds %d KiB of piece bytes while the disk lags", held>>10)
	}
	s.fileMu.Unlock()
	locked = false
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
}
