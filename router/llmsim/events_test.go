package llmsim

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/router/kvevents"
)

// sink keeps the batches a simulator publishes, in order.
type sink struct{ batches [][]kvevents.Event }

func (s *sink) Publish(evs []kvevents.Event) error {
	s.batches = append(s.batches, evs)
	return nil
}

func tokenPrompt(ids []uint32) string {
	b, _ := json.Marshal(map[string]any{"model": "sim", "prompt": ids, "max_tokens": 1})
	return string(b)
}

// A token-id prompt's blocks are published with llm-d's hashes (the ones
// the router computes), and the blocks evicted to make room are published
// as removed: an index fed by the events holds exactly what the cache does.
func TestPublishesKVEvents(t *testing.T) {
	events := &sink{}
	s := testServer(t, func(c *Config) {
		c.KVBlocks, c.BlockTokens, c.HashSeed, c.Events = 8, 4, "s", events
		c.PrefillPerToken, c.DecodePerToken = 0, 0
	})
	x := kvevents.NewIndex(kvevents.DefaultLimits(), time.Hour, nil)
	apply := func() {
		for _, b := range events.batches {
			seq := x.Stats("sim").Seq + 1
			x.Apply("sim", seq, kvevents.Batch{Events: b})
		}
		events.batches = nil
	}
	a := make([]uint32, 4*4+2) // 4 full blocks and a partial one
	for i := range a {
		a[i] = uint32(i)
	}
	if r := do(s, "/v1/completions", tokenPrompt(a)); r.code != 200 {
		t.Fatalf("completion: %d %s", r.code, r.body)
	}
	apply()
	chainA := kvevents.LLMDChain("s", "sim", a, 4)
	if n, ok := x.Match("sim", chainA); !ok || n != 4 {
		t.Fatalf("Match(A) = %d, %v; want 4 blocks, trusted", n, ok)
	}
	// A second prompt sharing two blocks stores only its new ones, with
	// the shared block as their parent.
	b := append(slices.Clone(a[:8]), 100, 101, 102, 103, 104, 105, 106, 107)
	if r := do(s, "/v1/completions", tokenPrompt(b)); r.code != 200 || r.cached != 8 {
		t.Fatalf("completion: %d, cached %d: %s", r.code, r.cached, r.body)
	}
	chainB := kvevents.LLMDChain("s", "sim", b, 4)
	if ev := events.batches[len(events.batches)-1]; ev[len(ev)-1].Parent != chainB[1] || !slices.Equal(ev[len(ev)-1].Hashes, chainB[2:]) {
		t.Fatalf("stored event %+v, want blocks %x after %x", ev, chainB[2:], chainB[1])
	}
	apply()
	// The cache holds 8 blocks: A's 4 and B's 2 new ones (6), plus the
	// partial tail and output blocks while running. A third unrelated
	// prompt of 4 blocks evicts A's tail.
	c := make([]uint32, 16)
	for i := range c {
		c[i] = uint32(1000 + i)
	}
	if r := do(s, "/v1/completions", tokenPrompt(c)); r.code != 200 {
		t.Fatalf("completion: %d %s", r.code, r.body)
	}
	apply()
	held := 0
	for _, h := range append(append(slices.Clone(chainA), chainB[2:]...), kvevents.LLMDChain("s", "sim", c, 4)...) {
		inIndex := x.Holds("sim", h)
		s.mu.Lock()
		_, inCache := s.kv.blocks[h]
		s.mu.Unlock()
		if inIndex != inCache {
			t.Fatalf("block %x: index %v, cache %v", h, inIndex, inCache)
		}
		if inCache {
			held++
		}
	}
	if st := x.Stats("sim"); st.Removed == 0 || held > 8 {
		t.Fatalf("stats %+v, %d held: want evictions published", st, held)
	}
}
