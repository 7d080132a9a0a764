package router

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
)

// The fit recovers an engine's costs from noisy observations with stalls
// among them, whichever terms the engine's speed depends on.
func TestTTFTModelLearns(t *testing.T) {
	tests := []struct {
		name  string
		theta [balance.NumFeatures]float64
	}{
		{"serial prefill (vLLM-like): queued and own uncached blocks", [balance.NumFeatures]float64{0.002, 0.2, 0.004, 0.2, 0, 0, 0}},
		{"batched prefill slowed by running sequences", [balance.NumFeatures]float64{0.01, 0.05, 0, 0, 0.003, 0.02, 0}},
		{"sequence slots: a wait per request queued for its first token", [balance.NumFeatures]float64{0.005, 0.02, 0, 0, 0.001, 0, 0.08}},
		{"a fixed cost only", [balance.NumFeatures]float64{0.03, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			m := newTTFTModel()
			for i := range 600 {
				x := balance.Features(rng.IntN(256), rng.IntN(256), rng.IntN(512), rng.IntN(8), rng.IntN(6))
				y := 0.0
				for j := range x {
					y += tt.theta[j] * x[j]
				}
				y *= 1 + 0.05*rng.NormFloat64()
				if i%20 == 7 {
					y += 30 // a stall: must not drag the fit
				}
				m.observe(x, max(y, 0))
			}
			// What routing needs: predictions within about 10% of
			// the engine's time wherever requests fall.
			for range 200 {
				x := balance.Features(rng.IntN(256), rng.IntN(256), rng.IntN(512), rng.IntN(8), rng.IntN(6))
				want := 0.0
				for j := range x {
					want += tt.theta[j] * x[j]
				}
				if got := m.predict(&x); math.Abs(got-want) > 0.1*want+0.01 {
					t.Fatalf("at %v predicted %.4f s, want %.4f (theta %v)", x, got, want, m.theta)
				}
			}
		})
	}
}

// A backend that slows down is followed within a few hundred requests.
func TestTTFTModelForgets(t *testing.T) {
	m := newTTFTModel()
	rng := rand.New(rand.NewPCG(3, 4))
	feed := func(perBlock float64, n int) {
		for range n {
			u := 1 + rng.IntN(256)
			m.observe(balance.Features(u, rng.IntN(64), 0, 0, 0), 0.001+perBlock*float64(u)/balance.FeatureBlocks)
		}
	}
	feed(0.1, 400)
	feed(0.3, 600)
	if got := m.theta[1]; math.Abs(got-0.3) > 0.03 {
		t.Fatalf("uncached cost %.3f after the backend slowed to 0.3", got)
	}
}

// Observations that are not times to first byte are ignored.
func TestTTFTModelRejects(t *testing.T) {
	m := newTTFTModel()
	x := balance.Features(64, 0, 0, 1, 0)
	for _, y := range []float64{-1, math.NaN(), math.Inf(1), 7200} {
		m.observe(x, y)
	}
	if m.n != 0 || m.theta != ([balance.NumFeatures]float64{}) {
		t.Fatalf("model moved on bad observations: n=%d theta=%v", m.n, m.theta)
	}
}

func TestParseEngineStats(t *testing.T) {
	tests := []struct {
		name, text string
		want       EngineStats
		ok         bool
	}{
		{"vLLM v1", `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600
`, EngineStats{Waiting: 3, Running: 5, KVUsage: 0.25, Hits: 600, Queries: 1000}, true},
		{"older vLLM names, two engines summed", `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 1
vllm:num_requests_waiting{engine="1"} 2
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 4
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc 0.5
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total 10
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total 4
`, EngineStats{Waiting: 3, Running: 4, KVUsage: 0.5, Hits: 4, Queries: 10}, true},
		{"llm-d-inference-sim's counters without _total", `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits{model_name="m"} 32
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries{model_name="m"} 64
`, EngineStats{Running: 2, KVUsage: -1, Hits: 32, Queries: 64}, true},
		{"no request counts", "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.1\n", EngineStats{KVUsage: -1}, false},
		{"negative count", "vllm:num_requests_waiting -1\nvllm:num_requests_running 1\n", EngineStats{KVUsage: -1}, false},
		{"NaN count", "vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\n", EngineStats{KVUsage: -1}, false},
		{"usage over 1 is not taken", "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 7\n",
			EngineStats{Running: 1, KVUsage: -1}, true},
		{"more hits than queries are not taken", "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:prefix_cache_hits 5\nvllm:prefix_cache_queries 2\n",
			EngineStats{KVUsage: -1}, true},
		{"garbage", "{not metrics", EngineStats{KVUsage: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseEngineStats(strings.NewReader(tt.text))
			if ok != tt.ok || (ok && got != tt.want) {
				t.Fatalf("got %+v %v, want %+v %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// fakeClock is the router's clock in tests where backends decide how long
// they took: each advances it before its first byte.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// costBackend takes perKB of the clock per KiB of request body before its
// first byte, and answers every request whose body contains "fail" with 500.
func costBackend(t *testing.T, clock *fakeClock, perKB time.Duration, hits *int) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		clock.mu.Lock()
		*hits++
		clock.mu.Unlock()
		if strings.Contains(string(body), "fail") {
			http.Error(w, "engine error", http.StatusInternalServerError)
			return
		}
		clock.advance(perKB * time.Duration(len(body)) / 1024)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(s.Close)
	return s
}

// The router learns each backend's cost per uncached prompt block from
// its streamed, successful answers only, exports it, and sends new
// prompts to the backend it learned is faster.
func TestSelfTuningLearnsBackends(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	var fastHits, slowHits int
	fast := costBackend(t, clock, time.Millisecond, &fastHits)
	slow := costBackend(t, clock, 4*time.Millisecond, &slowHits)
	cfg := Defaults()
	// With learn_costs, learning goes on under any strategy, so switching
	// to self-tuning starts informed: least-outstanding has both backends
	// learned.
	cfg.Strategy = balance.LeastOutstanding
	cfg.LearnCosts = true
	// Only the learned costs decide here; the traffic-share bound is
	// TestDecideTuned's. With it, how the warm-up split the traffic
	// decided too: the fast backend's fit is held to the fleet's price
	// over SpeedBand, the two speeds then count as equal, and a warm-up
	// that gave the fast backend more than half put it over 1.2 x its
	// share within the 20 prompts below.
	cfg.TuneShareFactor = 100
	h := newHarness(t, cfg, Options{Now: clock.Now}, fast.URL, slow.URL)
	rng := rand.New(rand.NewPCG(5, 6))
	send := func(i int, stream bool, extra string) {
		t.Helper()
		prompt := fmt.Sprintf("prompt %d %s %s", i, extra, strings.Repeat("abcdefgh", 64+rng.IntN(1024)))
		resp := post(t, h.srv.URL+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"stream":%v}`, prompt, stream))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h.settle()
	}
	samples := func(u string) int {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.backends[u].tune.model.n
	}
	for i := range 5 {
		send(i, false, "")
		send(i, true, "fail")
	}
	if n := samples(fast.URL) + samples(slow.URL); n != 0 {
		t.Fatalf("learned from %d non-streamed or failed answers", n)
	}
	for i := range 200 {
		send(100+i, true, "")
		if samples(fast.URL) >= 2*tuneMinSamples && samples(slow.URL) >= 2*tuneMinSamples {
			break
		}
	}
	if samples(fast.URL) < tuneMinSamples || samples(slow.URL) < tuneMinSamples {
		t.Fatalf("samples: fast %d, slow %d: both should have learned", samples(fast.URL), samples(slow.URL))
	}
	cost := func(u string) float64 {
		return metricFor(t, h, "warmfleet_router_backend_ttft_cost_seconds", u, "uncached_block")
	}
	// 256-byte blocks: 0.25 ms on the fast backend, 1 ms on the slow one.
	if f, s := cost(fast.URL), cost(slow.URL); math.Abs(f-0.00025) > 0.00005 || math.Abs(s-0.001) > 0.0002 {
		t.Fatalf("learned uncached block costs: fast %.6f s, slow %.6f s; want 0.00025 and 0.001", f, s)
	}
	if err := h.rt.SetStrategy("", balance.SelfTuning); err != nil {
		t.Fatal(err)
	}
	before := slowHits
	for i := range 20 {
		send(1000+i, true, "")
	}
	if slowHits != before {
		t.Fatalf("%d of 20 new prompts went to the slower backend", slowHits-before)
	}
}

// Without learn_costs the fits learn only while a model is routed by
// self-tuning: under another strategy nothing reads them.
func TestLearningOnlyWhenUsed(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	var hits int
	be := costBackend(t, clock, time.Millisecond, &hits)
	cfg := Defaults()
	cfg.Strategy = balance.PrefixAware
	h := newHarness(t, cfg, Options{Now: clock.Now}, be.URL)
	samples := func() int {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.backends[be.URL].tune.model.n + h.rt.tune.pooled.n
	}
	send := func(i int) {
		t.Helper()
		resp := post(t, h.srv.URL+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"prompt %d %s","stream":true}`, i, strings.Repeat("abcdefgh", 64)))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h.settle()
	}
	for i := range 5 {
		send(i)
	}
	if n := samples(); n != 0 {
		t.Fatalf("learned %d observations under prefix-aware", n)
	}
	if err := h.rt.SetStrategy("other-model", balance.SelfTuning); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		send(10 + i)
	}
	if n := samples(); n != 10 {
		t.Fatalf("%d observations with a model on self-tuning, want 5 in each of two fits", n)
	}
}

// metricFor is the value of one series of the harness's registry.
func metricFor(t *testing.T, h *harness, name, backend, term string) float64 {
	t.Helper()
	fams, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["backend"] == backend && labels["term"] == term {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{backend=%q,term=%q}", name, backend, term)
	return 0
}

// The engines' metrics add what the router cannot see: requests beyond its
// own in flight there (other routers'), the free KV cache, the reuse rate;
// a reading that is too old is not used.
func TestReadEngines(t *testing.T) {
	page := "vllm:num_requests_waiting 5\nvllm:num_requests_running 3\nvllm:kv_cache_usage_perc 0.75\nvllm:prefix_cache_hits 0\nvllm:prefix_cache_queries 0\n"
	var mu sync.Mutex
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, page)
	}))
	t.Cleanup(engine.Close)
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	cfg := Defaults()
	cfg.KVCacheTokens = 64 * 1000 // 1000 blocks of 256 bytes at 4 bytes per token
	h := newHarness(t, cfg, Options{Now: clock.Now}, engine.URL)
	h.rt.mu.Lock()
	h.rt.cfg.EngineMetricsInterval = time.Second // read by hand below; the harness's loop stays off
	b := h.rt.backends[engine.URL]
	b.inflight = 2 // this router's own: 6 of the engine's 8 are others'
	h.rt.mu.Unlock()
	h.rt.ReadEngines(t.Context())
	mu.Lock()
	page = strings.NewReplacer("_hits 0", "_hits 30", "_queries 0", "_queries 40").Replace(page)
	mu.Unlock()
	clock.advance(time.Second)
	h.rt.ReadEngines(t.Context())
	estimate := func() balance.Estimate {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		var in balance.Input
		h.rt.estimatesLocked(&in, []*backend{b}, false, clock.Now())
		return in.Estimates[0]
	}
	e := estimate()
	if e.Others != 6 || e.KVFree != 250 || e.Reuse != 0.75 {
		t.Fatalf("estimate %+v: want 6 other requests, 250 free blocks, reuse 0.75", e)
	}
	clock.advance(10 * time.Second)
	if e := estimate(); e.Others != 0 || e.KVFree != -1 {
		t.Fatalf("a reading 10 intervals old still used: %+v", e)
	}
}

// An engine's sequence slots are the most requests it ran while others
// waited: learned from its metrics where no max_num_seqs is configured,
// never lowered by a reading with fewer running, and overridden by the
// config.
func TestReadEnginesLearnsSlots(t *testing.T) {
	var mu sync.Mutex
	page := ""
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprint(w, page)
	}))
	t.Cleanup(engine.Close)
	h := newHarness(t, Defaults(), Options{}, engine.URL)
	if cfg := Defaults(); !cfg.readsEngines() {
		t.Fatal("the engines' metrics are not read by default (no max_num_seqs configured)")
	}
	slots := func(running, waiting int) int32 {
		mu.Lock()
		page = fmt.Sprintf("vllm:num_requests_waiting %d\nvllm:num_requests_running %d\n", waiting, running)
		mu.Unlock()
		h.rt.ReadEngines(t.Context())
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.backends[engine.URL].slots
	}
	for _, step := range []struct {
		running, waiting int
		want             int32
	}{
		{3, 0, 0}, // never seen full
		{4, 2, 4},
		{2, 1, 4}, // fewer running while others wait (a full KV cache): not lowered
		{6, 1, 6},
		{9, 0, 6}, // more running with none waiting says nothing
	} {
		if got := slots(step.running, step.waiting); got != step.want {
			t.Fatalf("after %d running, %d waiting: slots %d, want %d", step.running, step.waiting, got, step.want)
		}
	}
	cfg := Defaults()
	cfg.MaxNumSeqs = 16
	if cfg.readsEngines() {
		t.Fatal("the engines' metrics are read with max_num_seqs configured and no self-tuning")
	}
	if err := h.rt.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if got := slots(6, 1); got != 16 {
		t.Fatalf("configured max_num_seqs 16: slots %d", got)
	}
}

// A backend with a fit of its own has its uncached block priced at no less
// than the fleet's fit's over balance.SpeedBand; one scored with the
// fleet's fit needs no floor.
func TestEstimatesFloorUncached(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	cfg := Defaults()
	cfg.Strategy = balance.SelfTuning
	h := newHarness(t, cfg, Options{Now: clock.Now}, "http://127.0.0.1:1", "http://127.0.0.1:2")
	h.rt.mu.Lock()
	defer h.rt.mu.Unlock()
	own, fleet := h.rt.backends["http://127.0.0.1:1"], h.rt.backends["http://127.0.0.1:2"]
	h.rt.tune.pooled.n, h.rt.tune.pooled.theta[1] = 10*tuneMinSamples, 0.2
	own.tune.model.n, own.tune.model.theta[1] = tuneMinSamples, 0.001
	var in balance.Input
	h.rt.estimatesLocked(&in, []*backend{own, fleet}, false, clock.Now())
	if got, want := in.Estimates[0].MinUncached, 0.2/balance.SpeedBand; got != want {
		t.Fatalf("own fit: MinUncached %v, want %v", got, want)
	}
	if e := in.Estimates[1]; e.MinUncached != 0 || e.Theta[1] != 0.2 {
		t.Fatalf("fleet's fit: %+v, want its theta and no floor", e)
	}
}
