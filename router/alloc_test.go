package router

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/router/kvevents"
)

// TestRouteAllocatesNothing: a decision, scan to index update, allocates
// nothing once the index holds the prompts' blocks, for a chat prompt and
// for a token-id prompt scored by KV events: garbage per request is what
// the collector's pauses and assists come back for at high rates.
func TestRouteAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	rt, cfg := kvRouter(t, 8)
	tokens := make([]uint32, 1000)
	for i := range tokens {
		tokens[i] = uint32(i * 7919 % 150000)
	}
	for i := range cfg.Backends[:2] {
		u := cfg.Backends[i].URL
		rt.kv.index.Apply(u, 1, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored,
			Hashes: kvevents.LLMDChain(cfg.KVHashSeed, "m", tokens, cfg.KVBlockSize), BlockSize: cfg.KVBlockSize}}})
	}
	chat := fmt.Appendf(nil, `{"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"%s"}]}`,
		strings.Repeat(`a line of text\n`, 300))
	ids, _ := json.Marshal(map[string]any{"model": "m", "prompt": tokens})
	ctx := context.Background()
	// Token ids first: the first one must hit the event views; the same
	// prompt again soon overflows the traffic-share bound, which is a
	// decision too.
	for _, tc := range []struct {
		name string
		body []byte
	}{{"token ids", ids}, {"chat", chat}} {
		name, body := tc.name, tc.body
		exact := name == "token ids"
		for i := range 3 { // the index learns the blocks; pools fill
			got, err := rt.Route(ctx, body, "")
			if err != nil || i == 0 && exact && got.Matched == 0 {
				t.Fatalf("%s: %+v, %v", name, got, err)
			}
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = rt.Route(ctx, body, "") }); n != 0 {
			t.Errorf("%s: %v allocations per decision", name, n)
		}
	}
	if s := rt.kv.index.Stats(cfg.Backends[0].URL); !s.Trusted {
		t.Fatalf("the first backend's event view is not trusted: %+v", s)
	}
}
