package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 allocates each incoming frame at the size its header claims (up to
// 2^63 bytes) and appends frames for as long as the peer sets MORE, so a
// garbage or hostile publisher could make it allocate without bound. The
// subscriber therefore reaches the publisher through this transport, which
// reads the ZMTP 3 framing as the bytes pass and cuts the connection at
// the first message over the size or frame-count limit, before zmq4 sees
// the header that would make it allocate.

// boundedScheme is the zmq4 transport name used in place of "tcp".
const boundedScheme = "wfkvtcp"

const (
	zmtpGreeting = 64 // ZMTP 3.x greeting length
	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	maxFrames    = 8 // vLLM sends 3 frames per message
)

var (
	registerOnce sync.Once
	errRegister  error
	boundedLimit = struct {
		sync.Mutex
		max uint64
	}{max: uint64(DefaultLimits().MaxFrame)}
)

// registerBounded registers the bounded transport with zmq4 once per
// process; the frame limit is the largest any subscriber asked for.
func registerBounded(maxFrame int) error {
	registerOnce.Do(func() {
		errRegister = zmq4.RegisterTransport(boundedScheme, boundedTransport{inner: transport.New("tcp")})
	})
	boundedLimit.Lock()
	if uint64(maxFrame) > boundedLimit.max {
		boundedLimit.max = uint64(maxFrame)
	}
	boundedLimit.Unlock()
	return errRegister
}

func frameLimit() uint64 {
	boundedLimit.Lock()
	defer boundedLimit.Unlock()
	// Room for the topic and sequence frames next to the payload, and for
	// handshake commands.
	return boundedLimit.max + 4096
}

type boundedTransport struct{ inner transport.Transport }

func (t boundedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &boundedConn{Conn: c, max: frameLimit(), left: zmtpGreeting}, nil
}

func (t boundedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &boundedListener{Listener: l}, nil
}

func (t boundedTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

// boundedListener's Close waits for an Accept in flight to return. zmq4
// accepts on a goroutine of its own that Close does not wait for, so
// without this a stopped subscriber could leave that goroutine in this
// package's code for a moment after it returned.
type boundedListener struct {
	net.Listener
	mu     sync.Mutex
	closed bool
	active sync.WaitGroup
}

func (l *boundedListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, net.ErrClosed
	}
	l.active.Add(1)
	l.mu.Unlock()
	defer l.active.Done()
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &boundedConn{Conn: c, max: frameLimit(), left: zmtpGreeting}, nil
}

func (l *boundedListener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	err := l.Listener.Close()
	l.active.Wait()
	return err
}

// boundedConn tracks where the ZMTP stream is: in the greeting, in a frame
// header (flags, then a 1- or 8-byte size), or in a frame body.
type boundedConn struct {
	net.Conn
	max      uint64
	state    int // 0 greeting or body (skip left bytes), 1 flags, 2 size
	left     uint64
	flags    byte
	size     [8]byte
	sizeN    int
	sizeOf   int
	frames   int    // frames so far in the current message
	msgBytes uint64 // and their bytes
	err      error
}

const (
	stSkip = iota
	stFlags
	stSize
)

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if perr := c.scan(p[:n]); perr != nil {
		c.err = perr
		_ = c.Close()
		return 0, perr
	}
	return n, err
}

func (c *boundedConn) scan(b []byte) error {
	for len(b) > 0 {
		switch c.state {
		case stSkip:
			k := min(uint64(len(b)), c.left)
			b = b[k:]
			c.left -= k
			if c.left == 0 {
				c.state = stFlags
			}
		case stFlags:
			c.flags = b[0]
			b = b[1:]
			if c.flags&^(flagMore|flagLong|flagCommand) != 0 {
				return fmt.Errorf("kv events: bad ZMTP frame flags 0x%02x", c.flags)
			}
			c.sizeN, c.sizeOf = 0, 1
			if c.flags&flagLong != 0 {
				c.sizeOf = 8
			}
			c.state = stSize
		case stSize:
			k := copy(c.size[c.sizeN:c.sizeOf], b)
			b = b[k:]
			c.sizeN += k
			if c.sizeN < c.sizeOf {
				continue
			}
			size := uint64(c.size[0])
			if c.sizeOf == 8 {
				size = binary.BigEndian.Uint64(c.size[:])
			}
			// The bound is on the whole message, so that zmq4's queue of
			// received messages is bounded too.
			if size > c.max-c.msgBytes {
				return fmt.Errorf("kv events: ZMTP message of over %d bytes", c.max)
			}
			c.msgBytes += size
			c.frames++
			if c.frames > maxFrames {
				return fmt.Errorf("kv events: ZMTP message of more than %d frames", maxFrames)
			}
			if c.flags&flagMore == 0 {
				c.frames, c.msgBytes = 0, 0
			}
			c.left = size
			c.state = stSkip
			if size == 0 {
				c.state = stFlags
			}
		}
	}
	return nil
}
