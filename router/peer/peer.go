package peer

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/router"
)

// Path is where a replica takes its peers' event streams.
const Path = "/peer/events"

// Request headers of a stream: who sends it, when, and the proof that it
// holds the fleet's secret.
const (
	headerName = "X-Warmfleet-Peer"
	headerTime = "X-Warmfleet-Peer-Time"
	headerAuth = "X-Warmfleet-Peer-Auth"
)

// Timing of streams.
const (
	// maxSkew is how far a stream's timestamp may be from the receiver's
	// clock: it bounds how long a captured request could be replayed.
	maxSkew = 2 * time.Minute
	// SnapshotInterval is how often a replica sends its load on every
	// backend; it is also the stream's heartbeat.
	SnapshotInterval = time.Second
	// idleTimeout ends a stream that has sent nothing for this long (a
	// sender that died without closing): its load is then forgotten.
	idleTimeout = 10 * SnapshotInterval
)

// Observer applies a peer's events (a *router.Router).
type Observer interface {
	Observe(peer string, e router.Event)
	ForgetPeer(peer string)
}

// Secret derives the key peers prove they hold from the fleet's secret
// material (the cluster key or the prompt-hash key file), so it is never
// the same bytes as either.
func Secret(material []byte) []byte {
	m := hmac.New(sha256.New, []byte("warmfleet router peer events"))
	m.Write(material)
	return m.Sum(nil)
}

func sign(secret []byte, name, unix string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(name + "\n" + unix))
	return hex.EncodeToString(m.Sum(nil))
}

// checkName accepts a replica name: 1..128 printable ASCII bytes.
func checkName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("peer name of %d bytes: want 1..128", len(name))
	}
	for i := range len(name) {
		if c := name[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("peer name %q: only printable ASCII without spaces", name)
		}
	}
	return nil
}

// Handler takes peers' event streams and applies them to obs. self is this
// replica's own name: a stream claiming it is refused (a replica listed as
// its own peer). A stream that ends, breaks, stalls or carries a bad frame
// makes obs forget that peer's load, unless a newer stream from the same
// peer has started since.
type Handler struct {
	self   string
	secret []byte
	obs    Observer
	log    *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	streams map[string]uint64 // the newest stream's number, by peer
	next    uint64
	open    map[uint64]*http.ResponseController // streams being read, to end them on Close
	closed  bool
}

// NewHandler returns a handler; now may be nil (time.Now).
func NewHandler(self string, secret []byte, obs Observer, log *slog.Logger, now func() time.Time) *Handler {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{self: self, secret: secret, obs: obs, log: log, now: now, streams: map[string]uint64{},
		open: map[uint64]*http.ResponseController{}}
}

// Close ends every stream being read and refuses new ones. A stream is a
// request that lasts as long as its sender runs, so a server's graceful
// shutdown would otherwise wait for it: register Close with
// http.Server.RegisterOnShutdown.
func (h *Handler) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, rc := range h.open {
		_ = rc.SetReadDeadline(time.Now())
	}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return
	}
	name, err := h.authenticate(r.Header)
	if err != nil {
		h.log.Warn("peer stream refused", "remote", r.RemoteAddr, "err", err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rc := http.NewResponseController(w)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	h.next++
	stream := h.next
	h.streams[name] = stream
	h.open[stream] = rc
	h.mu.Unlock()
	h.log.Info("peer stream open", "peer", name, "remote", r.RemoteAddr)
	br := bufio.NewReaderSize(r.Body, 64<<10)
	n := 0
	for {
		if !h.extend(rc) {
			err = errors.New("shutting down")
			break
		}
		var e router.Event
		if e, err = readEvent(br); err != nil {
			break
		}
		h.obs.Observe(name, e)
		n++
	}
	h.mu.Lock()
	delete(h.open, stream)
	latest := h.streams[name] == stream
	if latest {
		delete(h.streams, name)
	}
	h.mu.Unlock()
	if latest {
		h.obs.ForgetPeer(name)
	}
	if errors.Is(err, io.EOF) {
		h.log.Info("peer stream closed", "peer", name, "events", n)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	h.log.Warn("peer stream ended", "peer", name, "events", n, "err", err)
	if errors.Is(err, errFrame) {
		http.Error(w, err.Error(), http.StatusBadRequest)
	}
}

// extend moves a stream's read deadline idleTimeout on, unless Close has
// run: then it leaves the deadline Close set and reports false.
func (h *Handler) extend(rc *http.ResponseController) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	_ = rc.SetReadDeadline(h.now().Add(idleTimeout))
	return true
}

// authenticate returns the peer's name if the headers prove it holds the
// secret, with a timestamp within maxSkew.
func (h *Handler) authenticate(hdr http.Header) (string, error) {
	name, unix, mac := hdr.Get(headerName), hdr.Get(headerTime), hdr.Get(headerAuth)
	if err := checkName(name); err != nil {
		return "", err
	}
	if name == h.self {
		return "", fmt.Errorf("peer %q is this replica's own name", name)
	}
	sec, err := strconv.ParseInt(unix, 10, 64)
	if err != nil {
		return "", fmt.Errorf("peer %q: bad %s %q", name, headerTime, unix)
	}
	if skew := h.now().Sub(time.Unix(sec, 0)); skew > maxSkew || skew < -maxSkew {
		return "", fmt.Errorf("peer %q: timestamp %s off by %s (at most %s)", name, unix, skew.Round(time.Second), maxSkew)
	}
	if !hmac.Equal([]byte(mac), []byte(sign(h.secret, name, unix))) {
		return "", fmt.Errorf("peer %q: wrong %s (another fleet's key?)", name, headerAuth)
	}
	return name, nil
}

// Link streams this replica's events to its peers. Send never blocks: when
// a peer's queue is full (the peer or the network is slow) events are
// dropped and counted; the next load snapshot corrects the peer's counts,
// and a placement missed only costs a cache hit.
type Link struct {
	self   string
	secret []byte
	client *http.Client
	log    *slog.Logger
	now    func() time.Time

	peers atomic.Pointer[[]*link] // what Send sends to, replaced whole

	sentDesc, droppedDesc, upDesc *prometheus.Desc

	mu       sync.Mutex // guards the rest, and replacing peers
	byURL    map[string]*link
	running  context.Context // nil until Run
	snapshot func() []router.Event
	wg       sync.WaitGroup
}

type link struct {
	url     string
	queue   chan router.Event
	cancel  context.CancelFunc // stops its stream (nil until started)
	mu      sync.Mutex
	sent    uint64
	dropped uint64
	up      bool
}

// queueLen is how many events may wait for one peer: a few seconds of
// traffic at thousands of requests per second.
const queueLen = 1 << 14

// NewLink returns a link from replica self to the peers' base URLs
// (http://host:port; Path is appended). now may be nil (time.Now).
func NewLink(self string, peers []string, secret []byte, log *slog.Logger, now func() time.Time) (*Link, error) {
	if err := checkName(self); err != nil {
		return nil, err
	}
	if len(secret) == 0 {
		return nil, errors.New("peer: no secret")
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	peerLabel := []string{"peer"}
	l := &Link{self: self, secret: secret, log: log, now: now, byURL: map[string]*link{},
		client: &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 1}},
		sentDesc: prometheus.NewDesc("warmfleet_router_peer_events_sent_total",
			"Events streamed to a peer replica.", peerLabel, nil),
		droppedDesc: prometheus.NewDesc("warmfleet_router_peer_events_dropped_total",
			"Events not sent to a peer replica because its queue was full (the peer or the network is slow).", peerLabel, nil),
		upDesc: prometheus.NewDesc("warmfleet_router_peer_up",
			"1 while the stream to a peer replica is open.", peerLabel, nil)}
	l.SetPeers(peers)
	return l, nil
}

// SetPeers makes urls the peers (base URLs, duplicates ignored): streams
// to new ones start (once Run has), streams to ones no longer listed end,
// and the others go on untouched.
func (l *Link) SetPeers(urls []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := map[string]*link{}
	list := []*link{}
	for _, u := range urls {
		if _, dup := next[u]; dup {
			continue
		}
		p := l.byURL[u]
		if p == nil {
			p = &link{url: u, queue: make(chan router.Event, queueLen)}
			l.startLocked(p)
		}
		next[u] = p
		list = append(list, p)
	}
	for u, p := range l.byURL {
		if next[u] == nil && p.cancel != nil {
			p.cancel()
		}
	}
	l.byURL = next
	l.peers.Store(&list)
}

// startLocked starts p's stream if Run has started.
func (l *Link) startLocked(p *link) {
	if l.running == nil || l.running.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(l.running)
	p.cancel = cancel
	l.wg.Go(func() { l.keep(ctx, p, l.snapshot) })
}

// Send queues e for every peer.
func (l *Link) Send(e router.Event) {
	for _, p := range *l.peers.Load() {
		select {
		case p.queue <- e:
		default:
			p.mu.Lock()
			p.dropped++
			p.mu.Unlock()
		}
	}
}

// Stats is one peer link's counters.
type Stats struct {
	URL           string
	Up            bool
	Sent, Dropped uint64
}

// Stats returns every peer's counters.
func (l *Link) Stats() []Stats {
	peers := *l.peers.Load()
	out := make([]Stats, 0, len(peers))
	for _, p := range peers {
		p.mu.Lock()
		out = append(out, Stats{URL: p.url, Up: p.up, Sent: p.sent, Dropped: p.dropped})
		p.mu.Unlock()
	}
	return out
}

// Describe and Collect make the link a prometheus.Collector of every
// peer's Stats, read when scraped: nothing is counted twice on the path of
// a request.
func (l *Link) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.sentDesc
	ch <- l.droppedDesc
	ch <- l.upDesc
}

func (l *Link) Collect(ch chan<- prometheus.Metric) {
	for _, s := range l.Stats() {
		up := 0.0
		if s.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(l.sentDesc, prometheus.CounterValue, float64(s.Sent), s.URL)
		ch <- prometheus.MustNewConstMetric(l.droppedDesc, prometheus.CounterValue, float64(s.Dropped), s.URL)
		ch <- prometheus.MustNewConstMetric(l.upDesc, prometheus.GaugeValue, up, s.URL)
	}
}

// Run keeps a stream open to every peer until ctx ends, reconnecting with
// backoff, and sends snapshot() (this replica's load on every backend) to
// each peer when its stream opens and every SnapshotInterval.
func (l *Link) Run(ctx context.Context, snapshot func() []router.Event) {
	l.mu.Lock()
	l.running, l.snapshot = ctx, snapshot
	for _, p := range l.byURL {
		l.startLocked(p)
	}
	l.mu.Unlock()
	tick := time.NewTicker(SnapshotInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.mu.Lock() // no stream starts after this
			l.mu.Unlock()
			l.wg.Wait()
			return
		case <-tick.C:
			for _, e := range snapshot() {
				l.Send(e)
			}
		}
	}
}

// keep reconnects p's stream until ctx ends.
func (l *Link) keep(ctx context.Context, p *link, snapshot func() []router.Event) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		start := l.now()
		err := l.stream(ctx, p, snapshot)
		if ctx.Err() != nil {
			return
		}
		if l.now().Sub(start) > time.Minute {
			backoff = 500 * time.Millisecond // it had been up: retry soon
		}
		l.log.Warn("peer stream down; reconnecting", "peer", p.url, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// stream sends p's queue over one request until it fails or ctx ends.
func (l *Link) stream(ctx context.Context, p *link, snapshot func() []router.Event) error {
	pr, pw := io.Pipe()
	defer pr.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+Path, pr)
	if err != nil {
		return err
	}
	unix := strconv.FormatInt(l.now().Unix(), 10)
	req.Header.Set(headerName, l.self)
	req.Header.Set(headerTime, unix)
	req.Header.Set(headerAuth, sign(l.secret, l.self, unix))
	req.Header.Set("Content-Type", "application/octet-stream")
	done := make(chan error, 1)
	// The request's goroutine ends before stream returns: cancelling the
	// request ends it, and Run (which waits for every stream) then leaves
	// nothing running.
	finished := make(chan struct{})
	defer func() {
		cancel()
		<-finished
	}()
	go func() {
		defer close(finished)
		resp, err := l.client.Do(req)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			err = fmt.Errorf("peer answered %s: %s", resp.Status, msg)
		}
		_ = pr.CloseWithError(err)
		done <- err
	}()
	defer func() {
		p.mu.Lock()
		p.up = false
		p.mu.Unlock()
	}()
	bw := bufio.NewWriterSize(pw, 64<<10)
	var buf []byte
	write := func(e router.Event) error {
		buf = appendEvent(buf[:0], e)
		_, err := bw.Write(buf)
		return err
	}
	// The peer forgot this replica's load when the last stream ended.
	for _, e := range snapshot() {
		if err := write(e); err != nil {
			return err
		}
	}
	for {
		if err := bw.Flush(); err != nil {
			return err
		}
		p.mu.Lock()
		p.up = true
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			_ = pw.Close()
			return ctx.Err()
		case err := <-done:
			return err
		case e := <-p.queue:
			n := 0
			for {
				if err := write(e); err != nil {
					return err
				}
				n++
				select {
				case e = <-p.queue:
					continue
				default:
				}
				break
			}
			p.mu.Lock()
			p.sent += uint64(n)
			p.mu.Unlock()
		}
	}
}
