package p2p

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// startLoggedNodeWith is startLoggedNode with the config changed by mod.
func startLoggedNodeWith(t *testing.T, id string, mod func(*Config)) (*testNode, *acceptLog) {
	var log *acceptLog
	n := startNodeListening(t, id, mod, func(ln net.Listener) net.Listener {
		log = &acceptLog{Listener: ln}
		return log
	})
	return n, log
}

// buildShard has n build shard id of a file of size bytes from an HTTP
// origin, and returns it with the file's bytes.
func buildShard(t testing.TB, n *testNode, id, file string, size int) (*Shard, []byte) {
	t.Helper()
	data := randomData(t, size)
	s, err := n.Build(t.Context(), BuildSpec{ShardID: id, Name: file, Path: filepath.Join(n.dir, file),
		FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: testPiece,
		Source: newHTTPOrigin(t, data).Source(), Completion: n.comp})
	if err != nil {
		t.Fatal(err)
	}
	return s, data
}

func encryptions(t *testing.T, run func(t *testing.T, mod func(*Config))) {
	for _, enc := range []bool{false, true} {
		name := "plaintext"
		if enc {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) { run(t, func(c *Config) { c.Encrypt = enc }) })
	}
}

// TestFetchReusesConnection: a node that fetched one shard from a member
// fetches the next one on the same connection, not on a new one (a TLS
// and an identity handshake on both sides each), and both arrive whole.
func TestFetchReusesConnection(t *testing.T) {
	encryptions(t, func(t *testing.T, mod func(*Config)) {
		a, log := startLoggedNodeWith(t, "a", mod)
		b := startNode(t, "b", mod)
		for _, file := range []string{"f", "g", "h"} {
			sa, data := buildShard(t, a, "m/"+file+"#0", file, 1<<20+int(file[0]))
			sb, err := b.Open(t.Context(), sa.Manifest(), filepath.Join(b.dir, file), b.comp)
			if err != nil {
				t.Fatal(err)
			}
			res, err := sb.Fetch(t.Context(), FetchOptions{Peers: peers(a.addr)})
			if err != nil {
				t.Fatal(err)
			}
			if res.PeerBytes != sa.Manifest().Length {
				t.Fatalf("%s: %+v, want all %d bytes from a", file, res, sa.Manifest().Length)
			}
			assertFileRange(t, filepath.Join(b.dir, file), data, sa.Manifest())
		}
		if got := len(log.accepted()); got != 1 {
			t.Fatalf("3 shards fetched one after another took %d connections, want 1", got)
		}
		if st := b.Stats(); st.HandshakesDialed != 1 {
			t.Fatalf("b dialed %d handshakes, want 1", st.HandshakesDialed)
		}
		if st := a.Stats(); st.HandshakesAccepted != 1 {
			t.Fatalf("a accepted %d handshakes, want 1", st.HandshakesAccepted)
		}
	})
}

// TestSubscribeNotOpenReusesConnection: a fetch that asks a member which
// has not opened the shard yet asks again on the same connection at its
// next refresh, and fills the shard once the member opens it.
func TestSubscribeNotOpenReusesConnection(t *testing.T) {
	encryptions(t, func(t *testing.T, mod func(*Config)) {
		a, log := startLoggedNodeWith(t, "a", mod)
		b := startNode(t, "b", mod)
		data := randomData(t, 1<<20+3)
		m := manifestFor(t, data, 0, int64(len(data)), testPiece, BLAKE3)
		sb, err := b.Open(t.Context(), m, filepath.Join(b.dir, "f"), b.comp)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := sb.Fetch(t.Context(), FetchOptions{Peers: peers(a.addr), PeerRefresh: 20 * time.Millisecond})
			done <- err
		}()
		wait.For(t, "3 subscriptions answered not open", func() bool { return b.Stats().SubscribesNotOpen >= 3 })
		if _, err := a.Build(t.Context(), BuildSpec{ShardID: m.ShardID, Name: m.Name, Path: filepath.Join(a.dir, "f"),
			FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: testPiece,
			Source: newHTTPOrigin(t, data).Source(), Completion: a.comp}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		assertFileRange(t, filepath.Join(b.dir, "f"), data, m)
		if got, asked := len(log.accepted()), b.Stats().SubscribesNotOpen; got != 1 {
			t.Fatalf("%d subscriptions answered not open, then one served, took %d connections, want 1", asked, got)
		}
	})
}

// TestFetchAfterMemberClosedKept: when the member has closed the kept
// connection (an idle timeout, a restart, a member serving one exchange per
// connection), the next shard is fetched on a new one at once.
func TestFetchAfterMemberClosedKept(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	for _, file := range []string{"f", "g"} {
		sa, data := buildShard(t, a, "m/"+file+"#0", file, 1<<20+int(file[0]))
		for _, c := range log.accepted() {
			c.Close()
		}
		sb, err := b.Open(t.Context(), sa.Manifest(), filepath.Join(b.dir, file), b.comp)
		if err != nil {
			t.Fatal(err)
		}
		// A PeerRefresh longer than the test's timeout: only an immediate
		// redial can fill the shard.
		if _, err := sb.Fetch(t.Context(), FetchOptions{Peers: peers(a.addr), PeerRefresh: time.Hour}); err != nil {
			t.Fatal(err)
		}
		assertFileRange(t, filepath.Join(b.dir, file), data, sa.Manifest())
	}
	if got := len(log.accepted()); got != 2 {
		t.Fatalf("2 shards, the first one's connection closed by the member, took %d connections, want 2", got)
	}
}

// TestKeptConnectionOnlyForItsMember: a connection kept after an exchange
// with one member is never used for an exchange meant for another node at
// that address, nor once its member is banned: each gets a new connection
// and handshake, which the node at the address must pass as the one meant.
func TestKeptConnectionOnlyForItsMember(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("manifest of a shard nobody holds: %v, want ErrNoManifest", err)
	}
	// The address now belongs, as far as b knows, to node "c": a refuses
	// a handshake meant for c.
	if _, _, err := b.connect(t.Context(), a.addr, "c", askBufSize); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("connect to a's address expecting c: %v, want a refusal", err)
	}
	if got := len(log.accepted()); got != 2 {
		t.Fatalf("an exchange meant for c took %d connections in all, want 2 (the kept one was not c's)", got)
	}
	if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("manifest of a shard nobody holds: %v, want ErrNoManifest", err)
	}
	if got := len(log.accepted()); got != 3 {
		t.Fatalf("%d connections, want 3", got)
	}
	b.Ban(a.PublicKey())
	mc, kept, err := b.connect(context.Background(), a.addr, "a", askBufSize)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.c.Close()
	if kept {
		t.Fatal("a connection kept for a banned member was used again")
	}
}

// BenchmarkFetchFromMember is a node fetching one small shard after
// another from the same member, as a warming node does from its peers; it
// reports the handshakes it dialed per fetch.
func BenchmarkFetchFromMember(b *testing.B) {
	eachEncryption(b, func(b *testing.B, enc bool) {
		mod := func(c *Config) { c.Encrypt = enc; c.Logger = slog.New(slog.DiscardHandler) }
		a := startNode(b, "a", mod)
		n := startNode(b, "b", mod)
		sa, _ := buildShard(b, a, "m/f#0", "f", 4*testPiece)
		path := filepath.Join(n.dir, "f")
		b.ReportAllocs()
		for b.Loop() {
			s, err := n.Open(b.Context(), sa.Manifest(), path, noCompletion{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Fetch(b.Context(), FetchOptions{Peers: peers(a.addr)}); err != nil {
				b.Fatal(err)
			}
			if err := errors.Join(s.Close(), os.Remove(path)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n.Stats().HandshakesDialed)/float64(b.N), "dials/op")
	})
}

// eachEncryption runs f as a sub-benchmark per peer-connection mode:
// plaintext, then TLS.
func eachEncryption(b *testing.B, f func(b *testing.B, enc bool)) {
	for _, enc := range []bool{false, true} {
		name := "plaintext"
		if enc {
			name = "tls"
		}
		b.Run(name, func(b *testing.B) { f(b, enc) })
	}
}

// noCompletion stores nothing: every Open starts from an empty shard.
type noCompletion struct{}

func (noCompletion) Load(string) ([]byte, error) { return nil, nil }
func (noCompletion) Store(string, []byte) error  { return nil }
func (noCompletion) Delete(string) error         { return nil }

// TestFetchReturnsWhenLeaveIsNotAcknowledged: a member that never answers
// the downloader's leave, nor closes, costs the fetch at most StallTimeout;
// the connection is then closed, not kept.
func TestFetchReturnsWhenLeaveIsNotAcknowledged(t *testing.T) {
	data := randomData(t, 4*testPiece+5)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	addr := fakeMember(t, "mute", m, func(c net.Conn, br *bufio.Reader) {
		for {
			fr, err := readFrame(br)
			if err != nil {
				return
			}
			if fr.typ == msgUnsubscribe {
				_, _ = io.Copy(io.Discard, br) // until the downloader closes
				return
			}
			i, err := fr.index(m.NumPieces())
			if err != nil {
				return
			}
			off, n := m.PieceRange(i)
			if writeFrame(c, msgPiece, append(u32(i), u32(int(n))...)) != nil {
				return
			}
			if _, err := c.Write(data[off : off+n]); err != nil {
				return
			}
		}
	})
	x := startNode(t, "x", func(c *Config) { c.StallTimeout = 300 * time.Millisecond })
	s, err := x.Open(t.Context(), m, filepath.Join(x.dir, "f"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	var fetched atomic.Bool
	go func() {
		if _, err := s.Fetch(t.Context(), FetchOptions{Peers: peers(addr)}); err != nil {
			t.Error(err)
		}
		fetched.Store(true)
	}()
	wait.For(t, "the fetch to return", fetched.Load, wait.Timeout(10*time.Second))
	assertFileRange(t, filepath.Join(x.dir, "f"), data, m)
	if mc := x.idle.take(addr); mc != nil {
		mc.c.Close()
		t.Fatal("a connection whose leave was never acknowledged was kept")
	}
}

// TestBannedMemberLosesKeptConnection: a member banned while its
// connection waits for the next exchange gets nothing more on it, nor on a
// new one.
func TestBannedMemberLosesKeptConnection(t *testing.T) {
	a, log := startLoggedNode(t, "a")
	b := startNode(t, "b", nil)
	if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("manifest of a shard nobody holds: %v, want ErrNoManifest", err)
	}
	a.Ban(b.PublicKey())
	if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); err == nil || errors.Is(err, ErrNoManifest) {
		t.Fatalf("a banned member's ask: %v, want no answer", err)
	}
	if got := len(log.accepted()); got != 2 {
		t.Fatalf("%d connections, want 2 (the kept one, then a new one refused)", got)
	}
}

// BenchmarkHandshake is what a new member connection costs both ends
// together before its first exchange: TCP connect, TLS (when encrypting)
// and the identity handshake, over loopback.
func BenchmarkHandshake(b *testing.B) {
	eachEncryption(b, func(b *testing.B, enc bool) {
		cli, err := newAuth("c", oneKey(testKey), enc)
		if err != nil {
			b.Fatal(err)
		}
		srv, err := newAuth("s", oneKey(testKey), enc)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			cc, sc := tcpPair(b)
			deadline := time.Now().Add(10 * time.Second)
			done := make(chan error, 1)
			go func() {
				_, _, err := srv.server(sc, deadline)
				done <- err
			}()
			_, _, err := cli.client(cc, deadline, "s")
			if err := errors.Join(err, <-done); err != nil {
				b.Fatal(err)
			}
			cc.Close()
			sc.Close()
		}
	})
}
