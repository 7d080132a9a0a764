package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a connection that keeps a copy of what is written to it.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.out.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

func (r *recorder) written() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.out.Bytes())
}

// handshakePair runs cli.client against srv.server over loopback TCP.
func handshakePair(t *testing.T, cli, srv *auth, want string, wrap func(net.Conn) net.Conn) (cliPeer, srvPeer peerIdentity, cliErr, srvErr error) {
	t.Helper()
	cc, sc := tcpPair(t)
	deadline := time.Now().Add(2 * time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, srvPeer, srvErr = srv.server(sc, deadline)
		if srvErr != nil {
			sc.Close()
		}
	}()
	c := cc
	if wrap != nil {
		c = wrap(cc)
	}
	_, cliPeer, cliErr = cli.client(c, deadline, want)
	if cliErr != nil {
		cc.Close()
	}
	<-done
	return
}

func mustAuth(t *testing.T, id string, encrypt bool) *auth {
	t.Helper()
	a, err := newAuth(id, oneKey(testKey), encrypt)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A recorded handshake replays nowhere: the client's half, sent again to
// the server, meets a fresh server nonce, and the server's half, sent to a
// client, meets a fresh client nonce. Neither side gets a connection.
func TestHandshakeReplayFails(t *testing.T) {
	srv, cli := mustAuth(t, "server", false), mustAuth(t, "client", false)
	var rec *recorder
	_, _, cerr, serr := handshakePair(t, cli, srv, "server", func(c net.Conn) net.Conn { rec = &recorder{Conn: c}; return rec })
	if cerr != nil || serr != nil {
		t.Fatalf("recording: client %v, server %v", cerr, serr)
	}
	sent := rec.written() // hello, then the client's proof

	t.Run("client half to a server", func(t *testing.T) {
		cc, sc := tcpPair(t)
		go func() { _, _ = cc.Write(sent) }()
		_, _, err := srv.server(sc, time.Now().Add(2*time.Second))
		if !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("replayed client handshake: err = %v, want ErrUnauthenticated", err)
		}
	})
	t.Run("server half to a client", func(t *testing.T) {
		// A fake server that records a real server's answer to one client
		// and plays it to the next.
		var answer []byte
		rs := &recorder{}
		_, _, cerr, serr := handshakePairServerRecorded(t, cli, srv, rs)
		if cerr != nil || serr != nil {
			t.Fatalf("recording: client %v, server %v", cerr, serr)
		}
		answer = rs.written()
		cc, sc := tcpPair(t)
		go func() {
			_, _, _ = readHello(sc)
			_, _ = sc.Write(answer)
			_, _ = io.Copy(io.Discard, sc)
		}()
		_, _, err := cli.client(cc, time.Now().Add(2*time.Second), "")
		if !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("replayed server handshake: err = %v, want ErrUnauthenticated", err)
		}
	})
}

// handshakePairServerRecorded is handshakePair with the server's writes
// recorded into rs.
func handshakePairServerRecorded(t *testing.T, cli, srv *auth, rs *recorder) (peerIdentity, peerIdentity, error, error) {
	cc, sc := tcpPair(t)
	rs.Conn = sc
	deadline := time.Now().Add(2 * time.Second)
	var sp peerIdentity
	var serr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, sp, serr = srv.server(rs, deadline)
	}()
	_, cp, cerr := cli.client(cc, deadline, "")
	<-done
	return cp, sp, cerr, serr
}

// relay dials to and passes bytes both ways between a client connection
// and the real server: a member in the middle of someone else's handshake.
func relay(t *testing.T, from net.Conn, to net.Conn) {
	go func() { _, _ = io.Copy(to, from); to.Close() }()
	go func() { _, _ = io.Copy(from, to); from.Close() }()
}

func tlsServer(a *auth, c net.Conn) (net.Conn, error) {
	tc := tls.Server(c, a.tlsConf)
	return tc, tc.Handshake()
}

func tlsClient(a *auth, c net.Conn) (net.Conn, error) {
	tc := tls.Client(c, a.tlsConf)
	return tc, tc.Handshake()
}

// A member that passes another's handshake through (the dialer reached
// the relay, meaning to reach the relay's node) cannot present the real
// server as itself: the dialer names the node it means to reach, signed
// into the transcript, and over TLS the transcript holds the TLS session,
// which the relay's two sessions do not share.
func TestHandshakeRelayRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		encrypt bool
		want    string
	}{
		{"plaintext, dialer names the relay's node", false, "relay"},
		{"tls, dialer names no one", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := mustAuth(t, "server", tc.encrypt), mustAuth(t, "client", tc.encrypt)
			relayTLS := mustAuth(t, "relay", tc.encrypt)
			// The relay: accepts the client, and dials the server.
			cc, rc := tcpPair(t)
			rs, sc := tcpPair(t)
			srvErr := make(chan error, 1)
			go func() {
				_, _, err := srv.server(sc, time.Now().Add(2*time.Second))
				sc.Close()
				srvErr <- err
			}()
			if tc.encrypt {
				// The relay holds the cluster key, so it can end the
				// client's TLS session and open its own to the server.
				go func() {
					in, err := tlsServer(relayTLS, rc)
					if err != nil {
						rc.Close()
						return
					}
					out, err := tlsClient(relayTLS, rs)
					if err != nil {
						in.Close()
						return
					}
					relay(t, in, out)
				}()
			} else {
				relay(t, rc, rs)
			}
			_, peer, err := cli.client(cc, time.Now().Add(2*time.Second), tc.want)
			if err == nil {
				t.Fatalf("the client took a relayed handshake from %s", peer)
			}
			if serr := <-srvErr; serr == nil {
				t.Fatal("the server took a relayed handshake")
			}
		})
	}
}

// Sides that speak different handshake versions say so at once, with the
// versions, instead of waiting out a deadline.
func TestHandshakeVersionMismatch(t *testing.T) {
	srv, cli := mustAuth(t, "server", false), mustAuth(t, "client", false)
	t.Run("an older client", func(t *testing.T) {
		cc, sc := tcpPair(t)
		// What a version 3 client sends first.
		go func() { _, _ = cc.Write(append([]byte("WFP2P3"), make([]byte, 32+8+32+2)...)) }()
		start := time.Now()
		_, _, err := srv.server(sc, time.Now().Add(5*time.Second))
		if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "version '3', this node '4'") {
			t.Fatalf("err = %v", err)
		}
		sc.Close()
		// The old client reads the server's version where it expects its
		// nonce, then the end of the connection: an error, not a hang.
		got, _ := io.ReadAll(cc)
		if string(got) != "WFP2P4" || time.Since(start) > 4*time.Second {
			t.Fatalf("old client got %q", got)
		}
	})
	t.Run("an older server", func(t *testing.T) {
		cc, sc := tcpPair(t)
		go func() {
			// A version 2 server reads its fixed header, finds the magic
			// wrong, and hangs up.
			_, _ = io.ReadFull(sc, make([]byte, 46))
			sc.Close()
		}()
		_, _, err := cli.client(cc, time.Now().Add(5*time.Second), "")
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "older than handshake version '4'") {
			t.Fatalf("err = %v", err)
		}
	})
	// A version 3 server (whose manifest asks are never held) answers as
	// any server of another version does.
	for _, v := range []byte{'3', '5'} {
		t.Run("a server of version "+string(v), func(t *testing.T) {
			cc, sc := tcpPair(t)
			go func() {
				_, _ = io.ReadFull(sc, make([]byte, 10))
				_, _ = sc.Write([]byte("WFP2P" + string(v)))
				sc.Close()
			}()
			_, _, err := cli.client(cc, time.Now().Add(5*time.Second), "")
			if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "version '"+string(v)+"', this node '4'") {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// A peer's node ID must come with the key it is pinned to; the dialer's
// expectation holds too.
func TestHandshakeIdentityChecks(t *testing.T) {
	srv, cli := mustAuth(t, "server", false), mustAuth(t, "client", false)
	if _, _, cerr, serr := handshakePair(t, cli, srv, "someone-else", nil); !errors.Is(cerr, ErrIdentity) && !errors.Is(serr, ErrIdentity) {
		t.Fatalf("dialing for another node: client %v, server %v", cerr, serr)
	}
	other, _, _ := ed25519.GenerateKey(nil)
	srv.trust = func(p peerIdentity) error {
		if !p.Key.Equal(other) {
			return ErrIdentity
		}
		return nil
	}
	_, _, cerr, serr := handshakePair(t, cli, srv, "", nil)
	if !errors.Is(serr, ErrIdentity) || cerr == nil {
		t.Fatalf("client with an unpinned key: client %v, server %v", cerr, serr)
	}
	srv.trust = nil
	cp, sp, cerr, serr := handshakePair(t, cli, srv, "server", nil)
	if cerr != nil || serr != nil || cp.ID != "server" || !cp.Key.Equal(srv.priv.Public()) || sp.ID != "client" || !sp.Key.Equal(cli.priv.Public()) {
		t.Fatalf("client %v %v, server %v %v", cp, cerr, sp, serr)
	}
}

// The identity file is made once, 0600, and read back the same; a corrupt
// one is an error that names it, and is left alone.
func TestLoadIdentity(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, IdentityFile)
	k1, err := LoadIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v, mode %v", err, st.Mode())
	}
	k2, err := LoadIdentity(path)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("second load: %v, same key %v", err, k1.Equal(k2))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("data directory holds %d entries, want only the key", len(ents))
	}
	for name, content := range map[string]string{
		"empty":     "",
		"truncated": "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2Vw\n",
		"garbage":   "not a key\n",
	} {
		bad := filepath.Join(dir, name)
		if err := os.WriteFile(bad, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadIdentity(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%s key file: err = %v, want an error naming the file", name, err)
		}
		if b, _ := os.ReadFile(bad); string(b) != content {
			t.Errorf("%s key file was rewritten", name)
		}
	}
	// Processes racing to make the key agree on one.
	race := filepath.Join(t.TempDir(), IdentityFile)
	keys := make([]ed25519.PrivateKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadIdentity(race)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !k.Equal(keys[0]) {
			t.Fatal("concurrent loads made different keys")
		}
	}
}

func FuzzReadHello(f *testing.F) {
	h := hello{id: "node-a", want: "node-b"}
	f.Add(h.marshal())
	f.Add((&hello{id: "n"}).marshal())
	f.Add([]byte("WFP2P2"))
	f.Add([]byte("WFP2P3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, raw, err := readHello(bytes.NewReader(b))
		if err != nil {
			return
		}
		if !bytes.HasPrefix(b, raw) || !bytes.Equal(got.marshal(), raw) {
			t.Fatalf("decoded %d bytes that do not encode back", len(raw))
		}
		if !validName(got.id) || got.want != "" && !validName(got.want) {
			t.Fatalf("accepted ids %q %q", got.id, got.want)
		}
	})
}

func FuzzReadAnswer(f *testing.F) {
	a := answer{id: "node-a"}
	f.Add(append(append(a.head(), a.mac[:]...), a.sig[:]...))
	f.Add([]byte("WFP2P4"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := readAnswer(bytes.NewReader(b))
		if err != nil {
			return
		}
		enc := append(append(got.head(), got.mac[:]...), got.sig[:]...)
		if !bytes.HasPrefix(b, enc) || !validName(got.id) {
			t.Fatalf("decoded an answer that does not encode back: %q", got.id)
		}
	})
}
