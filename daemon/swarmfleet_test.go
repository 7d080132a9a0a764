package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/memnet"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
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
// it); alone keeps it out of the fleet. wrap, if given, wraps the origin
// it reads.
func (sf *swarmFleet) start(name, dir string, alone bool, wrap ...func(Origin) Origin) *swarmMember {
	t := sf.t
	t.Helper()
	m := &swarmMember{name: name, dir: dir}
	org := sf.fx.origin(t, func(n int) { m.s3.Add(int64(n)) })
	for _, w := range wrap {
		org = w(org)
	}
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
	m.d = openDaemon(t, cfg, org, Deps{Fleet: m.gossip, Swarm: node})
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

// cachingPair starts members a and b reading the origin through wrap,
// waits until they see each other and adds the fixture's cache to both.
func (sf *swarmFleet) cachingPair(wrap func(Origin) Origin) (a, b *swarmMember) {
	t := sf.t
	t.Helper()
	a = sf.start("a", t.TempDir(), false, wrap)
	b = sf.start("b", t.TempDir(), false, wrap)
	waitSees(t, a, b)
	for _, m := range []*swarmMember{a, b} {
		if err := m.d.AddCache(t.Context(), sf.fx.spec()); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
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

// stallRanges serves its first n range reads, then holds every later one
// until its context ends: origins stopped part way into their shards.
type stallRanges struct {
	Origin
	left atomic.Int64
}

func (o *stallRanges) OpenRange(ctx context.Context, obj origin.Object, off, n int64) (io.ReadCloser, error) {
	if o.left.Add(-1) < 0 {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	return o.Origin.OpenRange(ctx, obj, off, n)
}

// A fleet stopped before any shard is complete (a power cut during the
// warm-up) comes back one node at a time: the first one sees no member
// and, once it has waited resumeSettle for the fleet, resumes through the
// swarm from the pieces it verified (its own S3 reads and the ones it
// followed), reading from S3 only the pieces it lacks. It held no complete
// manifest, so it took the direct path and read the whole model again.
func TestOriginRestartedBeforeAnyShardCompletesKeepsItsPieces(t *testing.T) {
	// Two shards of one size: p2p.AssignOrigins gives one to each node.
	files := map[string]int{"model-00000.safetensors": 4*swarmPieceSize + 1000, "model-00001.safetensors": 4*swarmPieceSize + 1000}
	fx := newFixture(t, files)
	var size int64
	for _, data := range fx.files {
		size += int64(len(data))
	}
	sf := newSwarmFleet(t, fx)
	stall := func(org Origin) Origin {
		s := &stallRanges{Origin: org}
		s.left.Store(2)
		return s
	}
	a, b := sf.cachingPair(stall)
	// Each origin read two pieces of its shard, and each follower got them.
	for _, m := range []*swarmMember{a, b} {
		wait.For(t, m.name+" verified 4 pieces", func() bool { return m.p2p.Stats().PiecesVerified >= 4 })
	}
	a.stop()
	b.stop()
	verified := a.p2p.Stats().PiecesVerified
	if verified >= 8 {
		t.Fatalf("a verified %d pieces before the restart: the origins were to stop after 2 pieces each", verified)
	}
	a2 := sf.start("a", a.dir, true)
	wait.For(t, "a ready again", func() bool { return status(t, a2.d, "meta/llama").Ready })
	checkFiles(t, status(t, a2.d, "meta/llama").Path, fx.files)
	t.Logf("a verified %d pieces before the restart, then read %d bytes from S3 for a %d-byte model", verified, a2.s3.Load(), size)
	if left := size - verified*swarmPieceSize; a2.s3.Load() > left {
		t.Fatalf("a read %d bytes from S3 after the restart where %d were missing: verified pieces fetched again", a2.s3.Load(), left)
	}
}

// failRanges fails every range read of the object at path while failing is
// set: a source that cannot deliver one file for a while.
type failRanges struct {
	Origin
	path    string
	failing *atomic.Bool
}

func (o *failRanges) OpenRange(ctx context.Context, obj origin.Object, off, n int64) (io.ReadCloser, error) {
	if obj.Path == o.path && o.failing.Load() {
		return nil, fmt.Errorf("%s: source unavailable for the test", obj.Path)
	}
	return o.Origin.OpenRange(ctx, obj, off, n)
}

// An attempt that completes some files through the swarm and fails on
// another keeps the complete shards open for its peers. The next attempt
// uses them as they are: it opened them again at the same path, was
// refused ("already open"), and so failed on every retry, for good.
func TestRetryAfterAFailedFileReusesTheShardsItCompleted(t *testing.T) {
	files := map[string]int{"config.json": 1000, "model-00000.safetensors": 2*swarmPieceSize + 1000, "model-00001.safetensors": 2*swarmPieceSize + 2000}
	fx := newFixture(t, files)
	sf := newSwarmFleet(t, fx)
	var failing atomic.Bool
	failing.Store(true)
	unavailable := func(org Origin) Origin { return &failRanges{Origin: org, path: "config.json", failing: &failing} }
	a, b := sf.cachingPair(unavailable)
	// config.json's origin fails; its follower waits for it meanwhile.
	wait.For(t, "a node failed on config.json with the model files in", func() bool {
		for _, m := range []*swarmMember{a, b} {
			st := status(t, m.d, "meta/llama")
			if st.Attempts > 0 && strings.Contains(st.Error, "config.json") && m.p2p.Stats().PiecesVerified >= 6 {
				return true
			}
		}
		return false
	})
	failing.Store(false)
	for _, m := range []*swarmMember{a, b} {
		wait.For(t, m.name+" ready on a retry", func() bool {
			st := status(t, m.d, "meta/llama")
			if strings.Contains(st.Error, "already open") {
				t.Fatalf("%s: a retry refused its own open shard: %s", m.name, st.Error)
			}
			return st.Ready
		})
		checkFiles(t, status(t, m.d, "meta/llama").Path, fx.files)
	}
}

// readBackOrigin is an origin whose digest no piece CRCs combine into (a
// Hub file's sha256): NewRangeCheck is nil, so Verify reads the copy back.
// It records how far Verify has read, and holds every origin read that
// reaches holdFrom until release is closed.
type readBackOrigin struct {
	Origin
	holdFrom int64
	release  chan struct{}
	readTo   atomic.Int64
}

func (o *readBackOrigin) NewRangeCheck(context.Context, origin.Object) (origin.RangeCheck, error) {
	return nil, nil
}

func (o *readBackOrigin) OpenRange(ctx context.Context, obj origin.Object, off, n int64) (io.ReadCloser, error) {
	if off+n > o.holdFrom {
		select {
		case <-o.release:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	return o.Origin.OpenRange(ctx, obj, off, n)
}

func (o *readBackOrigin) Verify(ctx context.Context, obj origin.Object, r io.ReaderAt) (origin.Verification, error) {
	return o.Origin.Verify(ctx, obj, readerAtFunc(func(p []byte, off int64) (int, error) {
		n, err := r.ReadAt(p, off)
		for end := off + int64(n); ; {
			if cur := o.readTo.Load(); end <= cur || o.readTo.CompareAndSwap(cur, end) {
				break
			}
		}
		return n, err
	}))
}

type readerAtFunc func([]byte, int64) (int, error)

func (f readerAtFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }

// A file whose origin checks it by reading it back (no range check, as a
// Hub's sha256) is read back shard by shard while the swarm fills it, not
// all at once after the fill: at the fleet bench's scale that read-back,
// done after the last byte arrived, added seconds to every host's warm-up.
// The test holds the file's last shard at the origin and waits for the
// check to have read the first shard on both nodes.
func TestReadBackCheckRunsWhileTheFileFills(t *testing.T) {
	const size = swarmShardSize + 2*swarmPieceSize
	fx := newFixture(t, map[string]int{"model-00000.safetensors": size})
	sf := newSwarmFleet(t, fx)
	release := make(chan struct{})
	var origins []*readBackOrigin
	hold := func(org Origin) Origin {
		o := &readBackOrigin{Origin: org, holdFrom: swarmShardSize, release: release}
		origins = append(origins, o)
		return o
	}
	a, b := sf.cachingPair(hold)
	for i, o := range origins {
		wait.For(t, fmt.Sprintf("node %d's check read the first shard while the last is held", i), func() bool {
			return o.readTo.Load() >= swarmShardSize
		}, wait.Timeout(30*time.Second))
	}
	close(release)
	for _, m := range []*swarmMember{a, b} {
		wait.For(t, m.name+" ready", func() bool { return status(t, m.d, "meta/llama").Ready })
		checkFiles(t, status(t, m.d, "meta/llama").Path, fx.files)
	}
	for i, o := range origins {
		if got := o.readTo.Load(); got != size {
			t.Errorf("node %d's check read up to byte %d of %d", i, got, size)
		}
	}
}
