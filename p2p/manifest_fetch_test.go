package p2p

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func TestFetchManifest(t *testing.T) {
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil)
	sa, m := askBuildAsk(t, a, b, 1)
	if m.ID() != sa.Manifest().ID() || !bytes.Equal(m.Hashes, sa.Manifest().Hashes) {
		t.Fatal("fetched manifest differs from the built one")
	}
	// A node without the cluster key gets nothing.
	intruder := startNode(t, "x", func(c *Config) { c.ClusterKey = bytes.Repeat([]byte{9}, ClusterKeySize) })
	if _, err := intruder.FetchManifest(t.Context(), a.addr, "m/f#0"); err == nil {
		t.Fatal("a node with another key fetched a manifest")
	}
}

// askBuildAsk has b ask a for the manifest of shard m/f#0 before a has it,
// asks times, then a build it and b fetch its manifest.
func askBuildAsk(t *testing.T, a, b *testNode, asks int) (*Shard, *Manifest) {
	t.Helper()
	for range asks {
		if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
			t.Fatalf("manifest of a shard nobody holds: %v, want ErrNoManifest", err)
		}
	}
	data := randomData(t, 1<<20+7)
	sa, err := a.Build(t.Context(), BuildSpec{ShardID: "m/f#0", Name: "f", Path: filepath.Join(a.dir, "f"),
		FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: testPiece,
		Source: newHTTPOrigin(t, data).Source(), Completion: a.comp})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.FetchManifest(t.Context(), a.addr, "m/f#0")
	if err != nil {
		t.Fatal(err)
	}
	return sa, m
}

// acceptLog records the connections a listener accepted.
type acceptLog struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *acceptLog) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *acceptLog) accepted() []net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.conns)
}

// startLoggedNode is startNode whose accepted connections the returned log
// lists.
func startLoggedNode(t *testing.T, id string) (*testNode, *acceptLog) {
	var log *acceptLog
	n := startNodeListening(t, id, nil, func(ln net.Listener) net.Listener {
		log = &acceptLog{Listener: ln}
		return log
	})
	return n, log
}

// TestFetchManifestReusesConnection: a follower polling its origin for a
// manifest asks on one connection, not on a new one (two handshakes on
// each side) per poll, and still gets each answer right.
func TestFetchManifestReusesConnection(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	sa, m := askBuildAsk(t, a, b, 3)
	if m.ID() != sa.Manifest().ID() {
		t.Fatal("fetched manifest differs from the built one")
	}
	if got := len(log.accepted()); got != 1 {
		t.Fatalf("4 asks in a row took %d connections, want 1", got)
	}
}

// TestFetchManifestAfterMemberClosedKept: when the member has closed the
// connection the last ask left open (an idle timeout, a restart, a member
// answering one ask per connection), the next ask is answered on a new one.
func TestFetchManifestAfterMemberClosedKept(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	for i := range 3 {
		if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
			t.Fatalf("ask %d: %v, want ErrNoManifest", i+1, err)
		}
		for _, c := range log.accepted() {
			c.Close()
		}
	}
	if got := len(log.accepted()); got != 3 {
		t.Fatalf("3 asks, each after the member closed the last connection, took %d connections, want 3", got)
	}
}

// TestManifestAsksWaitingAreBounded: once idleConns connections wait for
// further asks, a member answers a new one and closes it, so waiting asks
// never take the member slots downloads need; the asker still gets every
// answer, each on a new connection.
func TestManifestAsksWaitingAreBounded(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	for range cap(a.idleWait) {
		a.idleWait <- struct{}{}
	}
	for i := range 2 {
		if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
			t.Fatalf("ask %d: %v, want ErrNoManifest", i+1, err)
		}
	}
	if got := len(log.accepted()); got != 2 {
		t.Fatalf("2 asks while the waiting connections are full took %d connections, want 2", got)
	}
}

// TestWaitManifestAnswersWhenTheShardOpens: a follower's ask held by its
// origin is answered as the origin opens the shard, not with "no manifest"
// that the follower would poll again after.
func TestWaitManifestAnswersWhenTheShardOpens(t *testing.T) {
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil)
	answered := make(chan error, 1)
	go func() {
		_, err := b.WaitManifest(t.Context(), a.addr, "m/f#0", askWaitMax)
		answered <- err
	}()
	wait.For(t, "a holding b's ask", func() bool { return len(a.askWaits) == 1 })
	data := randomData(t, 1<<20+7)
	built := buildAsync(t, a, BuildSpec{ShardID: "m/f#0", Name: "f", Path: filepath.Join(a.dir, "f"),
		FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: testPiece,
		Source: newHTTPOrigin(t, data).Source(), Completion: a.comp})
	if err := <-answered; err != nil && !errors.Is(err, ErrInProgress) {
		t.Fatalf("held ask answered %v, want the shard in progress or its manifest", err)
	}
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a's wait slot released", func() bool { return len(a.askWaits) == 0 })
}

// TestWaitManifestEnds: an ask held for a shard that does not open is
// answered "no manifest" once its wait ends, frees its slot, and leaves
// the connection for the next ask.
func TestWaitManifestEnds(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	for i := range 2 {
		if _, err := b.WaitManifest(t.Context(), a.addr, "m/f#0", 50*time.Millisecond); !errors.Is(err, ErrNoManifest) {
			t.Fatalf("ask %d: %v, want ErrNoManifest", i+1, err)
		}
	}
	if got := len(log.accepted()); got != 1 {
		t.Fatalf("2 held asks in a row took %d connections, want 1", got)
	}
	wait.For(t, "a's wait slots released", func() bool { return len(a.askWaits) == 0 })
}

// TestWaitManifestHeldAsksAreBounded: once askWaitsMax asks are held, a
// member answers the next at once, as a plain ask, so asks that are never
// read (or a flood of them) hold a bounded number of goroutines and member
// slots.
func TestWaitManifestHeldAsksAreBounded(t *testing.T) {
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil)
	for range cap(a.askWaits) {
		a.askWaits <- struct{}{}
	}
	start := time.Now()
	if _, err := b.WaitManifest(t.Context(), a.addr, "m/f#0", askWaitMax); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("ask beyond the held ones: %v, want ErrNoManifest", err)
	}
	if took := time.Since(start); took >= askWaitMax {
		t.Fatalf("the ask beyond the held ones was held %v", took)
	}
}

// TestWaitManifestCancelled: a follower that stops waiting (its fetch
// cancelled) gets its answer at once, and the member's slot comes back
// within the wait it granted.
func TestWaitManifestCancelled(t *testing.T) {
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil)
	ctx, cancel := context.WithCancel(t.Context())
	answered := make(chan error, 1)
	go func() {
		_, err := b.WaitManifest(ctx, a.addr, "m/f#0", askWaitMax)
		answered <- err
	}()
	wait.For(t, "a holding b's ask", func() bool { return len(a.askWaits) == 1 })
	cancel()
	if err := <-answered; err == nil {
		t.Fatal("a cancelled ask succeeded")
	}
	wait.For(t, "a's wait slot released", func() bool { return len(a.askWaits) == 0 }, wait.Timeout(2*askWaitMax))
}
