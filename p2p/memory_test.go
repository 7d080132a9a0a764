package p2p

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
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
