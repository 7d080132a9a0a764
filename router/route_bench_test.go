package router

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/kvevents"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// BenchmarkRoute64x16k: the whole routing decision (scan, hash, match,
// decide, index update) with 64 backends and 16k-character prompts that
// share long documents, per strategy.
func BenchmarkRoute64x16k(b *testing.B) {
	for _, st := range balance.Strategies() {
		b.Run("strategy="+string(st), func(b *testing.B) { benchRoute(b, st) })
	}
}

func benchRoute(b *testing.B, st balance.Strategy) {
	cfg := Defaults()
	cfg.Strategy = st
	cfg.ProbeInterval = -1
	for i := range 64 {
		cfg.Backends = append(cfg.Backends, BackendConfig{URL: fmt.Sprintf("http://127.0.0.1:%d", 30000+i)})
	}
	rt, err := New(cfg, Options{Source: NewStaticSource(StaticEndpoints(&cfg), nil), HashKey: prefix.KeyFromBytes([]byte("k"))})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Lines of letters, as documents and code come: each line ends in an
	// escaped newline the scanner must decode.
	letters := func(n int) string {
		s := make([]byte, 0, n)
		for len(s) < n {
			if len(s)%70 >= 68 {
				s = append(s, `\n`...)
				continue
			}
			s = append(s, byte('a'+rng.IntN(26)))
		}
		return string(s)
	}
	docs := make([]string, 256)
	for i := range docs {
		docs[i] = letters(12000)
	}
	bodies := make([][]byte, 512)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"%s%s"}]}`,
			docs[rng.IntN(len(docs))], letters(4000))
	}
	ctx := context.Background()
	for _, body := range bodies {
		if _, err := rt.Route(ctx, body, ""); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(bodies[0])))
	timeDecisions(b, rt, bodies)
}

// BenchmarkRouteKV64x4k is BenchmarkRoute64x16k's decision for token-id
// prompts of 4,000 tokens (16k characters at 4 per token) with every
// backend publishing KV events: the engine's block hashes are computed and
// each backend's exact view matched. Documents are held by two backends
// each, as their engines reported.
func BenchmarkRouteKV64x4k(b *testing.B) {
	rt, cfg := kvRouter(b, 64)
	rng := rand.New(rand.NewPCG(1, 2))
	ids := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = rng.Uint32N(150000)
		}
		return out
	}
	docs := make([][]uint32, 256)
	for i := range docs {
		docs[i] = ids(3000)
		chain := kvevents.LLMDChain(cfg.KVHashSeed, "m", docs[i], cfg.KVBlockSize)
		for _, be := range []int{i % 64, (i + 7) % 64} {
			u := cfg.Backends[be].URL
			seq := rt.kv.index.Stats(u).Seq + 1
			rt.kv.index.Apply(u, seq, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: chain, BlockSize: cfg.KVBlockSize}}})
		}
	}
	bodies := make([][]byte, 512)
	for i := range bodies {
		p := append(slices.Clone(docs[rng.IntN(len(docs))]), ids(1000)...)
		bodies[i], _ = json.Marshal(map[string]any{"model": "m", "stream": true, "prompt": p})
	}
	ctx := context.Background()
	hits := 0
	for _, body := range bodies {
		got, err := rt.Route(ctx, body, "")
		if err != nil {
			b.Fatal(err)
		}
		if got.Matched > 0 {
			hits++
		}
	}
	if hits < len(bodies)/2 { // the rest go elsewhere for balance
		b.Fatalf("%d of %d routes matched a reported document", hits, len(bodies))
	}
	b.SetBytes(int64(len(bodies[0])))
	timeDecisions(b, rt, bodies)
}

// timeDecisions routes bodies in turn for the benchmark's loop and reports,
// beside the mean, the median and 99th percentile of a decision's time
// (the goal's figure is a p99): each decision is timed into 100 ns buckets
// made before the loop, so the timing allocates nothing in it.
func timeDecisions(b *testing.B, rt *Router, bodies [][]byte) {
	const bucket = 100 * time.Nanosecond
	hist := make([]int, 200000) // to 20 ms; the last bucket takes anything longer
	ctx := context.Background()
	n := 0
	for b.Loop() {
		start := time.Now()
		if _, err := rt.Route(ctx, bodies[n%len(bodies)], ""); err != nil {
			b.Fatal(err)
		}
		hist[min(int(time.Since(start)/bucket), len(hist)-1)]++
		n++
	}
	quantile := func(q float64) float64 {
		rank, seen := int(math.Ceil(q*float64(n))), 0
		for i, c := range hist {
			if seen += c; seen >= rank {
				return float64(time.Duration(i+1)*bucket) / float64(time.Microsecond)
			}
		}
		return math.Inf(1)
	}
	b.ReportMetric(quantile(0.5), "p50-us")
	b.ReportMetric(quantile(0.99), "p99-us")
}

// kvRouter is a router over n backends that each name a KV event address;
// it is not run, so nothing connects, and tests feed its exact index
// themselves (rt.kv.index.Apply).
func kvRouter(tb testing.TB, n int) (*Router, Config) {
	cfg := Defaults()
	cfg.ProbeInterval = -1
	for i := range n {
		cfg.Backends = append(cfg.Backends, BackendConfig{URL: fmt.Sprintf("http://127.0.0.1:%d", 30000+i), KVEvents: fmt.Sprintf("tcp://127.0.0.1:%d", 40000+i)})
	}
	rt, err := New(cfg, Options{Source: NewStaticSource(StaticEndpoints(&cfg), nil), HashKey: prefix.KeyFromBytes([]byte("k"))})
	if err != nil {
		tb.Fatal(err)
	}
	return rt, cfg
}
