package router

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/router/kvevents"
)

// KV events. A backend whose config names a kv_events address gets one
// kvevents.Subscriber, run by Router.Run for as long as the backend is in
// the endpoint set. The exact index it feeds is used two ways:
//
//   - For a token-id prompt (the completions API's prompt as an array of
//     token ids) the router computes the engine's own block hashes
//     (kvevents.AppendLLMDChain, with kv_block_size and kv_hash_seed) and
//     uses them as the request's keys. A backend whose event view is
//     trusted is then scored by the blocks it really holds (and the
//     router keeps no guesses of its own for it); any other backend (no
//     events, stream down, gap, restart) by the approximate index, over
//     the same keys, and the fallback is counted.
//   - Whatever the prompt, each stream corrects the approximate index: when
//     the engine's view is emptied (AllBlocksCleared, a restart, a gap, a
//     reconnection) the backend's approximate entries are dropped too, and
//     once the engine has evicted, its peak block count sizes the
//     backend's approximate index (its real capacity).

// ParseKVEvents checks a kv_events value: tcp://HOST:PORT (the router
// connects; the engine's publisher binds, as vLLM's does by default) or
// bind:tcp://HOST:PORT (the router binds; the engine connects, as
// llm-d-inference-sim's --zmq-endpoint does). It returns the tcp endpoint
// and whether the router binds it.
func ParseKVEvents(s string) (endpoint string, bind bool, err error) {
	endpoint, bind = strings.CutPrefix(s, "bind:")
	if _, err := kvevents.ParseEndpoint(endpoint); err != nil {
		return "", false, fmt.Errorf("%q: want tcp://HOST:PORT (the engine binds) or bind:tcp://HOST:PORT (the router binds)", s)
	}
	return endpoint, bind, nil
}

// kvFeeds runs the subscribers and holds the exact index.
type kvFeeds struct {
	index  *kvevents.Index
	chains kvevents.ChainCache // the engine's hashes of blocks prompts share
	active atomic.Int32        // backends with a feed: token-id prompts get engine keys
	m      *kvMetrics

	mu    sync.Mutex
	ctx   context.Context // Run's, once it runs; nil before
	feeds map[string]*kvFeed
	wg    sync.WaitGroup
}

type kvFeed struct {
	spec   string
	sub    *kvevents.Subscriber
	cancel context.CancelFunc // nil until started
	// Only the subscriber's goroutine touches these (OnApply).
	resets uint64
	peak   int // the view's peak once the engine evicted (0 before)
}

func newKVFeeds(cfg *Config, m *kvMetrics) *kvFeeds {
	return &kvFeeds{index: kvevents.NewIndex(kvevents.DefaultLimits(), cfg.KVResync, nil), feeds: map[string]*kvFeed{}, m: m}
}

// run starts the feeds and, when ctx ends, waits for them to stop.
func (k *kvFeeds) run(ctx context.Context) {
	k.mu.Lock()
	k.ctx = ctx
	for _, f := range k.feeds {
		k.startLocked(f)
	}
	k.mu.Unlock()
	<-ctx.Done()
	k.mu.Lock()
	k.ctx = nil
	k.mu.Unlock()
	k.wg.Wait()
}

func (k *kvFeeds) startLocked(f *kvFeed) {
	if k.ctx == nil || k.ctx.Err() != nil || f.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(k.ctx)
	f.cancel = cancel
	k.wg.Go(func() {
		// Run fails only on a bad endpoint, which Validate refused.
		if err := f.sub.Run(ctx); err != nil {
			f.sub.Log.Error("kv events subscriber stopped", "err", err)
		}
	})
}

// syncKVLocked makes the feeds match the backends (rt.mu held): a feed per
// backend with a kv_events address, restarted when the address changes.
// Stopped feeds are cancelled, not waited for: their hook takes rt.mu.
func (rt *Router) syncKVLocked() {
	k := rt.kv
	k.mu.Lock()
	defer k.mu.Unlock()
	want := map[string]string{}
	for _, b := range rt.order {
		if b.ep.KVEvents != "" {
			want[b.url] = b.ep.KVEvents
		}
	}
	for url, f := range k.feeds {
		if want[url] == f.spec {
			continue
		}
		if f.cancel != nil {
			f.cancel()
		}
		delete(k.feeds, url)
		k.index.Forget(url)
		k.m.forget(url)
		if b := rt.backends[url]; b != nil {
			b.kvExact, b.kvApprox, b.eventsKV, b.kvTrusted = nil, nil, 0, false
		}
	}
	for url, spec := range want {
		if k.feeds[url] != nil {
			continue
		}
		ep, bind, err := ParseKVEvents(spec)
		if err != nil {
			rt.log.Warn("ignoring a bad kv_events address", "backend", url, "err", err)
			continue
		}
		f := &kvFeed{spec: spec}
		f.sub = &kvevents.Subscriber{Backend: url, Endpoint: ep, Listen: bind, Index: k.index,
			Log: rt.log.With("component", "kv-events"), OnApply: func(s kvevents.Stats) { rt.kvApplied(url, f, s) }}
		k.feeds[url] = f
		k.startLocked(f)
	}
	k.active.Store(int32(len(k.feeds)))
}

// kvApplied corrects the approximate index from a backend's stream, after
// each batch: its guesses go when the engine's cache was emptied (or may
// have been), and its size follows the engine's once the engine evicts.
func (rt *Router) kvApplied(url string, f *kvFeed, s kvevents.Stats) {
	peak := 0
	if s.Removed > 0 {
		peak = s.Peak
	}
	reset := s.Resets != f.resets
	if !reset && peak == f.peak {
		return
	}
	f.resets, f.peak = s.Resets, peak
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b := rt.backends[url]
	if b == nil || b.ep.KVEvents != f.spec {
		return // the feed was replaced meanwhile
	}
	if reset {
		rt.index.RemoveSlot(b.slot)
	}
	b.eventsKV = peak * rt.cfg.KVBlockSize
	rt.configureLocked(b) // sizes the slot (and tracks it again after a reset)
}

// KVEventsAddr is the address the router bound for backend's events
// (bind:tcp://HOST:0 picks a port), "" when it binds none (yet).
func (rt *Router) KVEventsAddr(backend string) string {
	rt.kv.mu.Lock()
	defer rt.kv.mu.Unlock()
	if f := rt.kv.feeds[backend]; f != nil {
		return f.sub.Addr()
	}
	return ""
}

// KVStats returns what backend's event stream has delivered.
func (rt *Router) KVStats(backend string) kvevents.Stats { return rt.kv.index.Stats(backend) }

// engineKeys computes the engine's block hashes for a token-id prompt (the
// ids the scan read, oai.Request.Tokens) into dst, with one more key for a
// partial last block (it can never match an engine's block, but gives short
// prompts and the cold path a key as the text hashes do).
func (rt *Router) engineKeys(dst []uint64, cfg *Config, model string, ids []uint32) []uint64 {
	dst = rt.kv.chains.AppendLLMDChain(dst, cfg.KVHashSeed, model, ids, cfg.KVBlockSize, cfg.MaxBlocks)
	if full := len(ids) / cfg.KVBlockSize; len(dst) < cfg.MaxBlocks && full*cfg.KVBlockSize < len(ids) {
		var prev uint64
		if len(dst) > 0 {
			prev = dst[len(dst)-1]
		}
		tail := rt.opts.HashKey.Sum2(prev, uint64(len(ids)-full*cfg.KVBlockSize))
		for _, t := range ids[full*cfg.KVBlockSize:] {
			tail = rt.opts.HashKey.Sum2(tail, uint64(t))
		}
		dst = append(dst, tail)
	}
	return dst
}

// kvScoreLocked matches keys against the event view of every member that
// publishes events, for kvApplyLocked, and reports whether every member's
// view is trusted: the approximate index's match would then be overridden
// for all of them, and the caller skips it.
func (rt *Router) kvScoreLocked(members []*backend, keys []uint64) (all bool) {
	urls, pub := rt.kvURLs[:0], rt.kvPub[:0]
	for _, b := range members {
		if b.ep.KVEvents == "" {
			continue
		}
		if b.kvExact == nil {
			b.kvExact = rt.kv.m.scored.WithLabelValues(b.url, "exact")
			b.kvApprox = rt.kv.m.scored.WithLabelValues(b.url, "approximate")
		}
		urls, pub = append(urls, b.url), append(pub, b)
	}
	n, ok := slices.Grow(rt.kvN[:0], len(urls))[:len(urls)], slices.Grow(rt.kvOK[:0], len(urls))[:len(urls)]
	rt.kv.index.MatchAll(urls, keys, n, ok)
	rt.kvURLs, rt.kvPub, rt.kvN, rt.kvOK = urls, pub, n, ok
	return len(pub) == len(members) && !slices.Contains(ok, false)
}

// kvApplyLocked overrides depth (the approximate index's match) with the
// exact one kvScoreLocked found for every member whose event view is
// trusted, and counts which view scored each backend that publishes events.
func (rt *Router) kvApplyLocked(depth []int) {
	for i, b := range rt.kvPub {
		b.kvTrusted = rt.kvOK[i]
		if rt.kvOK[i] {
			depth[b.slot] = rt.kvN[i]
			b.kvExact.Inc()
		} else {
			b.kvApprox.Inc()
		}
	}
	clear(rt.kvPub) // no backend is kept alive by the scratch space
	rt.kvURLs, rt.kvPub, rt.kvN, rt.kvOK = rt.kvURLs[:0], rt.kvPub[:0], rt.kvN[:0], rt.kvOK[:0]
}

// heldLocked is how many router blocks b is taken to hold for a decision
// on a prompt whose keys are the engine's (exact) or not: its event view's
// blocks while that scores it (the router keeps no guesses then), its
// approximate index's otherwise.
func (rt *Router) heldLocked(b *backend, exact bool) float64 {
	if exact && b.kvTrusted {
		return float64(rt.kv.index.Blocks(b.url)) * rt.keyScaleLocked(true)
	}
	return float64(rt.index.Len(b.slot))
}

// kvMetrics are the event streams' series.
type kvMetrics struct {
	scored   *prometheus.CounterVec
	messages *prometheus.Desc
	faults   *prometheus.Desc
	blocks   *prometheus.Desc
	trusted  *prometheus.Desc
	feeds    func() map[string]*kvevents.Subscriber
	index    func() *kvevents.Index
}

func newKVMetrics(reg prometheus.Registerer) (*kvMetrics, error) {
	m := &kvMetrics{
		scored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmfleet_router_kv_scored_total",
			Help: "Token-id prompts scored for a backend that publishes KV events, by the view used: exact (its event stream) or approximate (the stream was missing, lagging after a gap, or reset).",
		}, []string{"backend", "view"}),
		messages: prometheus.NewDesc("warmfleet_router_kv_events_messages_total",
			"KV event messages received per backend, by result: applied, malformed (bad msgpack), bad_framing, foreign (another engine's topic).", []string{"backend", "result"}, nil),
		faults: prometheus.NewDesc("warmfleet_router_kv_events_faults_total",
			"KV event stream faults per backend, by kind: disconnect, gap (batches lost), restart (sequence went back), overflow (view over its bound).", []string{"backend", "kind"}, nil),
		blocks: prometheus.NewDesc("warmfleet_router_kv_events_blocks",
			"Blocks the backend's engine holds, as its KV events tell.", []string{"backend"}, nil),
		trusted: prometheus.NewDesc("warmfleet_router_kv_events_trusted",
			"1 while the backend's event view is trusted for routing, 0 while the router falls back to its approximate index.", []string{"backend"}, nil),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.scored, m} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("router metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *kvMetrics) forget(backend string) {
	m.scored.DeleteLabelValues(backend, "exact")
	m.scored.DeleteLabelValues(backend, "approximate")
}

// Describe implements prometheus.Collector.
func (m *kvMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.messages
	ch <- m.faults
	ch <- m.blocks
	ch <- m.trusted
}

// Collect implements prometheus.Collector, reading each feed's counters.
func (m *kvMetrics) Collect(ch chan<- prometheus.Metric) {
	if m.feeds == nil {
		return
	}
	x := m.index()
	for url, sub := range m.feeds() {
		c, s := sub.Counters(), x.Stats(url)
		counter := func(d *prometheus.Desc, v uint64, label string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), url, label)
		}
		counter(m.messages, s.Batches, "applied")
		counter(m.messages, c.Malformed.Load(), "malformed")
		counter(m.messages, c.BadFrames.Load(), "bad_framing")
		counter(m.messages, c.Foreign.Load(), "foreign")
		counter(m.faults, c.Disconnects.Load(), "disconnect")
		counter(m.faults, s.Gaps, "gap")
		counter(m.faults, s.Restarts, "restart")
		counter(m.faults, s.Overflows, "overflow")
		ch <- prometheus.MustNewConstMetric(m.blocks, prometheus.GaugeValue, float64(s.Blocks), url)
		trusted := 0.0
		if s.Trusted {
			trusted = 1
		}
		ch <- prometheus.MustNewConstMetric(m.trusted, prometheus.GaugeValue, trusted, url)
	}
}

// subscribers snapshots the feeds for the metrics.
func (k *kvFeeds) subscribers() map[string]*kvevents.Subscriber {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]*kvevents.Subscriber, len(k.feeds))
	for url, f := range k.feeds {
		out[url] = f.sub
	}
	return out
}
