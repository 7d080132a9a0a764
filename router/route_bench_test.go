package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/warmfleet/warmfleet/router/balance"
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
	i := 0
	for b.Loop() {
		if _, err := rt.Route(ctx, bodies[i%len(bodies)], ""); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
