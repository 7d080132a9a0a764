package memnet

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// maxBuffered bounds what one direction of a stream holds unread, as a
// socket's buffers do; a writer past it gets an error rather than a hang.
const maxBuffered = 64 << 20

// pipe is one direction of a stream: writes append and never wait (a
// kernel's socket buffer), reads wait for data, the end, or a deadline.
type pipe struct {
	mu     sync.Mutex
	buf    []byte
	closed bool          // either end closed: reads drain then EOF, writes fail
	wake   chan struct{} // closed and replaced on every change
}

func newPipe() *pipe { return &pipe{wake: make(chan struct{})} }

func (p *pipe) changedLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

func (p *pipe) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		p.changedLocked()
	}
}

// conn is one end of a stream between two transports.
type conn struct {
	in, out       *pipe
	local, remote addr

	mu       sync.Mutex
	deadline time.Time // reads only: writes never wait
	done     chan struct{}
	once     sync.Once
	onClose  func()
}

// newStream returns the two ends of a stream, from dialer to listener.
func newStream(dialer, listener addr) (*conn, *conn) {
	ab, ba := newPipe(), newPipe()
	a := &conn{in: ba, out: ab, local: dialer, remote: listener, done: make(chan struct{})}
	b := &conn{in: ab, out: ba, local: listener, remote: dialer, done: make(chan struct{})}
	return a, b
}

func (c *conn) Read(b []byte) (int, error) {
	for {
		select {
		case <-c.done:
			return 0, net.ErrClosed
		default:
		}
		c.in.mu.Lock()
		if len(c.in.buf) > 0 {
			n := copy(b, c.in.buf)
			c.in.buf = c.in.buf[n:]
			c.in.mu.Unlock()
			return n, nil
		}
		if c.in.closed {
			c.in.mu.Unlock()
			return 0, io.EOF
		}
		wake := c.in.wake
		c.in.mu.Unlock()

		c.mu.Lock()
		dl := c.deadline
		c.mu.Unlock()
		if !c.wait(wake, dl) {
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// wait waits for a change on the stream or the conn's end; false when the
// deadline passes first.
func (c *conn) wait(wake <-chan struct{}, deadline time.Time) bool {
	if deadline.IsZero() {
		select {
		case <-wake:
		case <-c.done:
		}
		return true
	}
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
	case <-c.done:
	case <-t.C:
		return false
	}
	return true
}

func (c *conn) Write(b []byte) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	switch {
	case c.out.closed:
		return 0, syscall.EPIPE
	case len(c.out.buf)+len(b) > maxBuffered:
		return 0, errors.New("memnet: stream buffer full")
	}
	c.out.buf = append(c.out.buf, b...)
	c.out.changedLocked()
	return len(b), nil
}

// Close ends both directions: the peer reads what was sent, then EOF, and
// its writes fail.
func (c *conn) Close() error {
	c.once.Do(func() {
		close(c.done)
		c.in.close()
		c.out.close()
		if c.onClose != nil {
			c.onClose()
		}
	})
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	// Wake a blocked Read so that it sees the new deadline.
	c.in.mu.Lock()
	c.in.changedLocked()
	c.in.mu.Unlock()
	return nil
}

func (c *conn) SetWriteDeadline(time.Time) error { return nil }
