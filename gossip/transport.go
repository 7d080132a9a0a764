package gossip

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport wraps a memberlist transport to count bytes on the wire
// (after encryption) and to decouple packet delivery from the sender: packets
// are handed over through a buffer and dropped when it is full, like UDP.
// Without the buffer, a transport that delivers packets synchronously (an
// in-memory one in tests) can deadlock two nodes whose packet handlers
// answer each other at the same moment.
type countingTransport struct {
	inner   memberlist.NodeAwareTransport
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	packetSent, packetRecv atomic.Uint64
	streamSent, streamRecv atomic.Uint64
	packetDrops            atomic.Uint64
}

type plainTransport struct{ memberlist.Transport }

func (t plainTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t plainTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, d)
}

func newCountingTransport(inner memberlist.Transport) *countingTransport {
	na, ok := inner.(memberlist.NodeAwareTransport)
	if !ok {
		na = plainTransport{inner}
	}
	t := &countingTransport{
		inner:   na,
		packets: make(chan *memberlist.Packet, 1024),
		streams: make(chan net.Conn, 64),
		stop:    make(chan struct{}),
	}
	t.wg.Add(2)
	go t.forwardPackets()
	go t.forwardStreams()
	return t
}

func (t *countingTransport) forwardPackets() {
	defer t.wg.Done()
	in := t.inner.PacketCh()
	for {
		select {
		case p := <-in:
			t.packetRecv.Add(uint64(len(p.Buf)))
			select {
			case t.packets <- p:
			default:
				t.packetDrops.Add(1)
			}
		case <-t.stop:
			return
		}
	}
}

func (t *countingTransport) forwardStreams() {
	defer t.wg.Done()
	in := t.inner.StreamCh()
	for {
		select {
		case c := <-in:
			select {
			case t.streams <- &countingConn{Conn: c, sent: &t.streamSent, recv: &t.streamRecv}:
			case <-t.stop:
				_ = c.Close()
				return
			}
		case <-t.stop:
			return
		}
	}
}

func (t *countingTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.packetSent.Add(uint64(len(b)))
	return t.inner.WriteTo(b, addr)
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.packetSent.Add(uint64(len(b)))
	return t.inner.WriteToAddress(b, a)
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *countingTransport) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, d)
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	c, err := t.inner.DialAddressTimeout(a, d)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, sent: &t.streamSent, recv: &t.streamRecv}, nil
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the inner transport first, while the forwarders still drain
// it: a NetTransport waits for its listeners, which may be blocked handing
// over a packet.
func (t *countingTransport) Shutdown() error {
	err := t.inner.Shutdown()
	t.once.Do(func() { close(t.stop) })
	t.wg.Wait()
	return err
}

type countingConn struct {
	net.Conn
	sent, recv *atomic.Uint64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.recv.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.sent.Add(uint64(n))
	return n, err
}
