package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// DecisionResult is the routing decision time (scan + hash + decide +
// index update) measured in-process.
type DecisionResult struct {
	Backends    int     `json:"backends"`
	PromptBytes int     `json:"prompt_bytes"`
	Samples     int     `json:"samples"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	HitFraction float64 `json:"hit_fraction"`
	// Floor is the machine's own tail at this duration: a fixed
	// computation as long as the decision's p50, timed as many times the
	// same way. Its p99 is what interrupts and stolen time alone make of
	// that p50 here, the baseline the decision's p99 is read against.
	Floor Floor `json:"floor"`
	// ByStrategy is every strategy's, on the same prompts; the figures
	// above are prefix-aware's (the default's, the goal's).
	ByStrategy []StrategyDecision `json:"by_strategy,omitempty"`
}

// Floor is the fixed computation's time quantiles (see DecisionResult).
type Floor struct {
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

// StrategyDecision is one strategy's decision time.
type StrategyDecision struct {
	Strategy balance.Strategy `json:"strategy"`
	P50us    float64          `json:"p50_us"`
	P99us    float64          `json:"p99_us"`
}

func measureDecision(backends, promptBytes, samples int, seed uint64, strategies []balance.Strategy) (*DecisionResult, error) {
	if !slices.Contains(strategies, balance.PrefixAware) {
		strategies = append(slices.Clone(strategies), balance.PrefixAware)
	}
	var res *DecisionResult
	var each []StrategyDecision
	for _, st := range strategies {
		d, err := measureDecisionOf(st, backends, promptBytes, samples, seed)
		if err != nil {
			return nil, err
		}
		each = append(each, StrategyDecision{Strategy: st, P50us: d.P50us, P99us: d.P99us})
		if st == balance.PrefixAware {
			res = d
		}
	}
	if len(each) > 1 {
		res.ByStrategy = each
	}
	res.Floor = measureFloor(res.P50us, samples)
	return res, nil
}

// floorSink keeps the floor's computation from being optimised away.
var floorSink uint64

// floorWork is a fixed run of dependent multiply-xor steps: no memory,
// no branches that depend on data, so every run takes the same time
// unless the machine takes some of it.
func floorWork(steps int) {
	x := floorSink | 1
	for range steps {
		x = x*6364136223846793005 + 1442695040888963407
		x ^= x >> 29
	}
	floorSink = x
}

// measureFloor times samples runs of floorWork sized to take about
// targetUs each (see DecisionResult.Floor).
func measureFloor(targetUs float64, samples int) Floor {
	const probe = 4096
	times := make([]float64, 0, max(samples, 201))
	for range 201 {
		start := time.Now()
		floorWork(probe)
		times = append(times, float64(time.Since(start).Nanoseconds())/1e3)
	}
	steps := max(1, int(targetUs/quantile(times, 0.5)*probe))
	times = times[:0]
	for range samples {
		start := time.Now()
		floorWork(steps)
		times = append(times, float64(time.Since(start).Nanoseconds())/1e3)
	}
	return Floor{P50us: quantile(times, 0.5), P99us: quantile(times, 0.99)}
}

func measureDecisionOf(st balance.Strategy, backends, promptBytes, samples int, seed uint64) (*DecisionResult, error) {
	cfg := router.Defaults()
	cfg.Strategy = st
	cfg.ProbeInterval = -1
	for i := range backends {
		cfg.Backends = append(cfg.Backends, router.BackendConfig{URL: fmt.Sprintf("http://127.0.0.1:%d", 20000+i)})
	}
	rt, err := router.New(cfg, router.Options{Source: router.NewStaticSource(router.StaticEndpoints(&cfg), nil),
		HashKey: prefix.KeyFromBytes([]byte("bench")), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0xdec1))
	// Prompts share long documents (so matches walk deep) and end uniquely.
	docs := make([]string, 4*backends)
	for i := range docs {
		docs[i] = lines(rng, promptBytes*3/4/4, 4)
	}
	bodies := make([][]byte, 512)
	for i := range bodies {
		suffix := lines(rng, (promptBytes-len(docs[0]))/4, 4)
		bodies[i] = chatBody("m", []chatMsg{{"system", "be brief"}, {"user", docs[rng.IntN(len(docs))] + suffix}}, 16)
	}
	ctx := context.Background()
	for _, b := range bodies { // warm the index
		if _, err := rt.Route(ctx, b, ""); err != nil {
			return nil, err
		}
	}
	times := make([]float64, 0, samples)
	hits := 0
	for i := range samples {
		start := time.Now()
		r, err := rt.Route(ctx, bodies[i%len(bodies)], "")
		times = append(times, float64(time.Since(start).Nanoseconds())/1e3)
		if err != nil {
			return nil, err
		}
		if r.Reason == balance.Hit {
			hits++
		}
	}
	return &DecisionResult{Backends: backends, PromptBytes: len(bodies[0]), Samples: samples,
		P50us: quantile(times, 0.5), P99us: quantile(times, 0.99), HitFraction: float64(hits) / float64(samples)}, nil
}

// OverheadResult compares end-to-end latency straight to a backend with
// latency through the router at a fixed request rate, against instant
// simulated backends (so only HTTP and routing remain). The top-level
// router and added figures are prefix-aware's, the goal's; ByStrategy has
// every strategy measured, in the same rounds.
type OverheadResult struct {
	Rate        int     `json:"rate_rps"`
	Requests    int     `json:"requests_per_mode"`
	PromptBytes int     `json:"prompt_bytes"`
	DirectP50ms float64 `json:"direct_p50_ms"`
	DirectP99ms float64 `json:"direct_p99_ms"`
	RouterP50ms float64 `json:"router_p50_ms"`
	RouterP99ms float64 `json:"router_p99_ms"`
	AddedP50ms  float64 `json:"added_p50_ms"`
	AddedP99ms  float64 `json:"added_p99_ms"`
	// Paired figures are prefix-aware's from rounds of their own, in which
	// each request is sent straight to a backend and through the router at
	// the same instant: the quantiles of the routed copy's excess, per
	// pair. A stall that delays both copies cancels out of the pair, where
	// the difference of two separately taken p99s keeps it; a stall that
	// hits one copy does not, so on an overloaded machine the paired p99
	// is no steadier than the difference.
	PairedRequests   int     `json:"paired_requests"`
	PairedAddedP50ms float64 `json:"paired_added_p50_ms"`
	PairedAddedP99ms float64 `json:"paired_added_p99_ms"`
	// Hop is a bare reverse proxy in front of the same backends (see
	// newBareHop), measured in the same rounds as a mode of its own: what one
	// more HTTP hop costs on this machine, whoever makes it. HopAdded is
	// its excess over direct; the router's excess over it (OverHop, per
	// strategy, and the paired figures below) is what routing costs beyond
	// being a proxy at all.
	HopP50ms      float64 `json:"hop_p50_ms"`
	HopP99ms      float64 `json:"hop_p99_ms"`
	HopAddedP50ms float64 `json:"hop_added_p50_ms"`
	HopAddedP99ms float64 `json:"hop_added_p99_ms"`
	// PairedOverHop: each request sent through the bare proxy and through
	// the router at the same instant, the routed copy's excess per pair.
	PairedOverHopP50ms float64            `json:"paired_over_hop_p50_ms"`
	PairedOverHopP99ms float64            `json:"paired_over_hop_p99_ms"`
	Failures           int                `json:"failures"` // every mode's
	ByStrategy         []StrategyOverhead `json:"by_strategy"`
}

// StrategyOverhead is one strategy's latency through the router and what it
// adds to the direct latency of the same rounds.
type StrategyOverhead struct {
	Strategy    balance.Strategy `json:"strategy"`
	RouterP50ms float64          `json:"router_p50_ms"`
	RouterP99ms float64          `json:"router_p99_ms"`
	AddedP50ms  float64          `json:"added_p50_ms"`
	AddedP99ms  float64          `json:"added_p99_ms"`
	// OverHop is the router's latency quantile less the bare proxy's.
	OverHopP50ms float64 `json:"over_hop_p50_ms"`
	OverHopP99ms float64 `json:"over_hop_p99_ms"`
	Failures     int     `json:"failures"`
}

// instantBackend reads the request and answers at once: with no model
// behind it, the difference between direct and routed latency is the
// router's (HTTP hop, body scan, hashing, decision).
func instantBackend() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}]}`)
	})
}

func measureOverhead(ctx context.Context, o *Options) (*OverheadResult, error) {
	sim := o.Sim
	f, err := startFleetWith(ctx, o, o.Backends, 1, balance.PrefixAware, nil, func() (http.Handler, string, error) { return instantBackend(), "", nil })
	if err != nil {
		return nil, err
	}
	defer f.stop()
	rng := rand.New(rand.NewPCG(o.Seed, 0x0e7))
	promptBytes := o.DecisionPrompt
	docs := make([]string, 32)
	for i := range docs {
		docs[i] = lines(rng, promptBytes*3/4/4, 4)
	}
	reqs := make([]Request, 256)
	for i := range reqs {
		body := chatBody(sim.Model, []chatMsg{{"user", docs[rng.IntN(len(docs))] + lines(rng, promptBytes/4/4, 4)}}, 1)
		body = []byte(strings.Replace(string(body), `"stream":true`, `"stream":false`, 1))
		reqs[i] = Request{Path: "/v1/chat/completions", Body: body}
	}
	hop, stopHop, err := serveBareHop(f.simURLs)
	if err != nil {
		return nil, err
	}
	defer stopHop()
	client := newClient()
	defer client.CloseIdleConnections()
	res := &OverheadResult{Rate: o.OverheadRate, PromptBytes: len(reqs[0].Body)}
	// Each round sends direct, through the bare proxy, then through the
	// router once per strategy, switched at run time: the modes see the
	// same machine weather.
	strategies := slices.Clone(o.Strategies)
	if !slices.Contains(strategies, balance.PrefixAware) {
		strategies = append(strategies, balance.PrefixAware)
	}
	toBackend := func(i int) string { return f.simURLs[i%len(f.simURLs)] }
	toHop := func(int) string { return hop }
	toRouter := func(int) string { return f.routers[0].url }
	const direct, bare = -2, -1 // the modes before the strategies
	var directLat, hopLat []float64
	routed := make([][]float64, len(strategies))
	fails := make([]int, len(strategies))
	for round := range o.OverheadRounds + 1 {
		for mode := direct; mode < len(strategies); mode++ {
			target := toRouter
			switch mode {
			case direct:
				target = toBackend
			case bare:
				target = toHop
			default:
				if err := f.routers[0].rt.SetStrategy("", strategies[mode]); err != nil {
					return nil, err
				}
			}
			lat, failed := openLoop(ctx, client, o.OverheadRate, o.OverheadDuration, reqs, target)
			switch {
			case round == 0: // warm-up: connections, caches
			case mode == direct:
				directLat = append(directLat, lat...)
				res.Failures += failed
			case mode == bare:
				hopLat = append(hopLat, lat...)
				res.Failures += failed
			default:
				routed[mode] = append(routed[mode], lat...)
				fails[mode] += failed
			}
		}
	}
	if err := f.routers[0].rt.SetStrategy("", balance.PrefixAware); err != nil {
		return nil, err
	}
	// Paired rounds: each routed copy against a twin sent straight to a
	// backend, then in rounds of their own against a twin through the bare
	// proxy.
	twins := []func(int) string{toBackend, toHop}
	excess := make([][]float64, len(twins))
	for round := range o.OverheadRounds + 1 {
		for k, twin := range twins {
			ex, failed := pairedLoop(ctx, client, o.OverheadRate, o.OverheadDuration, reqs, toRouter, twin)
			if round > 0 { // round 0 warms up, as above
				excess[k] = append(excess[k], ex...)
				res.Failures += failed
			}
		}
	}
	res.PairedRequests = len(excess[0])
	res.PairedAddedP50ms, res.PairedAddedP99ms = quantile(excess[0], 0.5), quantile(excess[0], 0.99)
	res.PairedOverHopP50ms, res.PairedOverHopP99ms = quantile(excess[1], 0.5), quantile(excess[1], 0.99)
	res.Requests = len(directLat)
	res.DirectP50ms, res.DirectP99ms = quantile(directLat, 0.5), quantile(directLat, 0.99)
	res.HopP50ms, res.HopP99ms = quantile(hopLat, 0.5), quantile(hopLat, 0.99)
	res.HopAddedP50ms, res.HopAddedP99ms = res.HopP50ms-res.DirectP50ms, res.HopP99ms-res.DirectP99ms
	for i, st := range strategies {
		so := StrategyOverhead{Strategy: st, RouterP50ms: quantile(routed[i], 0.5), RouterP99ms: quantile(routed[i], 0.99), Failures: fails[i]}
		so.AddedP50ms, so.AddedP99ms = so.RouterP50ms-res.DirectP50ms, so.RouterP99ms-res.DirectP99ms
		so.OverHopP50ms, so.OverHopP99ms = so.RouterP50ms-res.HopP50ms, so.RouterP99ms-res.HopP99ms
		res.ByStrategy = append(res.ByStrategy, so)
		res.Failures += so.Failures
		if st == balance.PrefixAware {
			res.RouterP50ms, res.RouterP99ms, res.AddedP50ms, res.AddedP99ms = so.RouterP50ms, so.RouterP99ms, so.AddedP50ms, so.AddedP99ms
		}
	}
	return res, nil
}

// openLoop sends at a fixed rate regardless of completions and returns
// latencies in milliseconds.
func openLoop(ctx context.Context, c *http.Client, rate int, d time.Duration, reqs []Request, target func(int) string) ([]float64, int) {
	n := int(float64(rate) * d.Seconds())
	lat := make([]float64, n)
	failed := make([]bool, n)
	atRate(ctx, rate, n, func(i int) {
		t := time.Now()
		out := sendReal(ctx, c, target(i), &reqs[i%len(reqs)])
		lat[i] = float64(time.Since(t).Microseconds()) / 1e3
		failed[i] = out.err != nil || out.status != http.StatusOK
	})
	return succeeded(lat, failed)
}

// pairedLoop is openLoop sending each request twice at its tick, to
// subject(i) and to twin(i), each copy on its own connection; it returns,
// in milliseconds, how much longer each subject copy took than its twin
// (pairs where both succeeded), and the failed pairs.
func pairedLoop(ctx context.Context, c *http.Client, rate int, d time.Duration, reqs []Request, subject, twin func(int) string) ([]float64, int) {
	n := int(float64(rate) * d.Seconds())
	excess := make([]float64, n)
	failed := make([]bool, n)
	atRate(ctx, rate, n, func(i int) {
		var lat [2]time.Duration
		var bad [2]bool
		send := func(k int, target string) {
			t := time.Now()
			out := sendReal(ctx, c, target, &reqs[i%len(reqs)])
			lat[k] = time.Since(t)
			bad[k] = out.err != nil || out.status != http.StatusOK
		}
		var wg sync.WaitGroup
		wg.Go(func() { send(0, twin(i)) })
		send(1, subject(i))
		wg.Wait()
		excess[i] = float64((lat[1] - lat[0]).Microseconds()) / 1e3
		failed[i] = bad[0] || bad[1]
	})
	return succeeded(excess, failed)
}

// atRate calls send(i) for i in [0, n), each on its own goroutine, at rate
// per second whatever the completions (an open loop), and waits for all.
func atRate(ctx context.Context, rate, n int, send func(i int)) {
	interval := time.Second / time.Duration(rate)
	sendAt(ctx, n, func(i int) time.Duration { return time.Duration(i) * interval }, send)
}

// sendAt calls send(i) for i in [0, n), each on its own goroutine, at(i)
// after the start in wall time, whether or not the calls before it have
// returned (an open loop), and waits for all. It stops sending when ctx
// ends, and returns how late each call left (the machine keeping up or
// not), in seconds: one per call made, so len(lags) calls were made.
func sendAt(ctx context.Context, n int, at func(i int) time.Duration, send func(i int)) (lags []float64) {
	lags = make([]float64, 0, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range n {
		due := start.Add(at(i))
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			return lags
		}
		lags = append(lags, max(time.Since(due), 0).Seconds())
		wg.Go(func() { send(i) })
	}
	return lags
}

// succeeded returns the values whose request did not fail, and how many
// failed.
func succeeded(vals []float64, failed []bool) ([]float64, int) {
	var ok []float64
	fails := 0
	for i, v := range vals {
		if failed[i] {
			fails++
			continue
		}
		ok = append(ok, v)
	}
	return ok, fails
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		return -1
	}
	return f
}
