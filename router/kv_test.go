package router

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/kvevents"
)

const kvModel = "kv-model"

// kvHarness is a router over n real HTTP backends, each with a KV event
// stream the router binds and a kvevents.Publisher (a real ZMQ PUB socket)
// playing its engine.
type kvHarness struct {
	*harness
	urls []string
	pubs []*kvevents.Publisher
	raw  zmq4.Socket // rawSend's
}

func newKVHarness(t *testing.T, n int, cfg Config) *kvHarness {
	t.Helper()
	h := &kvHarness{}
	cfg.ProbeInterval = -1
	for i := range n {
		var hits atomic.Int64
		u := okBackend(t, fmt.Sprint("b", i), &hits).URL
		h.urls = append(h.urls, u)
		cfg.Backends = append(cfg.Backends, BackendConfig{URL: u, KVEvents: "bind:tcp://127.0.0.1:0"})
	}
	h.harness = newHarness(t, cfg, Options{})
	for _, u := range h.urls {
		wait.For(t, "router bound "+u+"'s events", func() bool { return h.rt.KVEventsAddr(u) != "" })
		pub := &kvevents.Publisher{Endpoint: "tcp://" + h.rt.KVEventsAddr(u), Topic: "kv@" + u}
		if err := pub.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		h.pubs = append(h.pubs, pub)
		// The PUB drops what it sends before the connection is up: an
		// AllBlocksCleared (harmless to repeat) until one arrives, which
		// also makes the view trusted.
		wait.For(t, "events flowing for "+u, func() bool {
			h.publish(t, len(h.pubs)-1, kvevents.Event{Kind: kvevents.AllBlocksCleared})
			return h.rt.KVStats(u).Cleared > 0
		})
	}
	return h
}

func (h *kvHarness) publish(t *testing.T, i int, evs ...kvevents.Event) {
	t.Helper()
	if err := h.pubs[i].Publish(evs); err != nil {
		t.Fatal(err)
	}
}

// store publishes backend i storing tokens' full blocks and waits for them.
func (h *kvHarness) store(t *testing.T, i int, tokens []uint32) []uint64 {
	t.Helper()
	cfg := h.rt.Config()
	chain := kvevents.LLMDChain(cfg.KVHashSeed, kvModel, tokens, cfg.KVBlockSize)
	h.publish(t, i, kvevents.Event{Kind: kvevents.BlockStored, Hashes: chain, BlockSize: cfg.KVBlockSize})
	wait.For(t, "blocks indexed", func() bool { return h.rt.kv.index.Holds(h.urls[i], chain[len(chain)-1]) })
	return chain
}

func tokenBody(tokens []uint32) []byte {
	b, _ := json.Marshal(map[string]any{"model": kvModel, "prompt": tokens, "max_tokens": 1})
	return b
}

func seqTokens(from, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(from + i)
	}
	return p
}

// A token-id prompt goes to the backend whose engine reports holding its
// blocks, with the exact count; when that engine clears its cache the
// router stops sending the prefix there at once, although its own
// approximate index saw the request go there.
func TestKVAwareFollowsEvents(t *testing.T) {
	for _, st := range []balance.Strategy{balance.PrefixAware, balance.KVAware} {
		t.Run(string(st), func(t *testing.T) {
			cfg := Defaults()
			cfg.Strategy = st
			h := newKVHarness(t, 3, cfg)
			prompt := seqTokens(1000, 10*16+5) // 10 full blocks and a partial one
			h.store(t, 1, prompt[:8*16])       // the engine holds 8 of them
			// The others hold something else: a backend holding nothing
			// would make the 8 blocks a prefix every backend comes to hold.
			h.store(t, 0, seqTokens(50000, 16))
			h.store(t, 2, seqTokens(60000, 16))
			got, err := h.rt.Route(t.Context(), tokenBody(prompt), "")
			if err != nil {
				t.Fatal(err)
			}
			if got.Backend != h.urls[1] || got.Reason != balance.Hit || got.Matched != 8 || got.Blocks != 11 {
				t.Fatalf("route %+v, want %s by a hit of 8 of 11 blocks", got, h.urls[1])
			}
			if v := testutil.ToFloat64(h.rt.kv.m.scored.WithLabelValues(h.urls[1], "exact")); v != 1 {
				t.Fatalf("exact scorings %v, want 1", v)
			}

			// The engine clears its cache: the next request must not be
			// scored as a hit there, from either index.
			h.publish(t, 1, kvevents.Event{Kind: kvevents.AllBlocksCleared})
			wait.For(t, "clear applied", func() bool { return h.rt.KVStats(h.urls[1]).Blocks == 0 })
			got, err = h.rt.Route(t.Context(), tokenBody(prompt), "")
			if err != nil {
				t.Fatal(err)
			}
			if got.Reason == balance.Hit || got.Matched != 0 {
				t.Fatalf("after the clear: route %+v, want no hit", got)
			}
		})
	}
}

// A gap in a backend's sequence (batches lost) makes its view untrusted:
// the router falls back to its approximate index for it, counts that, and
// has dropped its approximate guesses for that backend too.
func TestKVGapFallsBackAndForgets(t *testing.T) {
	cfg := Defaults()
	cfg.ShareFactor = 100 // two requests in a row to one backend keep their affinity
	h := newKVHarness(t, 2, cfg)
	prompt := seqTokens(5000, 6*16)
	h.store(t, 0, prompt)
	if got, err := h.rt.Route(t.Context(), tokenBody(prompt), ""); err != nil || got.Backend != h.urls[0] || got.Matched != 6 {
		t.Fatalf("route %+v, %v; want %s with 6 blocks", got, err, h.urls[0])
	}
	// The router keeps no guesses for a backend its trusted view scores:
	// put the prompt in the approximate index for backend 0 by hand, as
	// the requests sent while its view was last untrusted would have.
	cfg = h.rt.Config()
	keys := h.rt.engineKeys(nil, &cfg, kvModel, prompt)
	h.rt.mu.Lock()
	h.rt.index.Insert(h.rt.backends[h.urls[0]].slot, keys, 0)
	h.rt.mu.Unlock()
	// Lose a batch: the publisher's queue is bypassed by skipping a
	// sequence number on the wire.
	sendRaw(t, h, 0, 1000, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{42}, BlockSize: 16})
	wait.For(t, "gap seen", func() bool { return h.rt.KVStats(h.urls[0]).Gaps > 0 })
	got, err := h.rt.Route(t.Context(), tokenBody(prompt), "")
	if err != nil {
		t.Fatal(err)
	}
	if got.Matched != 0 {
		t.Fatalf("after the gap: route %+v, want nothing matched (the approximate guesses for %s went with its view)", got, h.urls[0])
	}
	if v := testutil.ToFloat64(h.rt.kv.m.scored.WithLabelValues(h.urls[0], "approximate")); v < 1 {
		t.Fatalf("approximate scorings %v, want the fallback counted", v)
	}
	if s := h.rt.KVStats(h.urls[0]); s.Trusted {
		t.Fatalf("view trusted right after a gap: %+v", s)
	}
}

// sendRaw sends one message with its own sequence number on a second PUB
// socket connected to backend i's address, as a confused or restarted
// engine would.
func sendRaw(t *testing.T, h *kvHarness, i int, seq uint64, evs ...kvevents.Event) {
	t.Helper()
	payload, err := kvevents.EncodeBatch(0, evs, false)
	if err != nil {
		t.Fatal(err)
	}
	rawSend(t, h, i, [][]byte{[]byte("kv"), beUint64(seq), payload})
}

func beUint64(v uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[7-i] = byte(v >> (8 * i))
	}
	return b
}

// rawSend sends frames on a second PUB socket connected to backend i's
// event address (kept open for the test: a peer that leaves reads as a
// possible engine restart), until the router has received one message more.
func rawSend(t *testing.T, h *kvHarness, i int, frames [][]byte) {
	t.Helper()
	if h.raw == nil {
		h.raw = zmq4.NewPub(t.Context())
		t.Cleanup(func() { h.raw.Close() })
		if err := h.raw.Dial("tcp://" + h.rt.KVEventsAddr(h.urls[i])); err != nil {
			t.Fatal(err)
		}
	}
	sub := h.rt.kv.subscribers()[h.urls[i]]
	before := sub.Counters().Frames.Load()
	wait.For(t, "raw message received", func() bool {
		if err := h.raw.Send(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
		return sub.Counters().Frames.Load() > before
	})
}

// metricValue is the value of the exposition line starting with series.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in:\n%s", series, grepLines(body, "kv_"))
	return 0
}

// Garbage, truncated and badly framed messages, and an engine restart
// (its sequence starting over), are counted in the metrics, never applied
// as blocks, and routing goes on.
func TestKVBadInputCounted(t *testing.T) {
	h := newKVHarness(t, 2, Defaults())
	prompt := seqTokens(7000, 4*16)
	h.store(t, 1, prompt)
	good, _ := kvevents.EncodeBatch(0, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{7, 8}, BlockSize: 16}}, true)
	for _, frames := range [][][]byte{
		{[]byte("kv"), beUint64(99), []byte("\x92\xcb garbage")},                            // malformed msgpack
		{[]byte("kv"), beUint64(99), good[:len(good)-3]},                                    // truncated
		{[]byte("kv"), []byte{1, 2}, good},                                                  // short sequence frame
		{[]byte("kv"), beUint64(99)},                                                        // two frames
		{[]byte(strings.Repeat("t", 4096)), beUint64(99), good},                             // oversized topic
		{[]byte("kv"), beUint64(99), append([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff}, good...)}, // a forged length
	} {
		rawSend(t, h, 1, frames)
	}
	for _, h7 := range []uint64{7, 8} {
		if h.rt.kv.index.Holds(h.urls[1], h7) {
			t.Fatal("a refused message's blocks were indexed")
		}
	}
	body := scrape(t, h.reg)
	for result, want := range map[string]float64{"malformed": 3, "bad_framing": 3} {
		if v := metricValue(t, body, `warmfleet_router_kv_events_messages_total{backend="`+h.urls[1]+`",result="`+result+`"}`); v < want {
			t.Errorf("%s messages counted %v, want at least %v", result, v, want)
		}
	}
	if got, err := h.rt.Route(t.Context(), tokenBody(prompt), ""); err != nil || got.Backend != h.urls[1] || got.Matched != 4 {
		t.Fatalf("route after garbage %+v, %v; want %s with 4 blocks", got, err, h.urls[1])
	}

	// The engine restarts: its sequence starts over at 1 with an empty
	// cache. What the old one held must not be matched.
	sendRaw(t, h, 1, 1, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{9}, BlockSize: 16})
	wait.For(t, "restart seen", func() bool { return h.rt.KVStats(h.urls[1]).Restarts > 0 })
	if got, err := h.rt.Route(t.Context(), tokenBody(prompt), ""); err != nil || got.Matched != 0 {
		t.Fatalf("route after the restart %+v, %v; want nothing matched", got, err)
	}
	if v := metricValue(t, scrape(t, h.reg), `warmfleet_router_kv_events_faults_total{backend="`+h.urls[1]+`",kind="restart"}`); v < 1 {
		t.Fatalf("restart counted %v times, want at least once", v)
	}
}

func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&sb, mf); err != nil {
			t.Fatal(err)
		}
	}
	return sb.String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Once an engine evicts, its peak block count sizes the router's
// approximate index for that backend, over any configured default.
func TestKVLearnsCapacity(t *testing.T) {
	h := newKVHarness(t, 1, Defaults())
	cfg := h.rt.Config()
	chain := h.store(t, 0, seqTokens(1, 40*16))
	h.publish(t, 0, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: chain[30:]})
	want := 40 * cfg.KVBlockSize
	wait.For(t, "capacity learned", func() bool {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.backends[h.urls[0]].eventsKV == want
	}, wait.Timeout(5*time.Second))
	h.rt.mu.Lock()
	size := h.rt.backends[h.urls[0]].kvSize
	h.rt.mu.Unlock()
	if wantSize := int(float64(want) * cfg.CharsPerToken / float64(cfg.BlockChars)); size != wantSize {
		t.Fatalf("approximate index size %d blocks, want %d", size, wantSize)
	}
}

func TestParseKVEvents(t *testing.T) {
	for in, want := range map[string]bool{
		"tcp://10.0.0.7:5557":       true,
		"bind:tcp://127.0.0.1:5557": true,
		"bind:tcp://[::1]:0":        true,
		"tcp://host":                false,
		"udp://h:1":                 false,
		"bind:":                     false,
		"10.0.0.7:5557":             false,
		"listen:tcp://h:1":          false,
	} {
		_, _, err := ParseKVEvents(in)
		if (err == nil) != want {
			t.Errorf("ParseKVEvents(%q) = %v, want ok=%v", in, err, want)
		}
	}
	cfg := Defaults()
	err := ParseConfig([]byte("backends:\n- url: http://a:1\n  kv_events: tcp://a\n"), &cfg)
	if err == nil || !strings.Contains(err.Error(), "backends[0]: kv_events") {
		t.Fatalf("bad kv_events accepted or unclear: %v", err)
	}
	cfg = Defaults()
	if err := ParseConfig([]byte("kv_block_size: 0\n"), &cfg); err == nil {
		t.Fatal("kv_block_size 0 accepted")
	}
}

// A backend that leaves the endpoint set (or loses its kv_events) takes its
// feed and exact view with it: nothing it or a stray publisher sends
// afterwards is indexed, and a backend that returns starts from nothing.
func TestKVFeedFollowsEndpoints(t *testing.T) {
	h := newKVHarness(t, 2, Defaults())
	h.store(t, 0, seqTokens(1, 4*16))
	eps := StaticEndpoints(&Config{Backends: []BackendConfig{{URL: h.urls[1], KVEvents: "bind:tcp://127.0.0.1:0"}}})
	h.src.Set(eps)
	wait.For(t, "the gone backend's feed stopped", func() bool { return h.rt.KVEventsAddr(h.urls[0]) == "" })
	if s := h.rt.KVStats(h.urls[0]); s.Blocks != 0 || s.Batches != 0 {
		t.Fatalf("view of a gone backend kept: %+v", s)
	}
	// Its old publisher goes on; nothing may come of it.
	h.publish(t, 0, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{1, 2}, BlockSize: 16})
	if s := h.rt.KVStats(h.urls[0]); s.Blocks != 0 {
		t.Fatalf("a gone backend's events indexed: %+v", s)
	}
	if n := len(h.rt.kv.subscribers()); n != 1 {
		t.Fatalf("%d feeds, want 1", n)
	}
}

// A backend scored by its trusted event view gets no approximate guesses
// for token-id prompts (they would never be used: the view is exact, and
// a reset drops them); once its view is not trusted, the router guesses
// again from what it sends.
func TestKVTrustedViewKeepsNoGuesses(t *testing.T) {
	rt, cfg := kvRouter(t, 2)
	prompt := seqTokens(300, 8*16)
	u := cfg.Backends[0].URL
	chain := kvevents.LLMDChain(cfg.KVHashSeed, kvModel, prompt, cfg.KVBlockSize)
	rt.kv.index.Apply(u, 1, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: chain, BlockSize: cfg.KVBlockSize}}})
	guesses := func() (n int) {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		for _, b := range rt.order {
			n += rt.index.Len(b.slot)
		}
		return n
	}
	got, err := rt.Route(t.Context(), tokenBody(prompt), "")
	if err != nil || got.Backend != u || got.Matched != 8 {
		t.Fatalf("route %+v, %v; want %s with 8 blocks", got, err, u)
	}
	if n := guesses(); n != 0 {
		t.Fatalf("%d approximate guesses after a request scored by trusted views", n)
	}
	rt.kv.index.Disconnected(u)
	if _, err := rt.Route(t.Context(), tokenBody(prompt), ""); err != nil {
		t.Fatal(err)
	}
	if n := guesses(); n != 8 {
		t.Fatalf("%d approximate guesses after a request with the view lost, want 8", n)
	}
}

// Cache-aware's tree size for a backend its trusted event view scores is
// that view's block count (the router keeps no guesses for it): a cold
// token-id prompt goes to the backend whose engine holds less.
func TestKVCacheAwareHeldFromEvents(t *testing.T) {
	rt, cfg := kvRouter(t, 2)
	if err := rt.SetStrategy("", balance.CacheAware); err != nil {
		t.Fatal(err)
	}
	seqs := make([]uint64, 2)
	hold := func(i, from, blocks int) {
		seqs[i]++
		chain := kvevents.LLMDChain(cfg.KVHashSeed, kvModel, seqTokens(from, blocks*16), cfg.KVBlockSize)
		rt.kv.index.Apply(cfg.Backends[i].URL, seqs[i], kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: chain, BlockSize: cfg.KVBlockSize}}})
	}
	hold(0, 100000, 50)
	hold(1, 200000, 1)
	for round, want := range []int{1, 0} {
		got, err := rt.Route(t.Context(), tokenBody(seqTokens(300000+round*1000, 4*16)), "")
		if err != nil {
			t.Fatal(err)
		}
		if got.Backend != cfg.Backends[want].URL || got.Reason != balance.Cold {
			t.Fatalf("round %d: route %+v, want %s (its engine holds fewer blocks)", round, got, cfg.Backends[want].URL)
		}
		hold(1, 400000, 100) // now backend 1 holds more
	}
}
