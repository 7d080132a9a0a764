package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/oai"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// EngineInferenceSim is Options.Engine for llm-d-inference-sim backends.
const EngineInferenceSim = "llm-d-inference-sim"

// runEngine replays w (prepared by engineWorkload) through one router to
// llm-d-inference-sim processes (an engine nobody here wrote, with its own
// prefix cache and KV events) in wall time: each request at its arrival
// time (open loop, the offered load engineWorkload set), or with
// EngineClients set, from that many clients each sending the next as soon
// as its previous one ended. The hit rate is the engines' own
// (vllm:prefix_cache_hits over queries); TTFTs are wall seconds to the
// first byte through the router.
func runEngine(ctx context.Context, o *Options, w *Workload, st balance.Strategy) (StrategyResult, error) {
	sr := StrategyResult{Strategy: st}
	began := time.Now()
	selfCPU0, simCPU0 := cpuSeconds()
	var sims []*testenv.InferenceSim
	// Stopped before the CPU count below too; Stop is idempotent.
	defer func() {
		for _, sim := range sims {
			sim.Stop()
		}
	}()
	cfg := o.routerConfig()
	cfg.Strategy = st
	cfg.ProbeInterval, cfg.RampUp, cfg.QueueTimeout = -1, 0, time.Minute
	// The simulator's hashes need a seed given on its command line (an
	// empty one leaves it to PYTHONHASHSEED): the same one for the router.
	seed := cmp.Or(o.Sim.HashSeed, "0")
	cfg.KVBlockSize, cfg.KVHashSeed = o.Sim.BlockTokens, seed
	cfg.KVResync = 200 * time.Millisecond // the warm-up below waits it out
	cfg.DebugHeader = true                // each answer names its backend: per-backend TTFTs
	var urls []string
	for range o.Backends {
		ev, err := freePort()
		if err != nil {
			return sr, err
		}
		sim, err := testenv.LaunchInferenceSim(ctx, testenv.InferenceSimOptions{Model: o.Sim.Model, EventsEndpoint: "tcp://" + ev,
			BlockSize: o.Sim.BlockTokens, CacheBlocks: o.Sim.KVBlocks, HashSeed: seed, MaxModelLen: o.Sim.KVBlocks * o.Sim.BlockTokens,
			// The same latency model as llmsim's, so a cached prompt token
			// is cheaper than an uncached one and a busy engine slower.
			PrefillPerToken: o.Sim.PrefillPerToken, InterTokenLatency: o.Sim.DecodePerToken, MaxNumSeqs: o.Sim.MaxSeqs,
			LoadFactor: o.EngineLoadFactor, Random: true})
		if err != nil {
			return sr, fmt.Errorf("bench: %w", err)
		}
		sims = append(sims, sim)
		urls = append(urls, sim.URL)
		bc := router.BackendConfig{URL: sim.URL, KVCacheTokens: o.Sim.KVBlocks * o.Sim.BlockTokens}
		if o.KVEvents {
			bc.KVEvents = "bind:tcp://" + ev
		}
		cfg.Backends = append(cfg.Backends, bc)
	}
	reg := prometheus.NewRegistry()
	rt, err := router.New(cfg, router.Options{Source: router.NewStaticSource(router.StaticEndpoints(&cfg), nil), Registry: reg,
		HashKey: prefix.KeyFromBytes([]byte("bench")), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return sr, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = rt.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	u, stopServe, err := serve(rt)
	if err != nil {
		return sr, err
	}
	defer stopServe()
	client := newClient()
	defer client.CloseIdleConnections()
	if o.KVEvents {
		if err := warmUp(ctx, client, rt, urls, o); err != nil {
			return sr, err
		}
	}
	before, err := scrape(ctx, client, urls)
	if err != nil {
		return sr, err
	}
	sent := time.Now()
	var outs []outcome
	if o.EngineClients > 0 {
		outs = closedWall(ctx, client, u, w.Requests, o.EngineClients)
	} else {
		var lags []float64
		outs, lags = openWall(ctx, client, u, w.Requests)
		sr.SendLagP99 = quantile(lags, 0.99)
	}
	sentFor := time.Since(sent)
	ttfts := tally(&sr, outs)
	if o.RequestsOut != nil {
		if err := writeRequests(o.RequestsOut, w.Name, &sr, urls, w.Requests, outs); err != nil {
			return sr, err
		}
	}
	index := map[string]int{}
	for i, u := range urls {
		index[u] = i
	}
	sr.ByBackend = make([]BackendResult, len(urls))
	perBackend := make([][]float64, len(urls))
	for i, t := range sr.ByRequest {
		if b, ok := index[outs[i].backend]; ok && !math.IsNaN(t) {
			perBackend[b] = append(perBackend[b], t)
		}
	}
	// The simulator updates its metrics asynchronously: wait until they
	// count every request answered.
	var diff simStats
	for settle := time.Now().Add(30 * time.Second); ; {
		after, err := scrape(ctx, client, urls)
		if err != nil {
			return sr, err
		}
		diff = after.minus(before)
		total := 0.0
		for _, n := range diff.requests {
			total += n
		}
		if int(total) >= len(ttfts) || time.Now().After(settle) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sr.TTFTp50, sr.TTFTp90, sr.TTFTp95, sr.TTFTp99 = quantile(ttfts, 0.5), quantile(ttfts, 0.9), quantile(ttfts, 0.95), quantile(ttfts, 0.99)
	sr.TTFTs = ttfts
	sr.HitRate, sr.BusiestShare, sr.BusiestWork = diff.hitRate(), busiest(diff.requests), busiest(diff.computed())
	for i := range sr.ByBackend {
		b := &sr.ByBackend[i]
		b.Requests, b.TTFTp50, b.TTFTp99 = diff.requests[i], quantile(perBackend[i], 0.5), quantile(perBackend[i], 0.99)
		b.OutputTokens = diff.generated[i]
		if diff.queries[i] > 0 {
			b.HitRate = diff.hits[i] / diff.queries[i]
		}
	}
	sr.Reasons = reasons(reg)
	learned(&sr, rt)
	sr.OpenThroughput = float64(len(ttfts)) / sentFor.Seconds()
	for _, sim := range sims {
		sim.Stop()
	}
	wall := time.Since(began)
	sr.WallSeconds = wall.Seconds()
	selfCPU, simCPU := cpuSeconds()
	sr.BenchCPU, sr.EngineCPU = (selfCPU-selfCPU0)/wall.Seconds(), (simCPU-simCPU0)/wall.Seconds()
	return sr, nil
}

// cpuSeconds is the CPU time this process (router, clients, bench) and its
// waited-for children (the simulators, once stopped) have used.
func cpuSeconds() (self, children float64) {
	sec := func(who int) float64 {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) != nil {
			return 0
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return sec(syscall.RUSAGE_SELF), sec(syscall.RUSAGE_CHILDREN)
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// warmUp sends each engine fresh prompts directly until the router follows
// its events and trusts them: an engine's ZMQ dialer connects in the
// background and drops what it publishes before.
func warmUp(ctx context.Context, c *http.Client, rt *router.Router, urls []string, o *Options) error {
	deadline := time.Now().Add(time.Minute)
	for i, u := range urls {
		for n := 0; !rt.KVStats(u).Trusted; n++ {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("bench: the router never trusted %s's KV events: %+v", u, rt.KVStats(u))
			}
			if rt.KVStats(u).Batches > 0 {
				time.Sleep(10 * time.Millisecond) // the resync window
				continue
			}
			ids := make([]uint32, o.Sim.BlockTokens)
			for j := range ids {
				ids[j] = uint32(4_000_000_000 - (i*100000+n)*len(ids) - j)
			}
			body, _ := json.Marshal(map[string]any{"model": o.Sim.Model, "prompt": ids, "max_tokens": 1})
			resp, err := c.Post(u+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				return fmt.Errorf("bench: warm-up: %w", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			time.Sleep(20 * time.Millisecond) // the engine batches its events
		}
	}
	return nil
}

// openWall sends each request at its arrival time (At after the start),
// in wall time, whether or not the answers before it have come: an open
// loop, so a slow backend queues requests instead of slowing the arrivals.
// lags are how late each request left (the machine keeping up or not).
func openWall(ctx context.Context, c *http.Client, base string, reqs []Request) (outs []outcome, lags []float64) {
	outs = make([]outcome, len(reqs))
	lags = sendAt(ctx, len(reqs), func(i int) time.Duration { return reqs[i].At }, func(i int) {
		outs[i] = sendWall(ctx, c, base, &reqs[i])
	})
	for i := len(lags); i < len(reqs); i++ {
		outs[i] = outcome{err: context.Cause(ctx)}
	}
	return outs, lags
}

// closedWall sends reqs in order from clients goroutines, in wall time.
func closedWall(ctx context.Context, c *http.Client, base string, reqs []Request, clients int) []outcome {
	outs := make([]outcome, len(reqs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for i := range next {
				outs[i] = sendWall(ctx, c, base, &reqs[i])
			}
		})
	}
	for i := range reqs {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return outs
}

func sendWall(ctx context.Context, c *http.Client, base string, r *Request) outcome {
	start := time.Now()
	resp, err := post(ctx, c, base, r, true)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	out := routedOutcome(resp)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 && out.ttft == 0 {
			out.ttft = max(time.Since(start), time.Nanosecond)
			// The simulator streams some refusals with status 200.
			if bytes.HasPrefix(buf[:n], []byte(`data: {"error"`)) {
				out.err = fmt.Errorf("refused: %.200s", buf[:n])
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && out.err == nil {
				out.err = err
			}
			out.end = time.Now()
			return out
		}
	}
}

// engineTokenRE is llm-d-inference-sim's simulated tokenizer (v0.10.2,
// pkg/tokenizer, what --force-dummy-tokenizer selects): a token is a word
// or one punctuation mark, with the whitespace after it.
var engineTokenRE = regexp.MustCompile(`(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)`)

// engineTokens is the prompt length the simulator computes for r: its ids
// when the prompt is token ids, else its tokenizer's count of the prompt
// or of the messages' contents (the few tokens of its chat template left
// out).
func engineTokens(r *Request) (int, error) {
	req, err := oai.Scan(r.Body)
	if err != nil {
		return 0, err
	}
	if ids, ok := oai.TokenIDs(req.Prompt, nil); ok && !req.HasMessages {
		return len(ids), nil
	}
	if !req.HasMessages {
		return len(engineTokenRE.FindAllIndex(req.Prompt, -1)), nil
	}
	n := 0
	for _, m := range req.Messages {
		n += len(engineTokenRE.FindAllIndex(m.Content, -1))
	}
	return n, nil
}

// engineCapacity is what the llm-d-inference-sim fleet completes per second
// with nothing cached: every sequence slot (Sim.MaxSeqs per backend) busy,
// each request holding one for its prefill (every prompt token) and its
// decode (max_tokens, the first token coming with the prefill), both
// slowed by the engine's full-load factor. The simulator prefills each
// request on its own clock, so slots, not a shared prefill stream as in
// llmsim, are what fills up: this is the engines' analogue of the virtual
// bench's prefill capacity.
func engineCapacity(o *Options, w *Workload) (float64, error) {
	return slotCapacity(o, w, engineTokens)
}

// slotCapacity is engineCapacity with each request's prompt tokens counted
// by tokens: llmsim prefilling side by side (Sim.SideBySide) fills its
// slots as llm-d-inference-sim does.
func slotCapacity(o *Options, w *Workload, tokens func(*Request) (int, error)) (float64, error) {
	if len(w.Requests) == 0 {
		return 0, errors.New("bench: no requests")
	}
	slot := 0.0
	for i := range w.Requests {
		r := &w.Requests[i]
		p, err := tokens(r)
		if err != nil {
			return 0, fmt.Errorf("bench: %s request %d: %w", w.Name, i, err)
		}
		slot += float64(p)*o.Sim.PrefillPerToken.Seconds() + float64(max(r.OutTokens-1, 0))*o.Sim.DecodePerToken.Seconds()
	}
	mean := slot / float64(len(w.Requests)) * o.EngineLoadFactor
	if mean <= 0 {
		return 0, errors.New("bench: the engines' latency model is zero (prefill and decode per token): their capacity is unbounded")
	}
	return float64(o.Backends*o.Sim.MaxSeqs) / mean, nil
}

// engineWorkload readies w for llm-d-inference-sim: every request asks for
// exactly its max_tokens (ignore_eos; the simulator answers in random mode,
// since an echo is as long as the prompt's last message whatever
// max_tokens says), and, for the open loop, arrivals at o.Load x the
// engines' capacity. It returns the capacity.
func engineWorkload(o *Options, w *Workload) (float64, error) {
	for i := range w.Requests {
		r := &w.Requests[i]
		body := bytes.TrimRight(r.Body, " \t\r\n")
		if len(body) < 2 || body[0] != '{' || body[len(body)-1] != '}' || bytes.Equal(body, []byte("{}")) {
			return 0, fmt.Errorf("bench: %s request %d: the body is not a JSON object with fields", w.Name, i)
		}
		r.Body = append(append(slices.Clip(body[:len(body)-1]), `,"ignore_eos":true`...), '}')
	}
	capacity, err := engineCapacity(o, w)
	if err != nil {
		return 0, err
	}
	if o.EngineClients == 0 {
		w.ScheduleRate(o.Load*capacity, o.Seed)
	}
	return capacity, nil
}
