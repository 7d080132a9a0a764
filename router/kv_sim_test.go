package router

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/kvevents"
)

// routeVia posts a token-id completion through the router and returns its
// explanation of the decision.
func routeVia(t *testing.T, h *harness, tokens []uint32) map[string]string {
	t.Helper()
	resp := post(t, h.srv.URL+"/v1/completions", string(tokenBody(tokens)), DebugRequestHeader, "1")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s: %s", resp.Status, body)
	}
	return ParseRoute(resp.Header.Get(RouteHeader))
}

// The router follows three real engines (llm-d-inference-sim, an engine
// nobody here wrote) through their KV events: a token-id prompt that
// shares a prefix with an earlier one goes where the engine reports those
// blocks, with the exact count, by the kv-aware strategy.
func TestKVAwareWithInferenceSim(t *testing.T) {
	if _, err := testenv.InferenceSimPath(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	const blockSize, seed = 16, "7"
	cfg := Defaults()
	cfg.Strategy = balance.KVAware
	cfg.KVBlockSize, cfg.KVHashSeed = blockSize, seed
	cfg.KVResync = 50 * time.Millisecond
	cfg.ShareFactor = 100 // the test is about the events: keep the traffic-share bound out of it
	var sims []*testenv.InferenceSim
	for range 3 {
		ev := testenv.FreeAddr(t)
		sim := testenv.StartInferenceSim(t, testenv.InferenceSimOptions{
			Model: kvModel, EventsEndpoint: "tcp://" + ev, BlockSize: blockSize, CacheBlocks: 256, HashSeed: seed, MapEvents: len(sims) == 1,
		})
		sims = append(sims, sim)
		cfg.Backends = append(cfg.Backends, BackendConfig{URL: sim.URL, KVEvents: "bind:tcp://" + ev})
	}
	h := newHarness(t, cfg, Options{})
	// Each engine's ZMQ dialer connects in the background and what it
	// publishes before that is lost: prompt it directly until a batch
	// arrives, then wait out the resync window.
	for i, sim := range sims {
		n := 0
		wait.For(t, "events from "+sim.URL, func() bool {
			if h.rt.KVStats(sim.URL).Batches > 0 {
				return true
			}
			n++
			complete(t, sim.URL, seqTokens(900000+1000*i+n*blockSize, blockSize))
			return false
		}, wait.Timeout(30*time.Second))
		wait.For(t, "view trusted", func() bool { return h.rt.KVStats(sim.URL).Trusted })
	}

	for group := range 6 {
		shared := seqTokens(10000*(group+1), 8*blockSize)
		first := routeVia(t, h, append(shared, seqTokens(500000+group*100, 2*blockSize+3)...))
		chain := kvevents.LLMDChain(seed, kvModel, shared, blockSize)
		wait.For(t, "the group's blocks reported", func() bool { return h.rt.kv.index.Holds(first["backend"], chain[len(chain)-1]) })
		second := routeVia(t, h, append(shared, seqTokens(600000+group*100, 3*blockSize)...))
		if second["backend"] != first["backend"] || second["reason"] != string(balance.Hit) || second["matched"] != "8/11" {
			t.Fatalf("group %d: second request %v, want %s by a hit on 8 of 11 blocks (first: %v)", group, second, first["backend"], first)
		}
	}
	for _, sim := range sims {
		s := h.rt.KVStats(sim.URL)
		if s.Gaps != 0 || s.Restarts != 0 || !s.Trusted {
			t.Errorf("%s: stats %+v, want a clean trusted stream", sim.URL, s)
		}
	}
	body := scrape(t, h.reg)
	exact, approx := 0.0, 0.0
	for _, sim := range sims {
		exact += metricValue(t, body, `warmfleet_router_kv_scored_total{backend="`+sim.URL+`",view="exact"}`)
		approx += metricValue(t, body, `warmfleet_router_kv_scored_total{backend="`+sim.URL+`",view="approximate"}`)
	}
	if exact != 12*3 || approx != 0 {
		t.Errorf("scorings: %v exact, %v approximate; want every backend scored exactly for each of the 12 requests", exact, approx)
	}
}

func complete(t *testing.T, url string, prompt []uint32) {
	t.Helper()
	resp := post(t, url+"/v1/completions", string(tokenBody(prompt)))
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion at %s: %s: %s", url, resp.Status, body)
	}
}
