package peer

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/prefix"
)

func TestEventRoundTrip(t *testing.T) {
	events := []router.Event{
		{Kind: router.Placed, Backend: 1<<63 + 5, Blocks: 3, Keys: []uint64{1, 2, 1 << 60}},
		{Kind: router.Placed, Backend: 7},
		{Kind: router.Prefilled, Backend: 7, Blocks: 300},
		{Kind: router.Released, Backend: 7},
		{Kind: router.Load, Backend: 9, Blocks: 12, Inflight: 4, Prefilling: 2},
	}
	var b []byte
	for _, e := range events {
		b = appendEvent(b, e)
	}
	r := bufio.NewReader(bytes.NewReader(b))
	for i, want := range events {
		got, err := readEvent(r)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("event %d: got %+v, %v; want %+v", i, got, err, want)
		}
	}
	if _, err := readEvent(r); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReadEventRejects(t *testing.T) {
	placed := appendEvent(nil, router.Event{Kind: router.Placed, Backend: 1, Blocks: 1, Keys: []uint64{1, 2}})
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"unknown kind", []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 0}},
		{"kind 99", []byte{99}},
		{"truncated backend", []byte{byte(router.Released), 1, 2}},
		{"truncated keys", placed[:len(placed)-3]},
		{"too many keys", append(append([]byte{byte(router.Placed)}, make([]byte, 8)...), 0, 0xff, 0xff, 0xff, 0x7f)},
		{"huge blocks", append(append([]byte{byte(router.Prefilled)}, make([]byte, 8)...), 0xff, 0xff, 0xff, 0xff, 0x7f)},
		{"varint overflow", append(append([]byte{byte(router.Released)}, make([]byte, 8)...), bytes.Repeat([]byte{0xff}, 11)...)},
	} {
		if _, err := readEvent(bufio.NewReader(bytes.NewReader(tc.b))); err == nil || err == io.EOF {
			t.Errorf("%s: %v, want a frame error", tc.name, err)
		}
	}
}

func FuzzReadEvent(f *testing.F) {
	f.Add(appendEvent(nil, router.Event{Kind: router.Placed, Backend: 1, Blocks: 2, Keys: []uint64{3, 4}}))
	f.Add(appendEvent(nil, router.Event{Kind: router.Load, Backend: 1, Blocks: 2, Inflight: 3, Prefilling: 1}))
	f.Add([]byte{byte(router.Placed), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReader(bytes.NewReader(b))
		for {
			e, err := readEvent(r)
			if err != nil {
				return
			}
			// What is accepted is within the limits and encodes back to
			// what decodes the same.
			if len(e.Keys) > maxKeys || e.Blocks > maxCount || e.Inflight > maxCount || e.Prefilling > maxCount {
				t.Fatalf("accepted %+v", e)
			}
			again, err := readEvent(bufio.NewReader(bytes.NewReader(appendEvent(nil, e))))
			if err != nil || !reflect.DeepEqual(again, e) {
				t.Fatalf("re-encoded %+v decodes as %+v, %v", e, again, err)
			}
		}
	})
}

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu      sync.Mutex
	events  map[string][]router.Event
	forgets []string
}

func (r *recorder) Observe(peer string, e router.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.events == nil {
		r.events = map[string][]router.Event{}
	}
	r.events[peer] = append(r.events[peer], e)
}

func (r *recorder) ForgetPeer(peer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgets = append(r.forgets, peer)
}

func (r *recorder) state() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, es := range r.events {
		n += len(es)
	}
	return n, append([]string(nil), r.forgets...)
}

var testSecret = Secret([]byte("fleet key"))

// streamReq builds a signed stream request carrying body.
func streamReq(t *testing.T, url, name string, secret []byte, at time.Time, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+Path, body)
	if err != nil {
		t.Fatal(err)
	}
	unix := strconv.FormatInt(at.Unix(), 10)
	req.Header.Set(headerName, name)
	req.Header.Set(headerTime, unix)
	req.Header.Set(headerAuth, sign(secret, name, unix))
	return req
}

func TestHandlerRefusesStrangers(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(NewHandler("self", testSecret, rec, nil, nil))
	defer srv.Close()
	frame := appendEvent(nil, router.Event{Kind: router.Released, Backend: 1})
	now := time.Now()
	for _, tc := range []struct {
		name   string
		req    *http.Request
		status int
	}{
		{"another fleet's key", streamReq(t, srv.URL, "a", Secret([]byte("other")), now, bytes.NewReader(frame)), 401},
		{"the cluster key itself", streamReq(t, srv.URL, "a", []byte("fleet key"), now, bytes.NewReader(frame)), 401},
		{"stale timestamp", streamReq(t, srv.URL, "a", testSecret, now.Add(-3*time.Minute), bytes.NewReader(frame)), 401},
		{"future timestamp", streamReq(t, srv.URL, "a", testSecret, now.Add(3*time.Minute), bytes.NewReader(frame)), 401},
		{"own name", streamReq(t, srv.URL, "self", testSecret, now, bytes.NewReader(frame)), 401},
		{"name with a space", streamReq(t, srv.URL, "a b", testSecret, now, bytes.NewReader(frame)), 401},
		{"empty name", streamReq(t, srv.URL, "", testSecret, now, bytes.NewReader(frame)), 401},
		{"bad frame", streamReq(t, srv.URL, "a", testSecret, now, bytes.NewReader([]byte{42})), 400},
		{"good stream", streamReq(t, srv.URL, "a", testSecret, now, bytes.NewReader(frame)), 204},
	} {
		resp, err := http.DefaultClient.Do(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
	}
	resp, err := http.Get(srv.URL + Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d", resp.StatusCode)
	}
	// Only the good stream's one event got through; both accepted streams
	// made the handler forget the peer's load when they ended.
	if n, forgets := rec.state(); n != 1 || len(forgets) != 2 {
		t.Fatalf("%d events observed, forgets %v; want 1 event, 2 forgets", n, forgets)
	}
}

// TestNewerStreamKeepsLoad: a peer that reconnects before its old stream
// is seen to end must not have its new load forgotten when the old one
// ends.
func TestNewerStreamKeepsLoad(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(NewHandler("self", testSecret, rec, nil, nil))
	defer srv.Close()
	oldR, oldW := io.Pipe()
	oldDone := make(chan struct{})
	go func() {
		defer close(oldDone)
		if resp, err := http.DefaultClient.Do(streamReq(t, srv.URL, "a", testSecret, time.Now(), oldR)); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := oldW.Write(appendEvent(nil, router.Event{Kind: router.Released, Backend: 1})); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "one event received", func() bool { n, _ := rec.state(); return n == 1 })
	newR, newW := io.Pipe()
	newDone := make(chan struct{})
	go func() {
		defer close(newDone)
		if resp, err := http.DefaultClient.Do(streamReq(t, srv.URL, "a", testSecret, time.Now(), newR)); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := newW.Write(appendEvent(nil, router.Event{Kind: router.Released, Backend: 1})); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "two events received", func() bool { n, _ := rec.state(); return n == 2 })
	oldW.Close()
	<-oldDone
	if _, forgets := rec.state(); len(forgets) != 0 {
		t.Fatalf("the old stream's end forgot the peer while a newer stream was open: %v", forgets)
	}
	newW.Close()
	<-newDone
	if _, forgets := rec.state(); len(forgets) != 1 {
		t.Fatalf("forgets %v after the newest stream ended, want one", forgets)
	}
}

// replica is one router of TestLinkSharesPlacements and its peer link.
type replica struct {
	name     string
	rt       *router.Router
	api      *httptest.Server
	peer     *httptest.Server
	link     *Link
	observed atomic.Int64 // request events its handler applied
}

// countingObserver applies events to a replica's router and counts the
// request events among them.
type countingObserver struct{ r *replica }

func (c countingObserver) Observe(peer string, e router.Event) {
	c.r.rt.Observe(peer, e)
	if e.Kind != router.Load {
		c.r.observed.Add(1)
	}
}

func (c countingObserver) ForgetPeer(peer string) { c.r.rt.ForgetPeer(peer) }

// TestLinkSharesPlacements: two real routers joined by links over HTTP.
// Documents first sent through replica a go, through replica b, to the
// backend a chose, as hits; and a's requests count in b's view of load.
func TestLinkSharesPlacements(t *testing.T) {
	var backends []router.BackendConfig
	release := make(chan struct{})
	for i := range 4 {
		name := fmt.Sprint("b", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("X-Backend", name)
			if r.Header.Get("X-Hold") != "" {
				<-release
			}
			_, _ = io.WriteString(w, `{"ok":true}`)
		}))
		defer srv.Close()
		backends = append(backends, router.BackendConfig{URL: srv.URL, ID: name})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The peer listeners come first: each link needs the other's URL. The
	// handler is made once the replica's router exists.
	ra, rb := &replica{name: "a"}, &replica{name: "b"}
	for _, r := range []*replica{ra, rb} {
		r.peer = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			NewHandler(r.name, testSecret, countingObserver{r}, nil, nil).ServeHTTP(w, req)
		}))
		t.Cleanup(r.peer.Close)
	}
	start := func(r *replica, name, peerURL string) *replica {
		cfg := router.Defaults()
		cfg.ProbeInterval = -1
		cfg.Backends = backends
		var err error
		r.link, err = NewLink(name, []string{peerURL}, testSecret, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.rt, err = router.New(cfg, router.Options{Source: router.NewStaticSource(router.StaticEndpoints(&cfg), nil),
			HashKey: prefix.KeyFromBytes([]byte("fleet")), OnEvent: r.link.Send})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = r.rt.Run(ctx) }()
		r.api = httptest.NewServer(r.rt)
		t.Cleanup(r.api.Close)
		return r
	}
	a, b := start(ra, "a", rb.peer.URL), start(rb, "b", ra.peer.URL)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { a.link.Run(ctx, a.rt.LoadEvents) })
	wg.Go(func() { b.link.Run(ctx, b.rt.LoadEvents) })
	wait.For(t, "both links up", func() bool { return a.link.Stats()[0].Up && b.link.Stats()[0].Up })

	send := func(r *replica, body string, hdr ...string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, r.api.URL+"/v1/completions", strings.NewReader(body))
		req.Header.Set(router.DebugRequestHeader, "1")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	doc := func(d, q int) string {
		return fmt.Sprintf(`{"model":"m","prompt":%q}`, strings.Repeat(fmt.Sprintf("document %d says something long. ", d), 100)+fmt.Sprint(" question ", q))
	}
	placed := map[int]string{}
	for d := range 12 {
		placed[d] = send(a, doc(d, 0)).Header.Get("X-Backend")
	}
	// b has heard of all 12 once its handler applied 36 request events
	// (placed, prefilled, released each) besides a's load snapshots.
	wait.For(t, "b applied 36 request events", func() bool { return b.observed.Load() >= 36 })
	for d := range 12 {
		resp := send(b, doc(d, 1))
		if got, route := resp.Header.Get("X-Backend"), resp.Header.Get(router.RouteHeader); got != placed[d] || !strings.Contains(route, "reason=hit") {
			t.Errorf("doc %d: b sent it to %s (%s); a placed it on %s", d, got, route, placed[d])
		}
	}
	// A request a holds open counts on b's side until it ends.
	held := make(chan struct{})
	go func() { defer close(held); send(a, `{"model":"m","prompt":"hold"}`, "X-Hold", "1") }()
	peerInflight := func() int {
		n := 0
		for _, s := range b.rt.Snapshot().Backends {
			n += s.PeerInflight
		}
		return n
	}
	wait.For(t, "one request in flight at the peer", func() bool { return peerInflight() == 1 })
	close(release)
	<-held
	wait.For(t, "no request in flight at the peer", func() bool { return peerInflight() == 0 })
}

// nopObserver applies nothing and counts what it is told.
type nopObserver struct{ n atomic.Int64 }

func (o *nopObserver) Observe(string, router.Event) { o.n.Add(1) }
func (o *nopObserver) ForgetPeer(string)            {}

// BenchmarkLinkPlaced streams Placed events of a 12k-token prompt (750
// blocks of 16 tokens, the Mooncake conversation trace's mean) from a Link
// to a Handler over loopback HTTP: what one replica's decisions cost to
// share, per request.
func BenchmarkLinkPlaced(b *testing.B) {
	obs := &nopObserver{}
	srv := httptest.NewServer(NewHandler("b", testSecret, obs, nil, nil))
	defer srv.Close()
	l, err := NewLink("a", []string{srv.URL}, testSecret, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx, func() []router.Event { return nil }); close(done) }()
	defer func() { cancel(); <-done }()
	keys := make([]uint64, 750)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	e := router.Event{Kind: router.Placed, Backend: 1, Blocks: 100, Keys: keys}
	b.SetBytes(int64(len(appendEvent(nil, e))))
	b.ResetTimer()
	for range b.N {
		for len((*l.peers.Load())[0].queue) > queueLen/2 { // keep up rather than drop
			time.Sleep(10 * time.Microsecond)
		}
		l.Send(e)
	}
	for obs.n.Load() < int64(b.N) {
		time.Sleep(10 * time.Microsecond)
	}
	if s := l.Stats()[0]; s.Dropped != 0 {
		b.Fatalf("dropped %d", s.Dropped)
	}
}

// TestLinkSetPeers: a peer added at run time gets a stream (starting with
// a load snapshot), and a peer removed has its stream ended, so it forgets
// this replica's load.
func TestLinkSetPeers(t *testing.T) {
	recA, recB := &recorder{}, &recorder{}
	srvA := httptest.NewServer(NewHandler("pa", testSecret, recA, nil, nil))
	defer srvA.Close()
	srvB := httptest.NewServer(NewHandler("pb", testSecret, recB, nil, nil))
	defer srvB.Close()
	l, err := NewLink("me", []string{srvA.URL}, testSecret, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	snapshot := func() []router.Event { return []router.Event{{Kind: router.Load, Backend: 1, Inflight: 2}} }
	go func() { l.Run(ctx, snapshot); close(done) }()
	defer func() { cancel(); <-done }()
	wait.For(t, "a received an event", func() bool { n, _ := recA.state(); return n >= 1 })
	l.SetPeers([]string{srvB.URL, srvB.URL})
	wait.For(t, "b received an event", func() bool { n, _ := recB.state(); return n >= 1 })
	wait.For(t, "a's full-state received", func() bool { _, f := recA.state(); return len(f) == 1 })
	l.Send(router.Event{Kind: router.Released, Backend: 1})
	wait.For(t, "b saw the release", func() bool {
		recB.mu.Lock()
		defer recB.mu.Unlock()
		for _, e := range recB.events["me"] {
			if e.Kind == router.Released {
				return true
			}
		}
		return false
	})
	if st := l.Stats(); len(st) != 1 || st[0].URL != srvB.URL {
		t.Fatalf("stats %+v, want one peer, %s", st, srvB.URL)
	}
	// The counters reach Prometheus, per peer still listed.
	reg := prometheus.NewRegistry()
	reg.MustRegister(l)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != srvB.URL {
				t.Fatalf("%s labelled %v, want peer=%s only", f.GetName(), m.GetLabel(), srvB.URL)
			}
			got[f.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if got["warmfleet_router_peer_up"] != 1 || got["warmfleet_router_peer_events_sent_total"] < 1 || len(got) != 3 {
		t.Fatalf("peer metrics %v: want up 1, at least one event sent, and dropped", got)
	}
	recA.mu.Lock()
	defer recA.mu.Unlock()
	for _, e := range recA.events["me"] {
		if e.Kind == router.Released {
			t.Fatal("a removed peer got an event sent after its removal")
		}
	}
	if first := recA.events["me"][0]; first.Kind != router.Load || first.Inflight != 2 {
		t.Fatalf("a stream began with %+v, not the load snapshot", first)
	}
}

// TestHandlerCloseEndsStreams: a server's graceful shutdown must not wait
// for peers' streams, which last as long as the peers run.
func TestHandlerCloseEndsStreams(t *testing.T) {
	rec := &recorder{}
	h := NewHandler("self", testSecret, rec, nil, nil)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.RegisterOnShutdown(h.Close)
	srv.Start()
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		if resp, err := http.DefaultClient.Do(streamReq(t, srv.URL, "a", testSecret, time.Now(), pr)); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := pw.Write(appendEvent(nil, router.Event{Kind: router.Released, Backend: 1})); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "one event received", func() bool { n, _ := rec.state(); return n == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a peer stream open: %v", err)
	}
	if _, forgets := rec.state(); len(forgets) != 1 {
		t.Fatalf("forgets %v: the ended stream's peer must be forgotten", forgets)
	}
}

// BenchmarkRouteWithPeer: what streaming to a peer adds to a routing
// decision (scan, hash, decide, index; Route sends nothing to a backend),
// against the same decisions with no peer. 16 KB prompts over 64 backends,
// documents shared as in the router's own decision benchmark; the peer is a
// real Handler over loopback HTTP applying events to a second router.
func BenchmarkRouteWithPeer(b *testing.B) {
	newRouter := func(onEvent func(router.Event)) *router.Router {
		cfg := router.Defaults()
		cfg.ProbeInterval = -1
		for i := range 64 {
			cfg.Backends = append(cfg.Backends, router.BackendConfig{URL: fmt.Sprintf("http://127.0.0.1:%d", 30000+i)})
		}
		rt, err := router.New(cfg, router.Options{Source: router.NewStaticSource(router.StaticEndpoints(&cfg), nil),
			HashKey: prefix.KeyFromBytes([]byte("k")), OnEvent: onEvent})
		if err != nil {
			b.Fatal(err)
		}
		return rt
	}
	docs := make([]string, 256)
	for i := range docs {
		docs[i] = strings.Repeat(fmt.Sprintf("line %d of document %d, long enough to hash. ", i%7, i), 260)
	}
	bodies := make([][]byte, 512)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"model":"m","prompt":%q}`, docs[i%len(docs)]+fmt.Sprint(" question ", i))
	}
	run := func(b *testing.B, rt *router.Router) {
		ctx := context.Background()
		for _, body := range bodies { // warm the index
			if _, err := rt.Route(ctx, body, ""); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(int64(len(bodies[0])))
		b.ResetTimer()
		for i := range b.N {
			if _, err := rt.Route(ctx, bodies[i%len(bodies)], ""); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("no peer", func(b *testing.B) { run(b, newRouter(nil)) })
	b.Run("one peer", func(b *testing.B) {
		receiver := newRouter(nil)
		srv := httptest.NewServer(NewHandler("b", testSecret, receiver, nil, nil))
		defer srv.Close()
		l, err := NewLink("a", []string{srv.URL}, testSecret, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		rt := newRouter(l.Send)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { l.Run(ctx, rt.LoadEvents); close(done) }()
		defer func() { cancel(); <-done }()
		run(b, rt)
		b.StopTimer()
		if s := l.Stats()[0]; s.Dropped > 0 {
			b.Logf("%d of %d events dropped (the peer fell behind)", s.Dropped, s.Sent+s.Dropped)
		}
	})
}

// TestLinkReconnects: when a stream breaks (the peer restarted, say), the
// peer forgets this replica's load, and the link opens a new stream that
// starts with a load snapshot, so the peer's counts are right again.
func TestLinkReconnects(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(NewHandler("pb", testSecret, rec, nil, nil))
	defer srv.Close()
	l, err := NewLink("me", []string{srv.URL}, testSecret, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var snaps atomic.Int64
	snapshot := func() []router.Event {
		return []router.Event{{Kind: router.Load, Backend: 1, Inflight: int(snaps.Add(1))}}
	}
	go func() { l.Run(ctx, snapshot); close(done) }()
	defer func() { cancel(); <-done }()
	wait.For(t, "an event received", func() bool { n, _ := rec.state(); return n >= 1 })
	srv.CloseClientConnections()
	wait.For(t, "one full-state received", func() bool { _, f := rec.state(); return len(f) == 1 })
	before, _ := rec.state()
	wait.For(t, "a reconnect and a fresh event", func() bool { n, _ := rec.state(); return n > before && l.Stats()[0].Up })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.events["me"][before]; got.Kind != router.Load {
		t.Fatalf("the new stream began with %+v, not a load snapshot", got)
	}
}
