package p2p

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var testKey = bytes.Repeat([]byte{7}, ClusterKeySize)

type testNode struct {
	*Node
	addr string
	dir  string
	comp *BoltCompletion
}

// startNode runs a node on a loopback port until the test ends.
func startNode(t testing.TB, id string, mod func(*Config)) *testNode {
	t.Helper()
	return startNodeListening(t, id, mod, nil)
}

// startNodeListening is startNode with the node's listener wrapped by wrap
// (if not nil), for a test that watches what the node accepts.
func startNodeListening(t testing.TB, id string, mod func(*Config), wrap func(net.Listener) net.Listener) *testNode {
	t.Helper()
	cfg := Config{NodeID: id, ClusterKey: testKey, StallTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if mod != nil {
		mod(&cfg)
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.Serve(ctx, ln); err != nil {
			t.Errorf("serve %s: %v", id, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	comp, err := NewBoltCompletion(db, "pieces")
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{Node: n, addr: ln.Addr().String(), dir: dir, comp: comp}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func randomData(t testing.TB, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(n)}).Read(b)
	return b
}

// manifestFor hashes data the way an origin would.
func manifestFor(t testing.TB, data []byte, off, length, piece int64, algo HashAlgo) *Manifest {
	m := &Manifest{ShardID: "test/file#" + strconv.FormatInt(off, 10), Name: "file", FileSize: int64(len(data)),
		Offset: off, Length: length, PieceLength: piece, Algo: algo}
	for i := range m.NumPieces() {
		o, n := m.PieceRange(i)
		h := algo.new()
		h.Write(data[o : o+n])
		m.Hashes = append(m.Hashes, h.Sum(nil)...)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	return m
}

// httpOrigin serves data over HTTP range requests, like S3, and counts the
// bytes it sends.
type httpOrigin struct {
	srv  *httptest.Server
	mu   sync.Mutex
	sent int64
}

func newHTTPOrigin(t testing.TB, data []byte) *httpOrigin {
	o := &httpOrigin{}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(countingWriter{w, o}, r, "blob", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(o.srv.Close)
	return o
}

type countingWriter struct {
	http.ResponseWriter
	o *httpOrigin
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.o.mu.Lock()
	c.o.sent += int64(n)
	c.o.mu.Unlock()
	return n, err
}

func (o *httpOrigin) Sent() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sent
}

func (o *httpOrigin) Source() ByteSource {
	return func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.srv.URL, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-"+strconv.FormatInt(off+n-1, 10))
		resp, err := o.srv.Client().Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusPartialContent {
			resp.Body.Close()
			return nil, &os.PathError{Op: "range get", Path: o.srv.URL, Err: os.ErrInvalid}
		}
		return resp.Body, nil
	}
}

func peers(addrs ...string) PeerSource { return PeerFunc(func() []string { return addrs }) }

// peerHolds reports whether the fetch running on n's shard shardID knows
// that a connected peer holds piece i.
func peerHolds(n *Node, shardID string, i int) bool {
	n.mu.Lock()
	s := n.shards[shardID]
	n.mu.Unlock()
	if s == nil {
		return false
	}
	s.mu.Lock()
	f := s.running
	s.mu.Unlock()
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.avail[i] > 0
}

func assertFileRange(t *testing.T, path string, data []byte, m *Manifest) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != m.FileSize {
		t.Fatalf("%s is %d bytes, want %d", path, len(got), m.FileSize)
	}
	if !bytes.Equal(got[m.Offset:m.Offset+m.Length], data[m.Offset:m.Offset+m.Length]) {
		t.Fatalf("%s differs from the source", path)
	}
}

// fakeMember is a scripted peer that holds the cluster key: for each
// connection it authenticates, reads the subscribe frame, claims every piece
// of m (with its hash) and leaves the rest of the conversation to serve.
func fakeMember(t *testing.T, name string, m *Manifest, serve func(c net.Conn, br *bufio.Reader)) string {
	a, err := newAuth(name, oneKey(testKey), false)
	if err != nil {
		t.Fatal(err)
	}
	greet := func(raw net.Conn) {
		defer raw.Close()
		c, _, err := a.server(raw, time.Now().Add(2*time.Second))
		if err != nil {
			return
		}
		br := bufio.NewReader(c)
		if _, err := readFrame(br); err != nil {
			return
		}
		full := NewBitfield(m.NumPieces())
		for i := range m.NumPieces() {
			full.Set(i)
		}
		if writeFrame(c, msgBitfield, append(full.Bytes(), m.Hashes...)) != nil {
			return
		}
		serve(c, br)
	}
	return serveRaw(t, greet)
}

// serveRaw listens on loopback until the test ends and hands every
// connection, unauthenticated, to handle in a goroutine of its own; it
// returns the address.
func serveRaw(t testing.TB, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// buildAsync runs n.Build in the background and keeps the built shard open,
// serving followers that may still need its last pieces, until the test
// ends.
func buildAsync(t *testing.T, n *testNode, spec BuildSpec) <-chan error {
	t.Helper()
	built := make(chan error, 1)
	go func() {
		b, err := n.Build(context.Background(), spec)
		if err == nil {
			t.Cleanup(func() { b.Close() })
		}
		built <- err
	}()
	return built
}

// bannedID reports whether n banned the peer that went by node ID id (by
// the key n pinned to it on first sight).
func (n *testNode) bannedID(id string) bool {
	n.mu.Lock()
	k := n.pins[id]
	n.mu.Unlock()
	return k != nil && n.Banned(k)
}
