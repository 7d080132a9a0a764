package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/memnet"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/p2p"
)

// swarmFleet is a fleet of daemons that swarm: each has a gossip node on
// one in-memory network and a p2p node on loopback, and reads the
// fixture's origin counting its bytes per node.
type swarmFleet struct {
	t    *testing.T
	fx   *fixture
	mnet *memnet.Network
	key  []byte
	// first is the gossip address nodes join, once one has started.
	first string
}

func newSwarmFleet(t *testing.T, fx *fixture) *swarmFleet {
	key, err := gossip.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &swarmFleet{t: t, fx: fx, mnet: &memnet.Network{}, key: key}
}

// swarmMember is one node of a swarmFleet.
type swarmMember struct {
	name   string
	dir    string
	d      *Daemon
	gossip *gossip.Node
	p2p    *p2p.Node
	s3     atomic.Int64 // origin bytes read by this node's daemon
	stop   func()
}

// start runs a daemon named name on dir (an earlier member's dir resumes
// it). alone keeps it out of the fleet until join.
func (sf *swarmFleet) start(name, dir string, alone bool) *swarmMember {
	t := sf.t
	t.Helper()
	m := &swarmMember{name: name, dir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	node, err := p2p.NewNode(p2p.Config{NodeID: name, ClusterKey: bytes.Repeat([]byte{9}, p2p.ClusterKeySize), StallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served sync.WaitGroup
	served.Go(func() { _ = node.Serve(ctx, ln) })
	m.p2p = node
	tr := sf.mnet.NewTransport(name)
	gcfg := gossip.Config{
		NodeName: name, Keyring: [][]byte{sf.key}, Transport: tr, Meta: gossip.Meta{PeerAddr: ln.Addr().String()},
		Tuning: gossip.Tuning{GossipInterval: 20 * time.Millisecond, ProbeInterval: time.Second,
			PushPullInterval: 300 * time.Millisecond, TCPTimeout: 2 * time.Second},
	}
	if !alone && sf.first != "" {
		gcfg.Join = []string{sf.first}
	}
	if m.gossip, err = gossip.Start(ctx, gcfg); err != nil {
		t.Fatal(err)
	}
	if sf.first == "" {
		sf.first = tr.Addr()
	}
	cfg := testConfig(dir)
	cfg.NodeName = name
	m.d = openDaemon(t, cfg, sf.fx.origin(t, func(n int) { m.s3.Add(int64(n)) }), Deps{Fleet: m.gossip, Swarm: node})
	stopDaemon := run(t, m.d)
	var once sync.Once
	m.stop = func() {
		once.Do(func() {
			stopDaemon()
			gctx, gcancel := context.WithTimeout(context.Background(), time.Second)
			defer gcancel()
			_ = m.gossip.Close(gctx)
			cancel()
			served.Wait()
		})
	}
	t.Cleanup(m.stop)
	return m
}

// waitSees waits until every member sees all of them alive.
func waitSees(t *testing.T, ms ...*swarmMember) {
	t.Helper()
	for _, m := range ms {
		wait.For(t, fmt.Sprintf("%s sees %d members", m.name, len(ms)), func() bool {
			alive := 0
			for _, mem := range m.gossip.Members() {
				if mem.State == gossip.MemberAlive {
					alive++
				}
			}
			return alive == len(ms)
		})
	}
}

// A node that took the direct path (it was alone when it chose, so it
// published no shard manifest and serves nothing to peers) is still the
// origin its fleet ranks first for some shards. Its followers must notice
// it does not serve them, once it reports the model ready, and share those
// shards' S3 reads among themselves (each read once) instead of waiting
// out originFallback and then all reading them.
func TestFollowersTakeOverFromAnOriginThatWentDirect(t *testing.T) {
	files := map[string]int{}
	for i := range 6 {
		files[fmt.Sprintf("model-%05d.safetensors", i)] = 2<<20 + 1000*(i+1)
	}
	fx := newFixture(t, files)
	var size int64
	for _, data := range fx.files {
		size += int64(len(data))
	}
	sf := newSwarmFleet(t, fx)
	a := sf.start("a", t.TempDir(), true)
	if err := a.d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a ready alone", func() bool { return status(t, a.d, "meta/llama").Ready })
	if got := a.s3.Load(); got != size {
		t.Fatalf("a read %d bytes from S3 for a %d-byte model", got, size)
	}
	b := sf.start("b", t.TempDir(), false)
	c := sf.start("c", t.TempDir(), false)
	waitSees(t, a, b, c)
	for _, m := range []*swarmMember{b, c} {
		if err := m.d.AddCache(t.Context(), fx.spec()); err != nil {
			t.Fatal(err)
		}
	}
	// Well under originFallback: waiting it out is the bug.
	for _, m := range []*swarmMember{b, c} {
		wait.For(t, m.name+" ready", func() bool { return status(t, m.d, "meta/llama").Ready }, wait.Timeout(originFallback/2))
		checkFiles(t, status(t, m.d, "meta/llama").Path, fx.files)
	}
	t.Logf("S3 bytes: a %d (direct), b %d, c %d; model %d", a.s3.Load(), b.s3.Load(), c.s3.Load(), size)
	if got := b.s3.Load() + c.s3.Load(); got > size+size/10 {
		t.Fatalf("b and c read %d bytes from S3 together for a %d-byte model: want each byte about once", got, size)
	}
}
