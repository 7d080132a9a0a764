// Package router is warmfleet's OpenAI-compatible reverse proxy. It sends
// requests that share a prompt prefix to the backend expected to hold that
// prefix in its KV cache, keeps every backend under a load bound, prefers
// warm nodes, ramps new endpoints up gradually, ejects failing backends and
// retries requests that could not be sent or that a backend left without a
// first byte past Config.FirstByteTimeout. An answer that breaks after it
// began is never passed off as complete: the client's connection is broken
// (after an error event, for a stream).
//
// The decision itself lives in router/balance (pure) and the prompt hashing
// and cache index in router/prefix; this package is the IO around them.
package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/kvevents"
	"github.com/warmfleet/warmfleet/router/oai"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// Options are the router's collaborators.
type Options struct {
	Source   EndpointSource        // required
	Registry prometheus.Registerer // nil: metrics are kept but not exported
	Logger   *slog.Logger          // nil: discard
	Now      func() time.Time      // nil: time.Now
	Rand     func() uint64         // nil: math/rand/v2
	// HashKey keys the block hashes; replicas of one fleet must share it.
	HashKey prefix.Key
	// Transport carries requests to backends; nil builds one from Config.
	Transport http.RoundTripper
	// Version is the build's version, for warmfleet_router_build_info
	// ("" reads as dev).
	Version string
	// OnEvent, if set, is told what happens to every request this router
	// sends (see Event), so peer replicas can Observe it. It runs on the
	// request's goroutine, outside the router's lock: hand the event off,
	// do not block. The event is the callee's to keep.
	OnEvent func(Event)
}

// Router is an http.Handler for the OpenAI API surface.
type Router struct {
	opts    Options
	log     *slog.Logger
	now     func() time.Time
	rand    func() uint64
	metrics *metrics
	client  *http.Client
	probe   *http.Client
	bufs    sync.Pool // *[]byte copy buffers for streaming
	keyBufs sync.Pool // *[]uint64 block hash buffers, one per request in flight
	scans   sync.Pool // *oai.Scanner, so decoding prompts allocates nothing
	// watchdogs: *watchdog, each with its timer, one per attempt in flight
	watchdogs sync.Pool

	slowBodies slowBodies

	kv *kvFeeds // KV event subscribers and their exact index (kv.go)

	mu       sync.Mutex
	cfg      Config
	backends map[string]*backend // by URL
	order    []*backend          // stable order for decisions
	named    map[string]bool     // models the config or an endpoint names (metric labels)
	slots    [prefix.MaxSlots]bool
	index    *prefix.Index
	freed    chan struct{} // closed and replaced when a slot frees up
	queued   int
	// shareDecay is the per-decision decay of backend.recent (0: not yet
	// derived from the config).
	shareDecay float64
	// scratch space for decisions, used under mu
	depth   []int
	cands   []balance.Candidate
	members []*backend
	ests    []balance.Estimate
	// the same for kvScoreLocked and kvApplyLocked
	kvURLs []string
	kvPub  []*backend
	kvN    []int
	kvOK   []bool
	// tune is the self-tuning strategy's fleet-wide state (tune.go).
	tune tuneFleet
	// slotClocks price a sequence slot for prefix-aware (slotclock.go):
	// [1] for engine block keys (kv-events), [0] for the router's own.
	slotClocks [2]slotClock
}

type backend struct {
	// The fields every decision reads for every backend (pickLocked,
	// countLocked) come first and together, ep's included, so that a
	// decision costs a few cache lines per backend rather than one per
	// field: with the prompt's work in between, each is a miss, and when
	// other work has left the caches cold they are most of a decision's
	// time.
	id   uint64
	slot int
	// limit is its concurrency limit and slots its engine's sequence
	// slots (0: none, unknown), in 32 bits so that the decision's fields
	// stay in four cache lines.
	limit, slots int32
	inflight     int
	pending      int // prompt blocks sent but not yet answered with a first byte
	prefilling   int // requests sent but not yet answered with a first byte
	// recent is the traffic routed here, decayed per decision (half-life
	// ShareHalfLife decisions), for the traffic-share bound.
	recent float64
	// peers is what peer replicas have sent here and told us of (Observe),
	// in sum and by peer, so a peer that goes away can be forgotten.
	peers        peerLoad
	ejectedUntil time.Time
	// kvTrusted: its event view was trusted at the last token-id
	// decision it took part in.
	kvTrusted bool
	ep        Endpoint // its fields up to ReadySince are read per decision

	url string
	// starts are the send times of its requests in flight (this
	// router's), oldest first, for the wait for a sequence slot
	// (slotclock.go).
	starts []int64
	kvSize int // index capacity in blocks
	// learnedKV is the KV cache size in tokens read from the backend's metrics.
	learnedKV int
	// eventsKV is the same learned from its KV events (kv.go): its engine's
	// peak block count once it evicted; it wins over learnedKV.
	eventsKV int
	// kvExact and kvApprox count token-id prompts scored for it by its
	// event view or by the approximate index (looked up once; kv.go).
	kvExact, kvApprox prometheus.Counter

	failures     int
	serverErrors int // consecutive 5xx answers
	// passive: the last ejection came from requests the backend failed,
	// not from its health probe, so a passing probe does not undo it.
	passive bool
	gauge   prometheus.Gauge // its in-flight series, looked up once

	peerLoads map[string]*peerLoad

	stats backendStats
	// tune is what self-tuning learned of it (tune.go), apart: it is most
	// of a backend's memory, and kept inline it made backends 1 KiB apart,
	// so that their decision fields (above) fell in the same few sets of
	// the L1 cache and evicted each other within a decision.
	tune *tuneState
}

// NewTransport is the transport a router sends on unless Options gives
// one: pooled keep-alive connections to every backend, bytes passed through
// as they are (no transparent gzip), and a connect failure marked as one
// (nothing was sent, so the request may go elsewhere).
func NewTransport(connectTimeout time.Duration) *http.Transport {
	dialer := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err}
			}
			return c, nil
		},
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		// A body that fits the write buffer is copied into it; a larger
		// one is handed to the connection, and net's generic copy then
		// allocates a fresh buffer per request (12-32 KiB of garbage for
		// a typical prompt, the router's largest allocation at high
		// rates).
		WriteBufferSize:    64 << 10,
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
	}
}

// dialError marks a failure to connect: nothing was sent, so the request may
// be retried elsewhere and the backend is ejected.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// New builds a router. Call Run to follow the endpoint source and probe
// backends; ServeHTTP works as soon as New returns.
func New(cfg Config, opts Options) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Source == nil {
		return nil, errors.New("router: no endpoint source")
	}
	rt := &Router{opts: opts, cfg: cfg, backends: map[string]*backend{}, index: prefix.NewIndex(), freed: make(chan struct{}),
		depth: make([]int, prefix.MaxSlots)}
	rt.index.SetHeat(heatHalfLife(&cfg))
	rt.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	rt.log = opts.Logger
	if rt.log == nil {
		rt.log = slog.New(slog.DiscardHandler)
	}
	rt.now = opts.Now
	if rt.now == nil {
		rt.now = time.Now
	}
	rt.rand = opts.Rand
	if rt.rand == nil {
		rt.rand = rand.Uint64
	}
	m, err := newMetrics(opts.Registry, opts.Version)
	if err != nil {
		return nil, err
	}
	rt.metrics = m
	rt.tune.pooled = newTTFTModel()
	if err := newTuneMetrics(opts.Registry, rt); err != nil {
		return nil, err
	}
	km, err := newKVMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	rt.kv = newKVFeeds(&cfg, km)
	km.feeds, km.index = rt.kv.subscribers, func() *kvevents.Index { return rt.kv.index }
	tr := opts.Transport
	if tr == nil {
		tr = NewTransport(cfg.ConnectTimeout)
	}
	rt.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	rt.probe = &http.Client{Transport: tr, Timeout: cfg.ProbeTimeout}
	eps, _ := opts.Source.Endpoints()
	rt.mu.Lock()
	rt.syncLocked(eps)
	rt.mu.Unlock()
	return rt, nil
}

// Run follows the endpoint source and probes backends until ctx ends.
func (rt *Router) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { rt.follow(ctx) })
	wg.Go(func() { rt.probeLoop(ctx) })
	wg.Go(func() { rt.kv.run(ctx) })
	wg.Go(func() { rt.engineLoop(ctx) })
	wg.Wait()
	return nil
}

func (rt *Router) follow(ctx context.Context) {
	for {
		eps, changed := rt.opts.Source.Endpoints()
		rt.mu.Lock()
		rt.syncLocked(eps)
		rt.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// Queued is how many requests wait for a backend to free up.
func (rt *Router) Queued() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.queued
}

// InFlight is how many requests hold one of the current backends: chosen
// and not yet released, whether still being sent or answered.
func (rt *Router) InFlight() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	n := 0
	for _, b := range rt.order {
		n += b.inflight
	}
	return n
}

// Config returns the current configuration.
func (rt *Router) Config() Config {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.cfg
}

// Apply swaps in a new configuration (strategies, bounds, timeouts) without
// dropping connections. Backends come from the EndpointSource, not from cfg.
func (rt *Router) Apply(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.cfg = cfg
	rt.learnModelsLocked()
	rt.shareDecay = 0
	rt.index.SetHeat(heatHalfLife(&cfg))
	for _, b := range rt.order {
		rt.configureLocked(b)
	}
	rt.wakeLocked()
	return nil
}

// SetStrategy switches the strategy for model ("" for the default) at run time.
func (rt *Router) SetStrategy(model string, s balance.Strategy) error {
	if _, err := balance.ParseStrategy(string(s)); err != nil {
		return err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	cfg := rt.cfg
	if model == "" {
		cfg.Strategy = s
	} else {
		models := make(map[string]ModelConfig, len(cfg.Models)+1)
		for k, v := range cfg.Models {
			models[k] = v
		}
		models[model] = ModelConfig{Strategy: s}
		cfg.Models = models
	}
	rt.cfg = cfg
	rt.learnModelsLocked()
	return nil
}

// slotsLocked sets b's sequence slots: its own max_num_seqs, else the
// config's, else what its engine's metrics showed (tune.go).
func (rt *Router) slotsLocked(b *backend) {
	b.slots = clamp32(cmp.Or(b.ep.MaxNumSeqs, rt.cfg.MaxNumSeqs, b.tune.engine.slots))
}

// clamp32 is n within 0..MaxInt32.
func clamp32(n int) int32 { return int32(min(max(n, 0), math.MaxInt32)) }

func (rt *Router) configureLocked(b *backend) {
	b.limit = clamp32(cmp.Or(b.ep.MaxInflight, rt.cfg.MaxInflight))
	rt.slotsLocked(b)
	tokens := b.ep.KVCacheTokens
	if tokens == 0 {
		tokens = cmp.Or(b.eventsKV, b.learnedKV)
	}
	if tokens == 0 {
		tokens = rt.cfg.KVCacheTokens
	}
	b.kvSize = max(1, int(float64(tokens)*rt.cfg.CharsPerToken/float64(rt.cfg.BlockChars)))
	rt.index.SetSlot(b.slot, b.kvSize)
}

// syncLocked makes the backend set match eps.
func (rt *Router) syncLocked(eps []Endpoint) {
	seen := map[string]bool{}
	for _, ep := range eps {
		u, err := ParseBackendURL(ep.URL)
		if err != nil {
			rt.log.Warn("ignoring endpoint with a bad URL", "url", ep.URL, "err", err)
			continue
		}
		ep.URL = u
		seen[u] = true
		b, ok := rt.backends[u]
		if !ok {
			slot := slices.Index(rt.slots[:], false)
			if slot < 0 {
				rt.log.Warn("too many backends; ignoring endpoint", "url", u, "max", prefix.MaxSlots)
				continue
			}
			rt.slots[slot] = true
			b = &backend{url: u, slot: slot, gauge: rt.metrics.inflight.WithLabelValues(u), tune: new(newTuneState())}
			rt.backends[u] = b
			rt.order = append(rt.order, b)
			rt.metrics.healthy.WithLabelValues(u).Set(1)
		}
		b.ep = ep
		b.id = prefix.BackendID(cmp.Or(ep.ID, u))
		rt.configureLocked(b)
	}
	for u, b := range rt.backends {
		if seen[u] {
			continue
		}
		delete(rt.backends, u)
		rt.order = slices.DeleteFunc(rt.order, func(x *backend) bool { return x == b })
		rt.index.RemoveSlot(b.slot)
		rt.slots[b.slot] = false
		rt.metrics.inflight.DeleteLabelValues(u)
		rt.metrics.healthy.DeleteLabelValues(u)
	}
	rt.learnModelsLocked()
	rt.syncKVLocked()
	rt.wakeLocked()
}

// learnModelsLocked collects the models the configuration and the
// endpoints name: the metrics label only those (see metrics).
func (rt *Router) learnModelsLocked() {
	rt.named = map[string]bool{}
	for m := range rt.cfg.Models {
		rt.named[m] = true
	}
	for _, b := range rt.order {
		for _, m := range b.ep.Models {
			rt.named[m] = true
		}
	}
}

// modelLabelLocked is model's metric label.
func (rt *Router) modelLabelLocked(model string) string {
	if rt.named[model] {
		return model
	}
	return otherModel
}

func (rt *Router) wakeLocked() {
	if rt.queued == 0 {
		return // nobody waits: spare the allocation on every release
	}
	close(rt.freed)
	rt.freed = make(chan struct{})
}

// scanKeys reads the model from an inference body and hashes its prompt
// into a pooled buffer; the caller returns that with putKeys once the
// request is done (the index keeps copies, not the slice). sess is the
// request's session for the session strategy (see sessionID). The error is
// oai.Scan's; a body without a model gives "" and no keys.
//
// exact is true when the keys are the engine's own block hashes (a
// token-id prompt, and some backend publishes KV events; kv.go).
func (rt *Router) scanKeys(cfg *Config, body []byte, session string) (model string, keys *[]uint64, stream, exact bool, sess uint64, err error) {
	sc := rt.scanner()
	defer rt.scans.Put(sc) // nothing of the request outlives this call
	req, err := sc.Scan(body)
	if err != nil || req.Model == "" {
		return "", nil, false, false, 0, err
	}
	kp, _ := rt.keyBufs.Get().(*[]uint64)
	if kp == nil {
		kp = new([]uint64)
	}
	if rt.kv.active.Load() > 0 && len(req.Tokens) > 0 && !req.HasMessages && req.CacheSalt == "" {
		*kp, exact = rt.engineKeys((*kp)[:0], cfg, req.Model, req.Tokens), true
	}
	if !exact {
		*kp, _ = rt.hasher(cfg).Blocks((*kp)[:0], req.Model, &req, session)
	}
	return req.Model, kp, req.Stream, exact, rt.sessionID(session, req.User), nil
}

// scanModel reads the model named in a body, "" if there is none.
func (rt *Router) scanModel(body []byte) (string, error) {
	sc := rt.scanner()
	defer rt.scans.Put(sc)
	req, err := sc.Scan(body)
	return req.Model, err
}

// scanner is a pooled oai.Scanner; return it to rt.scans.
func (rt *Router) scanner() *oai.Scanner {
	if sc, ok := rt.scans.Get().(*oai.Scanner); ok {
		return sc
	}
	return new(oai.Scanner)
}

func (rt *Router) putKeys(kp *[]uint64) {
	if cap(*kp) <= 4096 { // do not pin the buffers of rare huge prompts
		rt.keyBufs.Put(kp)
	}
}

func (rt *Router) hasher(cfg *Config) prefix.Hasher {
	return prefix.Hasher{Key: rt.opts.HashKey, BlockChars: cfg.BlockChars, MaxBlocks: cfg.MaxBlocks}
}

func serves(ep *Endpoint, model string) bool {
	return len(ep.Models) == 0 || slices.Contains(ep.Models, model)
}

// rampWeight is a new endpoint's share relative to a settled one.
func rampWeight(ep *Endpoint, now time.Time, ramp time.Duration) float64 {
	if ramp <= 0 || ep.ReadySince.IsZero() {
		return 1
	}
	f := float64(now.Sub(ep.ReadySince)) / float64(ramp)
	return min(1, max(0.05, f))
}

func (rt *Router) ejectLocked(b *backend, why string) {
	b.failures++
	backoff := rt.cfg.EjectBase << min(b.failures-1, 20)
	backoff = min(backoff, rt.cfg.EjectMax)
	b.ejectedUntil = rt.now().Add(backoff)
	rt.metrics.ejections.WithLabelValues(b.url).Inc()
	rt.metrics.healthy.WithLabelValues(b.url).Set(0)
	rt.log.Warn("backend ejected", "backend", b.url, "reason", why, "backoff", backoff, "failures", b.failures)
}

func (rt *Router) healthyLocked(b *backend) {
	if b.failures > 0 || !b.ejectedUntil.IsZero() {
		rt.log.Info("backend healthy again", "backend", b.url)
	}
	b.failures = 0
	b.ejectedUntil = time.Time{}
	b.passive = false
	rt.metrics.healthy.WithLabelValues(b.url).Set(1)
}

// prefilled removes the request's blocks from its backend's pending
// prefill, at the backend's first response byte.
func (rt *Router) prefilled(r *routed) {
	rt.mu.Lock()
	changed := rt.prefilledLocked(r)
	if changed {
		d := rt.now().Sub(r.sent)
		r.b.stats.firstByte(d)
		rt.learnLocked(r, d)
		if r.clockPrefill {
			r.clock.prefill(d, r.pending.blocks)
		}
		if r.clockContention {
			r.clock.contention.observe(r.pending.blocks, int(r.ahead), int(r.others), d)
		}
	}
	rt.mu.Unlock()
	if changed {
		rt.emit(Event{Kind: Prefilled, Backend: r.id, Blocks: r.pending.blocks})
	}
}

// prefilledLocked reports whether it removed the blocks (only the first
// call for a request does).
func (rt *Router) prefilledLocked(r *routed) bool {
	if r.pending.done {
		return false
	}
	r.pending.done = true
	r.b.pending -= r.pending.blocks
	r.b.prefilling--
	return true
}

// ended records a whole answer's time in its slot clock (see routed).
func (rt *Router) ended(r *routed) {
	if !r.clockSeq {
		return
	}
	rt.mu.Lock()
	r.clock.sequence(rt.now().Sub(r.sent))
	rt.mu.Unlock()
}

func (rt *Router) release(r *routed) {
	rt.mu.Lock()
	b := r.b
	prefilled := rt.prefilledLocked(r)
	b.inflight--
	b.endedLocked(r.sent)
	b.gauge.Set(float64(b.inflight))
	rt.wakeLocked()
	rt.mu.Unlock()
	if prefilled {
		rt.emit(Event{Kind: Prefilled, Backend: r.id, Blocks: r.pending.blocks})
	}
	rt.emit(Event{Kind: Released, Backend: r.id})
}

// heatHalfLife is how the index counts prefix heat under cfg: over the
// traffic-share window, and only when hot_share uses it.
func heatHalfLife(cfg *Config) int {
	if cfg.HotShare <= 0 {
		return 0
	}
	return cfg.ShareHalfLife
}

// routeRequest is what a decision needs to know about one request.
type routeRequest struct {
	model    string
	keys     []uint64 // chained block hashes; nil for pass-through paths
	exact    bool     // keys are the engine's block hashes (kv.go)
	strategy balance.Strategy
	session  uint64 // the session strategy's key (0: none)
	stream   bool   // the answer streams: its first byte comes after prefill
	label    string // the model's metric label, once a backend was picked
	tried    []*backend
	hashTime time.Duration // spent hashing the prompt, part of the decision time
}

// routed is an acquired backend: the caller must release it.
type routed struct {
	b        *backend
	id       uint64 // b's id when it was picked (b.id is rewritten under the lock when endpoints sync)
	sent     time.Time
	decision balance.Decision
	blocks   int
	common   int
	eligible int
	bound    int
	inflight int            // the backend's in-flight count including this request
	pending  pendingPrefill // its one copy is the one released: no allocation per request
	// prefMatched is what the preferred backend (ignoring load) holds.
	prefMatched int
	model       string // the request's model label (metrics)
	warm        bool   // b's node held the weights when it was picked
	// feat is what self-tuning learns the time to first byte against,
	// while learn says it is still to be learned (tune.go).
	feat  [balance.NumFeatures]float64
	learn bool
	// clock is the slot clock its keys' kind teaches; clockPrefill and
	// clockSeq say what it is still to learn from this request (it
	// started at once: slotclock.go).
	clock                  *slotClock
	clockPrefill, clockSeq bool
	// clockContention: its first byte teaches the clock's contention
	// fit, with the prefill ahead of it and the requests in flight
	// beside it when it was sent (a sequence slot was free, and it was
	// expected to hold none of its blocks there).
	clockContention bool
	ahead, others   int32
}

// pendingPrefill is a request's share of its backend's pending prefill,
// removed once: at the first response byte or at the end.
type pendingPrefill struct {
	blocks int
	done   bool
}

// noBackendError says why no backend can take a request for a model: the
// counts are of the backends that serve it.
type noBackendError struct {
	model                             string
	serving, notReady, ejected, tried int
}

func (e *noBackendError) Is(target error) bool { return target == errNoBackend }

// Error tells a client which of the causes holds: no endpoint serves the
// model, none of them is ready (their nodes are still caching it), or the
// ready ones were ejected after failures or already failed this request.
func (e *noBackendError) Error() string {
	model := "model " + strconv.Quote(e.model)
	if e.model == "" {
		model = "this request (it names no model)"
	}
	switch {
	case e.serving == 0:
		return "no endpoint serves " + model + ": none is registered for it (check the model name)"
	case e.notReady == e.serving:
		return fmt.Sprintf("no endpoint for %s is ready: %d known, all still loading the model", model, e.serving)
	case e.tried == 0:
		return fmt.Sprintf("every ready endpoint for %s is ejected after failures: %d known, %d ejected, %d not ready", model, e.serving, e.ejected, e.notReady)
	}
	return fmt.Sprintf("every ready endpoint for %s failed this request: %d known, %d tried, %d ejected, %d not ready", model, e.serving, e.tried, e.ejected, e.notReady)
}

var (
	errNoBackend = errors.New("no healthy backend serves this model")
	errFull      = errors.New("every eligible backend is at its concurrency limit")
)

// pick runs one decision under the lock and reserves the chosen backend.
func (rt *Router) pickLocked(req *routeRequest) (routed, error) {
	now := rt.now()
	cands, members, depth := rt.cands[:0], rt.members[:0], rt.depth
	defer func() { rt.cands, rt.members = cands[:0], members[:0] }()
	var none noBackendError
	for _, b := range rt.order {
		if !serves(&b.ep, req.model) {
			continue
		}
		none.serving++
		switch {
		case !b.ep.Ready:
			none.notReady++
		case slices.Contains(req.tried, b):
			none.tried++
		case now.Before(b.ejectedUntil):
			none.ejected++
		default:
			members = append(members, b)
		}
	}
	if len(members) == 0 {
		none.model = req.model
		return routed{}, new(none) // allocated here only: none is counted on every decision
	}
	common := 0
	if len(req.keys) > 0 {
		clear(depth)
		if !req.exact || !rt.kvScoreLocked(members, req.keys) {
			rt.index.Match(req.keys, depth)
		}
		if req.exact {
			rt.kvApplyLocked(depth)
		}
		// The prefix every eligible backend holds says nothing about where
		// to go (a system prompt all have seen). A backend that holds
		// nothing yet (new, restarted, cleared) does not count: it comes to
		// hold that prefix with its first request, and until then the
		// prefix would make every other backend look like the place for
		// every request.
		// A backend that holds something but not the prompt's first block
		// makes the common prefix 0, which nothing after it changes: the
		// loop stops there rather than look up what each of the rest holds.
		common = len(req.keys)
		held := false
		for _, b := range members {
			if depth[b.slot] > 0 {
				common, held = min(common, depth[b.slot]), true
			} else if rt.heldLocked(b, req.exact) > 0 {
				common, held = 0, true
				break
			}
		}
		if !held {
			common = 0
		}
		// A prefix much of the traffic carries is common too, before
		// every backend has come to hold it: otherwise the first backend
		// to see a chat app's system prompt would look like the best
		// place for every request.
		common = max(common, rt.index.Hot(req.keys, len(members), rt.cfg.HotShare))
	}
	clock := rt.slotClockLocked(req.exact)
	cands = slices.Grow(cands, len(members))[:len(members)]
	for i, b := range members {
		c := &cands[i] // filled in place: a Candidate is too big to copy per backend
		*c = balance.Candidate{ID: b.id, Inflight: b.inflight + b.peers.inflight, Limit: int(b.limit),
			Pending: b.pending + b.peers.pending, Prefilling: b.prefilling + b.peers.prefilling,
			Weight: rampWeight(&b.ep, now, rt.cfg.RampUp), Warm: b.ep.HoldsWeights, Recent: b.recent, Speed: b.ep.Speed, Slots: b.slots}
		if req.strategy == balance.CacheAware {
			c.Held = int(rt.heldLocked(b, req.exact))
		}
		if len(req.keys) > 0 {
			c.Matched = depth[b.slot]
		}
		if c.Slots > 0 && c.Inflight >= int(c.Slots) {
			c.SlotWait = clock.wait(b, now)
		}
	}
	var rnd uint64
	switch req.strategy {
	case balance.PrefixAware, balance.KVAware, balance.SelfTuning: // none draws randomness
	default:
		rnd = rt.rand()
	}
	in := balance.Input{
		Strategy: req.strategy, LoadFactor: rt.cfg.LoadFactor, MinBound: rt.cfg.MinLoadBound, Candidates: cands, Keys: req.keys,
		Common: common, RendezvousBlocks: rt.cfg.RendezvousBlocks, Slack: rt.cfg.Slack, Rand: rnd, Retry: len(req.tried) > 0,
		ShareFactor: rt.cfg.ShareFactor, DecodeWeight: rt.cfg.DecodeWeight, BalanceSlack: rt.cfg.BalanceSlack,
		Session: req.session, CacheThreshold: rt.cfg.CacheThreshold, BalanceAbs: rt.cfg.BalanceAbsThreshold, BalanceRel: rt.cfg.BalanceRelThreshold,
	}
	in.Overlap, in.Slowdown = clock.contention.shares()
	if req.strategy == balance.SelfTuning {
		rt.estimatesLocked(&in, members, req.exact, now)
	}
	d := balance.Decide(in)
	if d.Pick < 0 {
		return routed{}, errFull
	}
	b := members[d.Pick]
	if req.strategy == balance.SelfTuning {
		rt.logDecisionLocked(&in, &d, members)
	}
	var feat [balance.NumFeatures]float64
	learn := false
	if rt.cfg.learning() {
		rt.countArrivalLocked(now)
		if learn = req.stream; learn {
			feat = rt.featuresLocked(b, &cands[d.Pick], max(len(req.keys)-d.Matched, 0), d.Matched, req.exact, now)
		}
	}
	rt.countLocked(b)
	// A request that starts at once teaches the slot clock; only a
	// streamed one's first byte marks the end of its prefill.
	slotFree := b.slots <= 0 || cands[d.Pick].Inflight < int(b.slots)
	atOnce := b.slots > 0 && slotFree && cands[d.Pick].Prefilling == 0
	b.inflight++
	b.startedLocked(now)
	uncached := max(len(req.keys)-d.Matched, 0)
	b.pending += uncached
	b.prefilling++
	b.stats.routed(len(req.keys), d.Matched)
	b.gauge.Set(float64(b.inflight))
	if len(req.keys) > 0 && !(req.exact && b.kvTrusted) {
		// A backend scored by its trusted event view needs no guesses for
		// engine keys: they would be used only once the view is not
		// trusted, and a view stops being trusted by a reset, which
		// drops the guesses (kvApplied), or by a lost stream, after which
		// the router learns again from what it sends.
		rt.index.Insert(b.slot, req.keys, d.Matched)
	}
	return routed{b: b, id: b.id, sent: now, decision: d, blocks: len(req.keys), common: common, eligible: len(members), bound: d.Bound, inflight: b.inflight,
		pending: pendingPrefill{blocks: uncached}, prefMatched: cands[max(d.Preferred, 0)].Matched,
		model: rt.modelLabelLocked(req.model), warm: b.ep.HoldsWeights, feat: feat, learn: learn,
		clock: clock, clockPrefill: atOnce && req.stream && uncached > 0, clockSeq: atOnce,
		clockContention: slotFree && req.stream && uncached > 0 && d.Matched == 0,
		ahead:           clamp32(cands[d.Pick].Pending), others: clamp32(cands[d.Pick].Inflight)}, nil
}

// countLocked records one request for b in the decayed traffic counts.
func (rt *Router) countLocked(b *backend) {
	if rt.shareDecay == 0 {
		rt.shareDecay = math.Exp2(-1 / float64(max(rt.cfg.ShareHalfLife, 1)))
	}
	for _, o := range rt.order {
		o.recent *= rt.shareDecay
	}
	b.recent++
}

// acquire picks a backend, waiting up to QueueTimeout while every eligible
// backend is at its limit.
func (rt *Router) acquire(ctx context.Context, req *routeRequest) (routed, error) {
	var deadline <-chan time.Time
	var waitStart time.Time
	for {
		start := time.Now()
		rt.mu.Lock()
		r, err := rt.pickLocked(req)
		if err == nil || !errors.Is(err, errFull) {
			rt.mu.Unlock()
			rt.metrics.decisionTime.Observe((time.Since(start) + req.hashTime).Seconds())
			req.hashTime = 0
			if err == nil {
				req.label = r.model
				rt.metrics.decisions.WithLabelValues(string(req.strategy), string(r.decision.Reason), r.model).Inc()
				if r.decision.Yielded != "" {
					rt.metrics.overflows.WithLabelValues(string(req.strategy), string(r.decision.Yielded), r.model).Inc()
				}
				weights := "cold"
				if r.warm {
					weights = "warm"
				}
				rt.metrics.requests.WithLabelValues(r.model, weights).Inc()
				if r.blocks > 0 {
					rt.metrics.cachedFraction.WithLabelValues(r.model).Observe(float64(r.decision.Matched) / float64(r.blocks))
				}
				if !waitStart.IsZero() {
					rt.metrics.queueWait.Observe(time.Since(waitStart).Seconds())
				}
				rt.emit(Event{Kind: Placed, Backend: r.id, Blocks: r.pending.blocks, Keys: req.keys})
			}
			return r, err
		}
		if waitStart.IsZero() {
			if rt.queued >= rt.cfg.MaxQueue || rt.cfg.QueueTimeout == 0 {
				rt.mu.Unlock()
				return routed{}, errFull
			}
			waitStart = time.Now()
			timer := time.NewTimer(rt.cfg.QueueTimeout)
			defer timer.Stop()
			deadline = timer.C
		}
		rt.queued++
		freed := rt.freed
		rt.mu.Unlock()
		var done error
		select {
		case <-freed:
		case <-deadline:
			done = errFull
		case <-ctx.Done():
			done = ctx.Err()
		}
		rt.mu.Lock()
		rt.queued--
		rt.mu.Unlock()
		if done != nil {
			rt.metrics.queueWait.Observe(time.Since(waitStart).Seconds())
			return routed{}, done
		}
	}
}

// markAnswered records an answer's status for passive health checking: a
// run of Eject5xx consecutive 5xx answers ejects the backend (an engine
// that answers but fails every request); any other answer readmits it.
func (rt *Router) markAnswered(b *backend, status int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !serverError(status) {
		b.serverErrors = 0
		if b.failures > 0 {
			rt.healthyLocked(b)
		}
		return
	}
	b.serverErrors++
	if n := rt.cfg.Eject5xx; n > 0 && b.serverErrors >= n {
		b.serverErrors = 0
		b.passive = true
		rt.ejectLocked(b, fmt.Sprintf("%d consecutive 5xx answers", n))
	}
}

// markUnreachable ejects a backend that could not be connected to. Not
// passive: a probe that connects again is evidence enough.
func (rt *Router) markUnreachable(b *backend, de *dialError) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b.passive = false
	rt.ejectLocked(b, de.Error())
}

// markFailed counts a request that the backend failed (kind: first-byte
// timeout, idle timeout, broken answer) and ejects the backend: whatever
// its health probe says, it does not answer requests.
func (rt *Router) markFailed(b *backend, kind, why string) {
	rt.metrics.failures.WithLabelValues(b.url, kind).Inc()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b.serverErrors = 0
	b.passive = true
	rt.ejectLocked(b, why)
}

// serverError reports whether an answer counts against the backend's
// health. 501 (not implemented) says nothing about health.
func serverError(status int) bool {
	return status >= 500 && status <= 599 && status != http.StatusNotImplemented
}

func (rt *Router) explain(r routed, attempts int) string {
	d := r.decision
	var sb strings.Builder
	fmt.Fprintf(&sb, "backend=%s; reason=%s; matched=%d/%d; common=%d; bound=%d; inflight=%d; share=%.2f; eligible=%d; attempts=%d; preferred_matched=%d",
		r.b.url, d.Reason, d.Matched, r.blocks, r.common, r.bound, r.inflight, d.Share, r.eligible, attempts, r.prefMatched)
	if d.Yielded != "" {
		fmt.Fprintf(&sb, "; yielded=%s", d.Yielded)
	}
	return sb.String()
}

// ParseRoute reads an explanation (RouteHeader's value) back into its
// fields: "backend", "reason", "matched" and the others explain writes.
func ParseRoute(explanation string) map[string]string {
	fields := map[string]string{}
	for _, part := range strings.Split(explanation, "; ") {
		if k, v, ok := strings.Cut(part, "="); ok {
			fields[k] = v
		}
	}
	return fields
}
