package p2p

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Connections to the peer port are strangers until their handshake proves
// the cluster key. Anyone who reaches the port can open them, so they get a
// budget of their own, apart from the members' (Config.MaxConns), with a
// share per source address, and a deadline (HandshakeTimeout, seconds: long
// enough for a member short of CPU to finish): a stranger that stalls holds
// one of a few slots until then, never a member's.

// admission counts the handshakes in progress, in all and per source
// address.
type admission struct {
	max, perSource int
	mu             sync.Mutex
	total          int
	bySource       map[string]int
}

func newAdmission(max, perSource int) *admission {
	return &admission{max: max, perSource: perSource, bySource: map[string]int{}}
}

// admit takes a handshake slot for a connection from src, or says why not.
func (a *admission) admit(src string) (ok bool, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.total >= a.max:
		return false, "too many handshakes in progress"
	case a.bySource[src] >= a.perSource:
		return false, "too many handshakes in progress from this address"
	}
	a.total++
	a.bySource[src]++
	return true, ""
}

// done gives back a slot admit took.
func (a *admission) done(src string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.total--
	if a.bySource[src]--; a.bySource[src] <= 0 {
		delete(a.bySource, src)
	}
}

// dialGate is the dialing side of admission: it keeps this node's
// handshakes in progress towards one member within what that member admits
// from one address. Fetches start together (a shard per fetch slot, each
// dialing every peer), so a burst of dials to one member is ordinary; past
// the member's MaxHandshakesPerSource it would refuse the extra ones as it
// refuses a stranger's flood (held, reset, dialed again after
// redialBackoff), where waiting here costs a handshake's round trips.
// The share is half the member's cap, taken from this node's own
// MaxHandshakesPerSource (members run the same settings): the member
// counts a handshake until our last message reaches it, after this side
// is done with it.
type dialGate struct {
	per    int
	mu     sync.Mutex
	byAddr map[string]*dialSlots
}

// dialSlots are one address's handshake slots and how many dials hold or
// wait for one (the entry goes when none does).
type dialSlots struct {
	sem   chan struct{}
	users int
}

func newDialGate(perSource int) *dialGate {
	return &dialGate{per: max(1, perSource/2), byAddr: map[string]*dialSlots{}}
}

// acquire waits for a handshake slot towards addr; release gives it back.
func (g *dialGate) acquire(ctx context.Context, addr string) (release func(), err error) {
	g.mu.Lock()
	s := g.byAddr[addr]
	if s == nil {
		s = &dialSlots{sem: make(chan struct{}, g.per)}
		g.byAddr[addr] = s
	}
	s.users++
	g.mu.Unlock()
	select {
	case s.sem <- struct{}{}:
		return func() { <-s.sem; g.leave(addr, s) }, nil
	case <-ctx.Done():
		g.leave(addr, s)
		return nil, context.Cause(ctx)
	}
}

func (g *dialGate) leave(addr string, s *dialSlots) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.users--; s.users == 0 {
		delete(g.byAddr, addr)
	}
}

// sourceOf is the address a connection comes from, without its port.
func sourceOf(c net.Conn) string {
	addr := c.RemoteAddr()
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	if host, _, err := net.SplitHostPort(addr.String()); err == nil {
		return host
	}
	return addr.String()
}

// throttledLog logs one kind of event at most once per interval, with the
// number of events left out since the last line: whoever reaches the port
// can cause these events as fast as it connects, and must not fill the
// disk with log lines.
type throttledLog struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	every time.Duration
	now   func() time.Time

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *throttledLog) Log(args ...any) {
	l.mu.Lock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.last = now
	n := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Log(context.Background(), l.level, l.msg, args...)
}
