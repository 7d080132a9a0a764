package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// allocatedBy reports the bytes the process allocated while fn ran.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A frame header is five bytes a peer sends for free: the payload buffer
// must grow with the bytes that actually arrive, not be sized by the
// header, or every connection that announces a manifest-sized frame and
// stops costs tens of MiB.
func TestReadFrameHugeLengthAllocatesOnlyWhatArrives(t *testing.T) {
	in := []byte{msgManifest, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(in[1:], maxManifestFrame)
	in = append(in, "only a few bytes follow"...)
	var err error
	got := allocatedBy(func() {
		_, err = readFrameMax(bufio.NewReader(bytes.NewReader(in)), maxManifestFrame)
	})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: err = %v, want io.ErrUnexpectedEOF", err)
	}
	if got > maxManifestFrame/8 {
		t.Fatalf("a %d-byte frame header with %d bytes behind it allocated %d bytes", 5, len(in)-5, got)
	}
}

// A downloader that asks for a piece and then stops reading (a frozen
// process: its kernel keeps the connection open with a zero window) must
// not hold an upload slot forever: with every slot held so, every other
// member's request is answered busy for good.
func TestUploadToFrozenDownloaderFreesItsSlot(t *testing.T) {
	// The piece must not fit the socket buffers, or the upload completes
	// into them without the downloader reading.
	const piece = 16 << 20
	data := randomData(t, piece)
	m := manifestFor(t, data, 0, piece, piece, BLAKE3)
	seed := startNode(t, "seed", func(c *Config) { c.MaxUploads = 1; c.StallTimeout = 300 * time.Millisecond })
	seedNode(t, seed, data, m, nil)

	// The frozen member: a small receive buffer, one request, no reads.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	raw, err := d.Dial("tcp", seed.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	a, err := newAuth("frozen", oneKey(testKey), false)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := a.client(raw, time.Now().Add(2*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	skel := m.SkeletonID()
	if err := writeFrame(c, msgSubscribe, append(skel[:], m.ShardID...)); err != nil {
		t.Fatal(err)
	}
	if fr, err := readFrameMax(bufio.NewReader(c), maxBitfieldFrame); err != nil || fr.typ != msgBitfield {
		t.Fatalf("subscribe: %v, frame %d", err, fr.typ)
	}
	if err := writeFrame(c, msgRequest, u32(0)); err != nil {
		t.Fatal(err)
	}

	x := startNode(t, "x", nil)
	s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(seed.uploads) == 0 { // the frozen member's request takes the one slot
		if ctx.Err() != nil {
			t.Fatal("the frozen member's request never took the upload slot")
		}
		runtime.Gosched()
	}
	if _, err := s.Fetch(ctx, FetchOptions{Peers: peers(seed.addr), PeerRefresh: 50 * time.Millisecond}); err != nil {
		t.Fatalf("fetch while a frozen member holds the seed's upload slot: %v", err)
	}
	assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
}
