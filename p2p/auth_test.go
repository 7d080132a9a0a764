package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A node without the cluster key gets no bitfield and no piece byte, in
// either connection mode.
func TestAuthRefusesOutsiders(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		name := map[bool]string{false: "hmac", true: "tls"}[encrypt]
		t.Run(name, func(t *testing.T) {
			data := randomData(t, 256<<10)
			m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
			member := startNode(t, "member", func(c *Config) { c.Encrypt = encrypt })
			seedNode(t, member, data, m, nil)
			wrongKey := bytes.Repeat([]byte{8}, ClusterKeySize)
			outsider := startNode(t, "outsider", func(c *Config) { c.Encrypt = encrypt; c.ClusterKey = wrongKey })
			s, err := outsider.Open(context.Background(), m, filepath.Join(outsider.dir, "f"), outsider.comp)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, err = s.Fetch(ctx, FetchOptions{Peers: peers(member.addr), PeerRefresh: 50 * time.Millisecond})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("outsider fetch: %v", err)
			}
			if got := outsider.Stats().PeerBytesIn; got != 0 {
				t.Fatalf("outsider received %d piece bytes", got)
			}
			if got := member.Stats().PeerBytesOut; got != 0 {
				t.Fatalf("member sent %d piece bytes", got)
			}
			if member.Stats().AuthFailures+outsider.Stats().AuthFailures == 0 {
				t.Fatal("no authentication failure recorded")
			}
			// The same member still serves a node holding the key.
			insider := startNode(t, "insider", func(c *Config) { c.Encrypt = encrypt })
			s2, err := insider.Open(context.Background(), m, filepath.Join(insider.dir, "f"), insider.comp)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s2.Fetch(context.Background(), FetchOptions{Peers: peers(member.addr)}); err != nil {
				t.Fatal(err)
			}
			assertFileRange(t, filepath.Join(insider.dir, "f"), data, m)
		})
	}
}

// The handshake itself: wrong keys fail on both sides, and a client that
// skips it straight to the peer protocol gets nothing back.
func TestHandshake(t *testing.T) {
	other := bytes.Repeat([]byte{9}, ClusterKeySize)
	cases := []struct {
		name           string
		clientKey      []byte
		clientEncrypt  bool
		serverEncrypt  bool
		wantClientAuth bool
	}{
		{"hmac same key", testKey, false, false, true},
		{"hmac wrong key", other, false, false, false},
		{"tls same key", testKey, true, true, true},
		{"tls wrong key", other, true, true, false},
		{"tls client, hmac server", testKey, true, false, false},
		{"hmac client, tls server", testKey, false, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srvAuth, err := newAuth("server", oneKey(testKey), c.serverEncrypt)
			if err != nil {
				t.Fatal(err)
			}
			cliAuth, err := newAuth("client", oneKey(c.clientKey), c.clientEncrypt)
			if err != nil {
				t.Fatal(err)
			}
			cc, sc := tcpPair(t)
			deadline := time.Now().Add(2 * time.Second)
			type result struct {
				id  peerIdentity
				err error
			}
			srvDone := make(chan result, 1)
			go func() {
				conn, id, err := srvAuth.server(sc, deadline)
				if err != nil {
					sc.Close() // a refusing server hangs up
				} else {
					_ = conn
				}
				srvDone <- result{id, err}
			}()
			_, id, err := cliAuth.client(cc, deadline, "")
			if err != nil {
				cc.Close() // as dial does
			}
			srv := <-srvDone
			if c.wantClientAuth {
				if err != nil || srv.err != nil || id.ID != "server" || srv.id.ID != "client" {
					t.Fatalf("client %q %v, server %q %v", id, err, srv.id, srv.err)
				}
				return
			}
			if err == nil && srv.err == nil {
				t.Fatal("both sides authenticated with mismatched credentials")
			}
			if srv.err == nil {
				t.Fatal("server accepted a client without the key")
			}
		})
	}
	t.Run("skipping the handshake", func(t *testing.T) {
		srvAuth, _ := newAuth("server", oneKey(testKey), false)
		cc, sc := tcpPair(t)
		go func() {
			var id [32]byte
			_ = writeFrame(cc, msgSubscribe, id[:])
			_ = writeFrame(cc, msgRequest, u32(0))
			_, _ = cc.Write(make([]byte, 64))
		}()
		if _, _, err := srvAuth.server(sc, time.Now().Add(time.Second)); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("err = %v", err)
		}
		sc.Close()
		_ = cc.SetReadDeadline(time.Now().Add(time.Second))
		got, _ := io.ReadAll(cc)
		if len(got) != 0 {
			t.Fatalf("server sent %d bytes to an unauthenticated client", len(got))
		}
	})
}

func TestNewAuthRejectsBadConfig(t *testing.T) {
	if _, err := newAuth("n", oneKey(make([]byte, 16)), false); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := newAuth("", oneKey(testKey), false); err == nil {
		t.Fatal("empty node id accepted")
	}
}

func tcpPair(t testing.TB) (client, server net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func oneKey(k []byte) func() [][]byte { return func() [][]byte { return [][]byte{k} } }

// During a rotation nodes dial with different keys; a node accepts any key
// it holds, and refuses one it does not, encrypted or not (TLS once came
// from the key a node started with, so a rotation cut encrypted nodes off
// from each other until they restarted).
func TestAuthAcceptsEveryInstalledKey(t *testing.T) {
	oldKey, newKey := testKey, bytes.Repeat([]byte{9}, ClusterKeySize)
	both := func() [][]byte { return [][]byte{oldKey, newKey} }
	cases := []struct {
		name     string
		client   func() [][]byte
		server   func() [][]byte
		accepted bool
	}{
		{"switched client, server with both", oneKey(newKey), both, true},
		{"old client, switched server with both", oneKey(oldKey), func() [][]byte { return [][]byte{newKey, oldKey} }, true},
		{"new client, server that removed it", oneKey(newKey), oneKey(oldKey), false},
		{"old client, server that removed it", oneKey(oldKey), oneKey(newKey), false},
	}
	for _, encrypt := range []bool{false, true} {
		for _, c := range cases {
			testAuthKeys(t, encrypt, c.name, c.client, c.server, c.accepted)
		}
	}
}

func testAuthKeys(t *testing.T, encrypt bool, name string, client, server func() [][]byte, accepted bool) {
	t.Run(fmt.Sprintf("%s/encrypt=%v", name, encrypt), func(t *testing.T) {
		srvAuth, err := newAuth("server", server, encrypt)
		if err != nil {
			t.Fatal(err)
		}
		cliAuth, err := newAuth("client", client, encrypt)
		if err != nil {
			t.Fatal(err)
		}
		cc, sc := tcpPair(t)
		srvErr := make(chan error, 1)
		go func() {
			_, _, err := srvAuth.server(sc, time.Now().Add(time.Second))
			sc.Close()
			srvErr <- err
		}()
		_, id, err := cliAuth.client(cc, time.Now().Add(time.Second), "")
		serr := <-srvErr
		if accepted {
			if err != nil || serr != nil || id.ID != "server" {
				t.Fatalf("client %q %v, server %v", id, err, serr)
			}
			return
		}
		if serr == nil || err == nil {
			t.Fatalf("accepted: client %v, server %v", err, serr)
		}
	})
}

// closeWatch signals on closed each time the node closes a connection it
// accepted.
type closeWatch struct {
	net.Listener
	closed chan struct{}
}

func (l closeWatch) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, closed: l.closed}, nil
}

type watchedConn struct {
	net.Conn
	closed chan struct{}
	once   sync.Once
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.Conn.Close()
}

// A connection that hangs up in the middle of the TLS handshake (a member
// shutting down resets the ones in flight) proves nothing either way: it
// is not counted as an authentication failure on either side. One that
// speaks something else than TLS is.
func TestHangUpInHandshakeIsNoAuthFailure(t *testing.T) {
	closed := make(chan struct{}, 4)
	tlsOn := func(c *Config) { c.Encrypt = true }
	a := startNodeListening(t, "a", tlsOn, func(ln net.Listener) net.Listener { return closeWatch{ln, closed} })
	awaitClose := func(what string) {
		t.Helper()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("the node did not close %s", what)
		}
	}
	reset := func(c net.Conn) {
		_ = c.(*net.TCPConn).SetLinger(0) // close with a reset, as a process that exits
		c.Close()
	}
	c, err := net.Dial("tcp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	reset(c)
	awaitClose("a connection reset before the handshake")
	if n := a.Stats().AuthFailures; n != 0 {
		t.Fatalf("a connection reset before the handshake counted %d authentication failures", n)
	}
	c, err = net.Dial("tcp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	awaitClose("a connection that spoke HTTP")
	if n := a.Stats().AuthFailures; n != 1 {
		t.Fatalf("a client speaking HTTP counted %d authentication failures, want 1", n)
	}

	// The dialing side: a member that resets every connection it accepts.
	resetter := serveRaw(t, reset)
	b := startNode(t, "b", tlsOn)
	if _, err := b.FetchManifest(t.Context(), resetter, "m/f#0"); err == nil || errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("ask of a member that hangs up: %v, want a failure that is no authentication failure", err)
	}
	if n := b.Stats().AuthFailures; n != 0 {
		t.Fatalf("dialing a member that hangs up counted %d authentication failures", n)
	}
}
