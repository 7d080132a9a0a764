package p2p

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/syncbuf"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// strangers keeps n connections from the loopback address from to addr,
// each sending the handshake magic and then nothing, opening a new one
// whenever the node closes one (an attacker that reconnects at once), until
// the test ends. It returns a count of the connections opened.
func strangers(t *testing.T, addr, from string, n int) func() int {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	opened := 0
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					continue
				}
				mu.Lock()
				opened++
				mu.Unlock()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				_, _ = c.Write(handshakeMagic)
				_, _ = io.Copy(io.Discard, c) // until the node closes it
				stop()
				c.Close()
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func() int { mu.Lock(); defer mu.Unlock(); return opened }
}

// A connection that sends the magic and stalls is cut at HandshakeTimeout,
// however long a dial may take.
func TestStalledHandshakeIsCutAtTheDeadline(t *testing.T) {
	a := startNode(t, "a", func(c *Config) { c.HandshakeTimeout = 100 * time.Millisecond; c.DialTimeout = time.Hour })
	c, err := net.Dial("tcp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(handshakeMagic); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("stalled handshake: read %d bytes, err %v; want the node to close it", n, err)
	}
}

// Handshakes in progress have a budget, and a share of it per source
// address: connections beyond either are closed unheard.
func TestHandshakeBudgetAndPerSourceLimit(t *testing.T) {
	a := startNode(t, "a", func(c *Config) {
		c.MaxHandshakes, c.MaxHandshakesPerSource, c.HandshakeTimeout, c.RefusedHold = 5, 2, time.Hour, time.Millisecond
	})
	inHandshake := func() (total, from2 int) {
		a.hello.mu.Lock()
		defer a.hello.mu.Unlock()
		return a.hello.total, a.hello.bySource["127.0.0.2"]
	}
	strangers(t, a.addr, "127.0.0.2", 10)
	wait.For(t, "one source's connections beyond its share refused", func() bool {
		total, from2 := inHandshake()
		return total == 2 && from2 == 2 && a.Stats().ConnsRefused >= 8
	})
	strangers(t, a.addr, "127.0.0.3", 10)
	strangers(t, a.addr, "127.0.0.4", 10)
	wait.For(t, "the budget full, the rest refused", func() bool {
		total, from2 := inHandshake()
		return total == 5 && from2 == 2 && a.Stats().ConnsRefused >= 25
	})
	if total, _ := inHandshake(); total > 5 {
		t.Fatalf("%d handshakes in progress, budget 5", total)
	}
}

// Members keep their slots while strangers stall on the port: 300
// connections from one address that send the magic and stall, reconnecting
// whenever cut, leave the member's requests answered at once, every time.
func TestMemberConnectsWhileStrangersStall(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), 256<<10, BLAKE3)
	a := startNode(t, "a", nil)
	seedNode(t, a, data, m, nil)
	opened := strangers(t, a.addr, "127.0.0.2", 300)
	wait.For(t, "300 strangers connected", func() bool { return opened() >= 300 })
	b := startNode(t, "b", nil)
	for i := range 20 {
		got, err := b.FetchManifest(t.Context(), a.addr, m.ShardID)
		if err != nil {
			t.Fatalf("member's manifest request %d while strangers stall: %v", i, err)
		}
		if got.ID() != m.ID() {
			t.Fatal("fetched manifest differs")
		}
	}
	s, err := b.Open(t.Context(), m, b.dir+"/f", b.comp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Fetch(t.Context(), FetchOptions{Peers: peers(a.addr)}); err != nil {
		t.Fatal(err)
	}
	assertFileRange(t, b.dir+"/f", data, m)
}

// Refusals come as fast as anyone connects: they are logged a line per
// interval at most, with the count left out.
func TestRefusalsAreLoggedRateLimited(t *testing.T) {
	var logs syncbuf.Buffer
	a := startNode(t, "a", func(c *Config) {
		c.MaxHandshakesPerSource, c.HandshakeTimeout, c.RefusedHold = 1, time.Hour, time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	strangers(t, a.addr, "127.0.0.2", 50)
	wait.For(t, "500 connections refused", func() bool { return a.Stats().ConnsRefused >= 500 })
	// The first line comes at once; the next one refusalLogEvery later.
	if n := strings.Count(logs.String(), "refusing connections"); n < 1 || n > 2 {
		t.Fatalf("%d log lines for %d refusals, want 1 or 2", n, a.Stats().ConnsRefused)
	}
}

func TestThrottledLogCountsWhatItLeavesOut(t *testing.T) {
	var logs syncbuf.Buffer
	now := time.Unix(0, 0)
	l := &throttledLog{log: slog.New(slog.NewTextHandler(&logs, nil)), msg: "refused", every: 10 * time.Second, now: func() time.Time { return now }}
	for range 100 {
		l.Log()
	}
	now = now.Add(10 * time.Second)
	l.Log()
	if n := strings.Count(logs.String(), "refused"); n != 2 {
		t.Fatalf("%d lines for 101 events over one interval, want 2", n)
	}
	if !strings.Contains(logs.String(), "suppressed=99") {
		t.Fatalf("the second line does not count the 99 left out:\n%s", logs.String())
	}
}

// serving runs a node with cfg on a loopback port until stop, which
// returns what Serve returned; the node's address is addr.
func serving(t *testing.T, cfg Config) (n *Node, addr string, stop func() <-chan error) {
	t.Helper()
	cfg.NodeID, cfg.ClusterKey, cfg.Logger = "a", testKey, slog.New(slog.DiscardHandler)
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx, ln) }()
	return n, ln.Addr().String(), func() <-chan error { cancel(); return served }
}

// Serve returns with nothing it started left behind: connections refused
// and held (RefusedHold) are closed when it returns, not a hold later.
func TestServeClosesHeldRefusalsWhenItReturns(t *testing.T) {
	n, addr, stop := serving(t, Config{MaxHandshakesPerSource: 1, HandshakeTimeout: time.Hour, RefusedHold: time.Hour})
	// The first takes the address's one handshake slot; the second is
	// refused and held.
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	wait.For(t, "the second connection refused", func() bool { return n.Stats().ConnsRefused == 1 })
	conns[0].Close() // its handshake ends; Serve waits for it
	if err := <-stop(); err != nil {
		t.Fatal(err)
	}
	held := conns[1]
	_ = held.SetReadDeadline(time.Now().Add(time.Minute))
	if k, err := held.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("refused connection still open after Serve returned: read %d bytes, err %v", k, err)
	}
}

// A stranger that stalls in its handshake does not hold Serve up past the
// end of its ctx (the node's stop) for HandshakeTimeout.
func TestServeReturnsWhileAHandshakeStalls(t *testing.T) {
	n, addr, stop := serving(t, Config{HandshakeTimeout: time.Hour})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(handshakeMagic); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the stranger in its handshake", func() bool {
		n.hello.mu.Lock()
		defer n.hello.mu.Unlock()
		return n.hello.total == 1
	})
	served := stop()
	wait.For(t, "Serve to return", func() bool { return len(served) == 1 })
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// slowConn is an accepted connection whose node gets to it only after
// delay: a member whose CPU is taken by its transfers or its neighbours.
type slowConn struct {
	net.Conn
	delay time.Duration
	once  sync.Once
}

func (c *slowConn) Read(b []byte) (int, error) {
	c.once.Do(func() { time.Sleep(c.delay) })
	return c.Conn.Read(b)
}

type slowListener struct {
	net.Listener
	delay time.Duration
}

func (l slowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, delay: l.delay}, nil
}

// TestHandshakeOfABusyMemberCompletes: with the default deadlines, a
// member that gets to a handshake seconds late (a warming fleet's nodes,
// short of CPU, took 2-3 s; at 2 s, a quarter to a third of their dials
// failed) still completes it, rather than both sides losing the work and
// dialing again.
func TestHandshakeOfABusyMemberCompletes(t *testing.T) {
	a := startNodeListening(t, "a", nil, func(ln net.Listener) net.Listener {
		return slowListener{Listener: ln, delay: 2500 * time.Millisecond}
	})
	b := startNode(t, "b", nil)
	if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("ask of a member 2.5 s late to the handshake: %v, want ErrNoManifest", err)
	}
	if n := a.Stats().AuthFailures + b.Stats().AuthFailures; n != 0 {
		t.Fatalf("%d failed handshakes", n)
	}
}

// A member's burst of dials to one member (fetches start together) waits
// its turn on the dialing side instead of being refused as a stranger's
// flood would be.
func TestBurstOfDialsToAMemberIsNotRefused(t *testing.T) {
	perSource := func(c *Config) { c.MaxHandshakesPerSource = 2 }
	a := startNode(t, "a", perSource)
	b := startNode(t, "b", perSource)
	const burst = 16
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for range burst {
		wg.Go(func() {
			mc, _, err := b.connect(context.Background(), a.addr, "a", 4<<10)
			if err != nil {
				errs <- err
				return
			}
			mc.c.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("connect: %v", err)
	}
	if n := a.c.refused.Load(); n != 0 {
		t.Errorf("a refused %d of b's %d connections", n, burst)
	}
	if n := b.c.dialed.Load(); n != burst {
		t.Errorf("b completed %d handshakes, want %d", n, burst)
	}
}

func TestDialGate(t *testing.T) {
	g := newDialGate(4) // two at a time
	ctx := context.Background()
	r1, err1 := g.acquire(ctx, "x:1")
	r2, err2 := g.acquire(ctx, "x:1")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	other, err := g.acquire(ctx, "y:1") // another member has slots of its own
	if err != nil {
		t.Fatal(err)
	}
	other()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.acquire(cctx, "x:1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("third acquire with a canceled context = %v, want it to give up", err)
	}
	got := make(chan func(), 1)
	go func() {
		r, err := g.acquire(ctx, "x:1")
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	// Waiting: registered, and both slots taken.
	wait.For(t, "the third dial to wait", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.byAddr["x:1"].users == 3
	})
	select {
	case <-got:
		t.Fatal("a third handshake towards x:1 while two are in progress")
	default:
	}
	r1()
	r3 := <-got
	r2()
	r3()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.byAddr) != 0 {
		t.Fatalf("entries left after every release: %v", g.byAddr)
	}
}
