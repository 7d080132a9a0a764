// Package memnet is an in-memory network for memberlist in tests.
//
// memberlist ships its own MockNetwork, but its sends block on unbuffered
// channels and its dials ignore their timeout: once a node stops reading
// (it is closing, or it crashed in the test), every peer that sends to it
// hangs for ever, and so does any Close waiting for those peers' workers.
// Real networks do not behave that way, so tests built on it hang where
// production code would not, and hide the cases where production code
// would wait a whole timeout.
//
// memnet behaves like the network memberlist was written for: a packet to a
// node that is slow or gone is dropped (UDP), a dial to a node that is gone
// is refused at once, and a dial to a node that does not accept in time
// fails after the dial's timeout. Streams buffer what is written, as a
// kernel's socket buffers do, so a writer never waits on its reader; reads
// honour the deadlines memberlist sets; a node that shuts down closes its
// streams, as a process that exits does.
//
// A node restarts by asking its Network for a new Transport under the same
// name: it keeps its address, and the previous incarnation must have been
// shut down (memberlist does that in Shutdown).
//
// memnet imports memberlist and nothing of warmfleet.
package memnet

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// packetBuffer is how many packets a node holds before it drops new ones,
// as a socket's receive buffer would.
const packetBuffer = 1024

// Network connects the Transports made from it. The zero value is ready.
type Network struct {
	mu     sync.Mutex
	addrs  map[string]string     // name -> "127.0.0.1:port"
	byName map[string]*Transport // name -> current incarnation
	byAddr map[string]string     // address -> name
	port   int
}

// NewTransport returns a transport for the node name: the same name keeps
// its address across restarts.
func (n *Network) NewTransport(name string) *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.addrs == nil {
		n.addrs, n.byName, n.byAddr, n.port = map[string]string{}, map[string]*Transport{}, map[string]string{}, 20000
	}
	addr, ok := n.addrs[name]
	if !ok {
		n.port++
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
		n.addrs[name], n.byAddr[addr] = addr, name
	}
	t := &Transport{
		net:     n,
		name:    name,
		addr:    addr,
		packets: make(chan *memberlist.Packet, packetBuffer),
		streams: make(chan net.Conn),
		down:    make(chan struct{}),
		conns:   map[*conn]struct{}{},
	}
	n.byName[name] = t
	return t
}

// Addr returns the address of the node name ("" when it has none yet).
func (n *Network) Addr(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addrs[name]
}

// peer finds the live incarnation behind a memberlist address.
func (n *Network) peer(a memberlist.Address) (*Transport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	name := a.Name
	if name == "" {
		name = n.byAddr[a.Addr]
	}
	t, ok := n.byName[name]
	if !ok {
		return nil, fmt.Errorf("memnet: no route to %s", a)
	}
	return t, nil
}

// Transport is one node's end of a Network; it implements
// memberlist.NodeAwareTransport.
type Transport struct {
	net     *Network
	name    string
	addr    string
	packets chan *memberlist.Packet
	streams chan net.Conn
	down    chan struct{}
	once    sync.Once

	mu    sync.Mutex
	conns map[*conn]struct{} // open ends, closed by Shutdown
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// errRefused is what a dial to a node that is gone gets.
var errRefused = errors.New("connection refused")

type addr string

func (a addr) Network() string { return "memnet" }
func (a addr) String() string  { return string(a) }

// Addr returns the transport's address, host:port.
func (t *Transport) Addr() string { return t.addr }

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(t.addr)
	if err != nil {
		return nil, 0, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, 0, err
	}
	return net.ParseIP(host), p, nil
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, to string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: to})
}

// WriteToAddress implements memberlist.NodeAwareTransport. Like UDP it
// never waits: the packet is dropped when the receiver is gone or behind.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest, err := t.net.peer(a)
	if err != nil {
		return now, err
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: addr(t.addr), Timestamp: now}
	select {
	case <-dest.down:
	case dest.packets <- p:
	default:
	}
	return now, nil
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(to string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: to}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport: refused at
// once when the node is gone, a timeout when it does not accept in time.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, err := t.net.peer(a)
	if err != nil {
		return nil, err
	}
	var expired <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		expired = timer.C
	}
	local, remote := newStream(addr(t.addr), addr(dest.addr))
	if !t.track(local) {
		return nil, fmt.Errorf("memnet: dial %s: %w", a.Addr, net.ErrClosed)
	}
	if !dest.track(remote) {
		_ = local.Close()
		return nil, fmt.Errorf("memnet: dial %s: %w", a.Addr, errRefused)
	}
	select {
	case dest.streams <- remote:
		return local, nil
	case <-dest.down:
		err = errRefused
	case <-t.down:
		err = net.ErrClosed
	case <-expired:
		err = fmt.Errorf("dial %s: i/o timeout", a.Addr)
	}
	_ = local.Close()
	_ = remote.Close()
	return nil, fmt.Errorf("memnet: dial %s: %w", a.Addr, err)
}

// track records an open end so that Shutdown closes it; false once the
// transport is down.
func (t *Transport) track(c *conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conns == nil {
		return false
	}
	t.conns[c] = struct{}{}
	c.onClose = func() {
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}
	return true
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown implements memberlist.Transport: from now on packets to this
// incarnation are dropped and dials to it refused, and its open streams
// are closed.
func (t *Transport) Shutdown() error {
	t.once.Do(func() {
		close(t.down)
		t.mu.Lock()
		conns := t.conns
		t.conns = nil
		t.mu.Unlock()
		for c := range conns {
			_ = c.Close()
		}
	})
	return nil
}
