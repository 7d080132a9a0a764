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
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// EngineInferenceSim is Options.Engine for llm-d-inference-sim backends.
const EngineInferenceSim = "llm-d-inference-sim"

// runEngine replays w through one router to llm-d-inference-sim processes
// (an engine nobody here wrote, with its own prefix cache and KV events) in
// wall time: EngineClients clients send the requests in order, each the
// next as soon as its previous one ended. The hit rate is the engines' own
// (vllm:prefix_cache_hits over queries); TTFTs are wall seconds to the
// first byte through the router.
func runEngine(ctx context.Context, o *Options, w *Workload, st balance.Strategy) (StrategyResult, error) {
	sr := StrategyResult{Strategy: st}
	began := time.Now()
	cfg := o.routerConfig()
	cfg.Strategy = st
	cfg.ProbeInterval, cfg.RampUp, cfg.QueueTimeout = -1, 0, time.Minute
	// The simulator's hashes need a seed given on its command line (an
	// empty one leaves it to PYTHONHASHSEED): the same one for the router.
	seed := cmp.Or(o.Sim.HashSeed, "0")
	cfg.KVBlockSize, cfg.KVHashSeed = o.Sim.BlockTokens, seed
	cfg.KVResync = 200 * time.Millisecond // the warm-up below waits it out
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
			LoadFactor: o.EngineLoadFactor})
		if err != nil {
			return sr, fmt.Errorf("bench: %w", err)
		}
		defer sim.Stop()
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
	outs := closedWall(ctx, client, u, w.Requests, max(o.EngineClients, 1))
	var ttfts []float64
	for _, out := range outs {
		switch {
		case out.err != nil || out.status != http.StatusOK && out.status != http.StatusTooManyRequests && out.status != http.StatusServiceUnavailable:
			sr.Errors++
		case out.status == http.StatusTooManyRequests:
			sr.Rejected429++
		case out.status == http.StatusServiceUnavailable:
			sr.Rejected503++
		default:
			ttfts = append(ttfts, out.ttft.Seconds())
		}
	}
	wall := time.Since(began)
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
	sr.Reasons = reasons(reg)
	sr.WallSeconds = wall.Seconds()
	sr.OpenThroughput = float64(len(ttfts)) / wall.Seconds()
	return sr, nil
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
	resp, err := post(ctx, c, base, r)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	out := outcome{status: resp.StatusCode}
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
