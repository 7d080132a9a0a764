package kvevents

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func complete(t *testing.T, url, model string, prompt []uint32) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s: %s", resp.Status, out)
	}
}

// connect sends fresh prompts until a batch of events arrives: the
// simulator's ZMQ dialer connects in the background, and what it publishes
// before that is lost (and a prompt whose blocks are cached already stores
// nothing new, so resending it would not help).
func connect(t *testing.T, x *Index, backend string, sim *testenv.InferenceSim, blockSize int) {
	t.Helper()
	before := x.Stats(backend).Batches
	i := 0
	wait.For(t, "first batch from the simulator", func() bool {
		if x.Stats(backend).Batches > before {
			return true
		}
		i++
		complete(t, sim.URL, sim.Model, tokens(100000+i*blockSize, blockSize))
		return false
	}, wait.Timeout(30*time.Second))
}

func holdsAll(x *Index, backend string, chain []uint64) bool {
	for _, h := range chain {
		if !x.Holds(backend, h) {
			return false
		}
	}
	return true
}

func tokens(from, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(from + i)
	}
	return p
}

// A real engine (llm-d-inference-sim) publishes the blocks of token-id
// prompts; the index must hold exactly the hashes the engine computes for
// them, in both of vLLM's encodings, and a restart of the engine (its
// sequence starting over) must clear what the old one held.
func TestInferenceSimEvents(t *testing.T) {
	const (
		model     = "kv-test-model"
		seed      = "42"
		blockSize = 8
		backend   = "http://sim"
	)
	if _, err := testenv.InferenceSimPath(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	x := NewIndex(DefaultLimits(), time.Hour, nil)
	sub := &Subscriber{Backend: backend, Endpoint: "tcp://127.0.0.1:0", Listen: true, Topic: "kv@127.0.0.1@" + model, Index: x, MinBackoff: 10 * time.Millisecond}
	startSubscriber(t, sub)
	wait.For(t, "subscriber bound", func() bool { return sub.Addr() != "" })
	opts := testenv.InferenceSimOptions{
		Model: model, EventsEndpoint: "tcp://" + sub.Addr(), BlockSize: blockSize, CacheBlocks: 64, HashSeed: seed,
	}

	sim := testenv.StartInferenceSim(t, opts)
	connect(t, x, backend, sim, blockSize)
	promptA := tokens(1000, 4*blockSize+3) // 4 full blocks and a partial one
	chainA := LLMDChain(seed, model, promptA, blockSize)
	complete(t, sim.URL, model, promptA)
	wait.For(t, "prompt A's blocks indexed", func() bool { return holdsAll(x, backend, chainA) })
	// Whether the view is trusted depends on having seen batch 1; the
	// hashes are exact either way.
	t.Logf("after prompt A: %+v", x.Stats(backend))

	// A second prompt sharing prompt A's first two blocks adds two.
	before := x.Stats(backend).Blocks
	promptB := append(append([]uint32{}, promptA[:2*blockSize]...), tokens(5000, 2*blockSize)...)
	chainB := LLMDChain(seed, model, promptB, blockSize)
	if chainB[1] != chainA[1] || chainB[2] == chainA[2] {
		t.Fatal("chains do not share exactly two blocks")
	}
	complete(t, sim.URL, model, promptB)
	wait.For(t, "prompt B's blocks", func() bool { return holdsAll(x, backend, chainB) })
	if s := x.Stats(backend); s.Gaps != 0 || s.Blocks != before+2 {
		t.Fatalf("stats %+v, want no gaps and %d blocks", s, before+2)
	}

	// Restart the engine, now with the map encoding. The lost stream and
	// the sequence starting over must clear the old engine's blocks.
	sim.Stop()
	opts.MapEvents = true
	sim2 := testenv.StartInferenceSim(t, opts)
	connect(t, x, backend, sim2, blockSize)
	promptC := tokens(9000, 2*blockSize)
	chainC := LLMDChain(seed, model, promptC, blockSize)
	complete(t, sim2.URL, model, promptC)
	wait.For(t, "restarted engine's blocks indexed", func() bool { return holdsAll(x, backend, chainC) })
	s := x.Stats(backend)
	t.Logf("after the restart: %+v", s)
	for _, h := range append(chainA, chainB...) {
		if x.Holds(backend, h) {
			t.Fatalf("block %x of the old engine still indexed after its restart: %+v", h, s)
		}
	}
	if n, ok := x.Match(backend, chainC); ok && n != len(chainC) {
		t.Fatalf("Match = %d, want %d", n, len(chainC))
	}
}
