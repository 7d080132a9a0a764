package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// publisher is a real zmq4 PUB socket sending vLLM-shaped messages.
type publisher struct {
	t    *testing.T
	sock zmq4.Socket
	addr string
}

func startPublisher(t *testing.T, addr string) *publisher {
	t.Helper()
	sock := zmq4.NewPub(t.Context())
	if err := sock.Listen("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	p := &publisher{t: t, sock: sock, addr: sock.Addr().String()}
	t.Cleanup(func() { _ = sock.Close() })
	return p
}

func (p *publisher) send(seq uint64, payload []byte) {
	p.t.Helper()
	msg := zmq4.NewMsgFrom([]byte("kv@pod@model"), binary.BigEndian.AppendUint64(nil, seq), payload)
	if err := p.sock.Send(msg); err != nil {
		p.t.Fatal(err)
	}
}

func startSubscriber(t *testing.T, s *Subscriber) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func TestSubscriberFollowsPublisherThroughGarbageAndRestart(t *testing.T) {
	pub := startPublisher(t, "127.0.0.1:0")
	x := NewIndex(DefaultLimits(), time.Hour, nil)
	sub := &Subscriber{Backend: "http://b1", Endpoint: "tcp://" + pub.addr, Topic: "kv@pod@model", Index: x, MinBackoff: 10 * time.Millisecond}
	startSubscriber(t, sub)

	// A PUB drops what it sends before the subscription reaches it, so the
	// first batch is repeated until seen (a repeat reads as a restart and
	// is applied again from empty, which is harmless here).
	wait.For(t, "first batch", func() bool {
		pub.send(1, arrayBatch(t, storedArr([]uint64{11, 12, 13}, nil)))
		n, ok := x.Match("http://b1", []uint64{11, 12, 13})
		return ok && n == 3
	})
	pub.send(2, arrayBatch(t, removedArr(12)))
	wait.For(t, "removal", func() bool { return !x.Holds("http://b1", 12) })

	// Garbage is counted and skipped; the stream goes on.
	pub.send(3, []byte("not msgpack"))
	if err := pub.sock.Send(zmq4.NewMsgFrom([]byte("kv@pod@model"), []byte{1})); err != nil {
		t.Fatal(err)
	}
	// So is a message under another engine's topic.
	if err := pub.sock.Send(zmq4.NewMsgFrom([]byte("kv@pod@model-2"), binary.BigEndian.AppendUint64(nil, 3), arrayBatch(t, removedArr(11)))); err != nil {
		t.Fatal(err)
	}
	pub.send(3, arrayBatch(t, map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(14)}, "parent_block_hash": uint64(13), "token_ids": []int{1}, "block_size": 1}))
	wait.For(t, "batch after garbage", func() bool { return x.Holds("http://b1", 14) })
	c := sub.Counters()
	if c.Malformed.Load() != 1 || c.BadFrames.Load() != 1 || c.Foreign.Load() != 1 {
		t.Fatalf("malformed %d, bad frames %d, foreign %d", c.Malformed.Load(), c.BadFrames.Load(), c.Foreign.Load())
	}
	if n, ok := x.Match("http://b1", []uint64{11, 12}); !ok || n != 1 {
		t.Fatalf("match %d %v, stats %+v", n, ok, x.Stats("http://b1"))
	}

	// The engine restarts on the same address: the stream drops (the view
	// is untrusted meanwhile), the subscriber reconnects, and the sequence
	// starting over clears what the old engine held.
	addr := pub.addr
	_ = pub.sock.Close()
	wait.For(t, "disconnect noticed", func() bool { return !x.Stats("http://b1").Connected })
	if _, ok := x.Match("http://b1", []uint64{11}); ok {
		t.Fatal("view trusted while the stream is down")
	}
	pub2 := startPublisher(t, addr)
	wait.For(t, "batch from the restarted engine", func() bool {
		pub2.send(1, arrayBatch(t, storedArr([]uint64{21}, nil)))
		n, ok := x.Match("http://b1", []uint64{21})
		return ok && n == 1
	})
	if x.Holds("http://b1", 11) || x.Holds("http://b1", 14) {
		t.Fatalf("restart kept the old engine's blocks: %+v", x.Stats("http://b1"))
	}
	if x.Stats("http://b1").Restarts == 0 {
		t.Fatalf("stats %+v", x.Stats("http://b1"))
	}
}

// zmtpGreetingBytes is a ZMTP 3.0 NULL-mechanism greeting.
func zmtpGreetingBytes() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}

// A peer that claims a 1 TiB frame must lose its connection, not make the
// subscriber allocate it (zmq4 alone would try, and crash the process).
func TestSubscriberCutsOversizedFrame(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				hdr := []byte{flagCommand | flagLong, 0, 0, 1, 0, 0, 0, 0, 0} // 1 TiB
				_, _ = c.Write(append(zmtpGreetingBytes(), hdr...))
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						break
					}
				}
				accepted <- struct{}{}
			}()
		}
	}()
	x := NewIndex(DefaultLimits(), time.Hour, nil)
	sub := &Subscriber{Backend: "b", Endpoint: "tcp://" + ln.Addr().String(), Index: x, MinBackoff: 10 * time.Millisecond}
	startSubscriber(t, sub)
	// Cut twice: the subscriber survives the first and comes back.
	for range 2 {
		select {
		case <-accepted:
		case <-t.Context().Done():
			t.Fatal("no connection")
		}
	}
	wait.For(t, "disconnects counted", func() bool { return sub.Counters().Disconnects.Load() >= 2 })
}

func TestBoundedConnScan(t *testing.T) {
	frame := func(flags byte, size int) []byte {
		if flags&flagLong != 0 {
			return append([]byte{flags}, binary.BigEndian.AppendUint64(nil, uint64(size))...)
		}
		return []byte{flags, byte(size)}
	}
	body := func(n int) []byte { return make([]byte, n) }
	var ok []byte
	ok = append(ok, zmtpGreetingBytes()...)
	ok = append(ok, frame(flagMore, 3)...)
	ok = append(ok, body(3)...)
	ok = append(ok, frame(flagMore|flagLong, 300)...)
	ok = append(ok, body(300)...)
	ok = append(ok, frame(0, 0)...)
	// Byte by byte, the state machine must land on the same result.
	c := &boundedConn{max: 1000, left: zmtpGreeting}
	for i := range ok {
		if err := c.scan(ok[i : i+1]); err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
	}
	if c.state != stFlags || c.frames != 0 {
		t.Fatalf("state %d frames %d", c.state, c.frames)
	}
	for name, tail := range map[string][]byte{
		"too big":     frame(flagLong, 1001),
		"sum too big": append(append(frame(flagMore|flagLong, 600), body(600)...), frame(flagLong, 401)...),
		"bad flags":   {0x80, 1},
		"too many":    []byte(strings.Repeat("\x01\x00", maxFrames+1)),
	} {
		c := &boundedConn{max: 1000, left: zmtpGreeting}
		if err := c.scan(append(zmtpGreetingBytes(), tail...)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A publisher that floods keeps the index within its bound.
func TestSubscriberFloodStaysBounded(t *testing.T) {
	pub := startPublisher(t, "127.0.0.1:0")
	lim := DefaultLimits()
	lim.MaxBlocks = 500
	x := NewIndex(lim, time.Hour, nil)
	sub := &Subscriber{Backend: "b", Endpoint: "tcp://" + pub.addr, Index: x, Limits: lim, MinBackoff: 10 * time.Millisecond}
	startSubscriber(t, sub)
	wait.For(t, "subscribed", func() bool {
		pub.send(1, arrayBatch(t, storedArr([]uint64{1}, nil)))
		return x.Holds("b", 1)
	})
	hashes := make([]uint64, 1000)
	for seq := uint64(2); seq < 200; seq++ {
		for i := range hashes {
			hashes[i] = seq<<20 | uint64(i)
		}
		pub.send(seq, arrayBatch(t, storedArr(hashes, nil)))
	}
	wait.For(t, "flood consumed", func() bool { return x.Stats("b").Overflows > 0 })
	if s := x.Stats("b"); s.Blocks > lim.MaxBlocks || s.Trusted {
		t.Fatalf("stats %+v", s)
	}
}
