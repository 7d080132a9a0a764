package gossip

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/internal/testutil/memnet"
)

// fastTuning keeps in-memory clusters quick; the defaults are for real fleets.
// Probes stay patient enough that a member of a test cluster on a loaded
// 2-core machine running -race is not declared dead between two steps.
func fastTuning() Tuning {
	return Tuning{
		GossipInterval:   20 * time.Millisecond,
		ProbeInterval:    400 * time.Millisecond,
		ProbeTimeout:     300 * time.Millisecond,
		SuspicionMult:    3,
		PushPullInterval: 300 * time.Millisecond,
		TCPTimeout:       2 * time.Second,
		ProgressInterval: 100 * time.Millisecond,
		RejoinInterval:   200 * time.Millisecond,
	}
}

// mockCluster runs Nodes on an in-memory network. A node that stops is gone
// from the network, as a process that exits: the others' packets to it are
// dropped and their dials refused.
type mockCluster struct {
	t   testing.TB
	net *memnet.Network
	key []byte
	tun Tuning

	mu    sync.Mutex
	nodes map[string]*Node
	fresh map[string]*memnet.Transport // made up front, so addresses exist before start
}

func newMockCluster(t testing.TB, names ...string) *mockCluster {
	t.Helper()
	key, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	c := &mockCluster{t: t, net: &memnet.Network{}, key: key, tun: fastTuning(),
		nodes: map[string]*Node{}, fresh: map[string]*memnet.Transport{}}
	for _, n := range names {
		c.fresh[n] = c.net.NewTransport(n)
	}
	t.Cleanup(c.closeAll)
	return c
}

func (c *mockCluster) addr(name string) string {
	a := c.net.Addr(name)
	if a == "" {
		c.t.Fatalf("no node %s in the cluster", name)
	}
	return a
}

// transport returns the node's transport for its next start: a restarted
// node is a new incarnation at the same address.
func (c *mockCluster) transport(name string) *memnet.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tr, ok := c.fresh[name]; ok {
		delete(c.fresh, name)
		return tr
	}
	return c.net.NewTransport(name)
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
	cfg := Config{
		NodeName:  name,
		Keyring:   [][]byte{c.key},
		Transport: c.transport(name),
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

// stop closes a node, gracefully (a leave) or as a crash.
func (c *mockCluster) stop(name string, leave bool) {
	c.t.Helper()
	c.mu.Lock()
	n := c.nodes[name]
	delete(c.nodes, name)
	c.mu.Unlock()
	if leave {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			c.t.Logf("close %s: %v", name, err)
		}
		return
	}
	// A crash: no leave message.
	n.closed.Store(true)
	_ = n.ml.Shutdown()
	close(n.stop)
	n.wg.Wait()
}

func (c *mockCluster) closeAll() {
	c.mu.Lock()
	nodes := c.nodes
	c.nodes = map[string]*Node{}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = n.Close(ctx)
		})
	}
	wg.Wait()
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
