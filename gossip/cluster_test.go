package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// fastTuning keeps in-memory clusters quick; the defaults are for real fleets.
func fastTuning() Tuning {
	return Tuning{
		GossipInterval:   20 * time.Millisecond,
		ProbeInterval:    200 * time.Millisecond,
		ProbeTimeout:     100 * time.Millisecond,
		SuspicionMult:    2,
		PushPullInterval: 300 * time.Millisecond,
		TCPTimeout:       2 * time.Second,
		ProgressInterval: 100 * time.Millisecond,
		RejoinInterval:   200 * time.Millisecond,
	}
}

// mockCluster runs Nodes on memberlist's in-memory network. Every transport
// is created up front: MockNetwork's maps are not safe to grow while nodes
// run.
type mockCluster struct {
	t     testing.TB
	net   *memberlist.MockNetwork
	mocks map[string]*memberlist.MockTransport
	key   []byte
	tun   Tuning

	mu     sync.Mutex
	nodes  map[string]*Node
	drains map[string]chan struct{}
}

func newMockCluster(t testing.TB, names ...string) *mockCluster {
	t.Helper()
	key, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	c := &mockCluster{t: t, net: &memberlist.MockNetwork{}, mocks: map[string]*memberlist.MockTransport{},
		key: key, tun: fastTuning(), nodes: map[string]*Node{}, drains: map[string]chan struct{}{}}
	for _, n := range names {
		c.mocks[n] = c.net.NewTransport(n)
	}
	t.Cleanup(c.closeAll)
	return c
}

func (c *mockCluster) addr(name string) string {
	ip, port, err := c.mocks[name].FinalAdvertiseAddr("", 0)
	if err != nil {
		c.t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d", ip, port)
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("GOSSIP_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// start starts a node; edit adjusts its config.
func (c *mockCluster) start(name string, edit func(*Config)) *Node {
	c.t.Helper()
	c.mu.Lock()
	if stop, ok := c.drains[name]; ok {
		close(stop)
		delete(c.drains, name)
	}
	c.mu.Unlock()
	cfg := Config{
		NodeName:  name,
		Keyring:   [][]byte{c.key},
		Transport: c.mocks[name],
		Tuning:    c.tun,
		Logger:    testLogger(c.t),
		Meta:      Meta{APIAddr: "127.0.0.1:7070", Version: "test"},
	}
	if edit != nil {
		edit(&cfg)
	}
	n, err := Start(context.Background(), cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	c.mu.Lock()
	c.nodes[name] = n
	c.mu.Unlock()
	return n
}

// stop closes a node (gracefully if leave) and keeps its mock transport
// drained so that the others, whose sends block on the in-memory network,
// see it as unreachable instead of hanging.
func (c *mockCluster) stop(name string, leave bool) {
	c.t.Helper()
	c.mu.Lock()
	n := c.nodes[name]
	delete(c.nodes, name)
	stop := make(chan struct{})
	c.drains[name] = stop
	c.mu.Unlock()
	if leave {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			c.t.Logf("close %s: %v", name, err)
		}
	} else {
		// A crash: no leave message.
		n.closed.Store(true)
		_ = n.ml.Shutdown()
		close(n.stop)
		n.wg.Wait()
	}
	mt := c.mocks[name]
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-mt.PacketCh():
			case conn := <-mt.StreamCh():
				_ = conn.Close()
			}
		}
	}()
}

func (c *mockCluster) closeAll() {
	c.mu.Lock()
	nodes := c.nodes
	c.nodes = map[string]*Node{}
	c.mu.Unlock()
	// Drain every transport first, competing with the nodes' own readers:
	// at teardown a lost packet does not matter, a send blocked forever on
	// a node that stopped reading does (Close waits for its workers).
	stop := make(chan struct{})
	for _, mt := range c.mocks {
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-mt.PacketCh():
				case conn := <-mt.StreamCh():
					_ = conn.Close()
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = n.Close(ctx)
		}()
	}
	wg.Wait()
	close(stop)
	c.mu.Lock()
	for name, s := range c.drains {
		close(s)
		delete(c.drains, name)
	}
	c.mu.Unlock()
}

func aliveCount(n *Node) int {
	c := 0
	for _, m := range n.Members() {
		if m.State == MemberAlive {
			c++
		}
	}
	return c
}

func member(n *Node, name string) (Member, bool) {
	for _, m := range n.Members() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

type (
	promRegistry   = prometheus.Registry
	memberlistNode = memberlist.Node
)

// gaugeWithLabel finds one metric of a family in a registry.
func gaugeWithLabel(t testing.TB, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					v := m.GetGauge().GetValue()
					if m.GetCounter() != nil {
						v = m.GetCounter().GetValue()
					}
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(v)
					return g
				}
			}
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return nil
}
