package netlab

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DialFunc opens a connection to a proxy's upstream.
type DialFunc func(ctx context.Context) (net.Conn, error)

// Mangle may change the bytes flowing from upstream to the client, in place;
// off is the offset of p[0] in the connection's stream.
type Mangle func(off int64, p []byte)

// FlipEvery returns a Mangle that flips the lowest bit of every n-th byte, a
// corruption no checksum misses.
func FlipEvery(n int64) Mangle {
	if n < 1 {
		n = 1
	}
	return func(off int64, p []byte) {
		// First position in p whose stream offset o has (o+1) % n == 0.
		first := (n - (off+1)%n) % n
		for i := first; i < int64(len(p)); i += n {
			p[i] ^= 0x01
		}
	}
}

// Proxy is a TCP proxy with faults switched on at run time: it can mangle
// what upstream sends (a peer serving corrupt bytes), reset every open
// connection, or refuse new ones.
type Proxy struct {
	ln     net.Listener
	dial   DialFunc
	mangle atomic.Pointer[Mangle]
	refuse atomic.Bool
	served atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy serves ln, forwarding each connection to a fresh upstream
// connection from dial. Close stops it.
func NewProxy(ln net.Listener, dial DialFunc) *Proxy {
	p := &Proxy{ln: ln, dial: dial, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p
}

// Addr is the listening address.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// SetMangle applies m to upstream bytes of every connection from now on;
// nil passes them through unchanged.
func (p *Proxy) SetMangle(m Mangle) {
	if m == nil {
		p.mangle.Store(nil)
		return
	}
	p.mangle.Store(&m)
}

// Refuse makes the proxy reset new connections at once (on) or serve them
// again (off).
func (p *Proxy) Refuse(on bool) { p.refuse.Store(on) }

// ResetAll resets every open connection (the client sees ECONNRESET) and
// returns how many there were.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		reset(c)
	}
	return len(p.conns)
}

// Served counts the bytes sent to clients so far.
func (p *Proxy) Served() int64 { return p.served.Load() }

// Close stops listening, closes every connection and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			reset(c)
			continue
		}
		if !p.add(c) {
			_ = c.Close()
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) add(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) remove(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := p.dial(ctx)
	cancel()
	if err != nil {
		p.remove(client)
		reset(client)
		return
	}
	if !p.add(up) {
		p.remove(client)
		_ = client.Close()
		_ = up.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(up, client)
		closeWrite(up)
	}()
	go func() {
		defer wg.Done()
		p.copyDown(client, up)
		closeWrite(client)
	}()
	wg.Wait()
	p.remove(client, up)
	_ = client.Close()
	_ = up.Close()
}

// copyDown copies upstream to client through the current Mangle.
func (p *Proxy) copyDown(client, up net.Conn) {
	buf := make([]byte, 64<<10)
	var off int64
	for {
		n, err := up.Read(buf)
		if n > 0 {
			if m := p.mangle.Load(); m != nil {
				(*m)(off, buf[:n])
			}
			off += int64(n)
			w, werr := client.Write(buf[:n])
			p.served.Add(int64(w))
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// reset closes c with SO_LINGER 0, so the peer gets a RST, not a FIN.
func reset(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = c.Close()
}
