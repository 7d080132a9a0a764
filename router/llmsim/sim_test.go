package llmsim

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func testServer(t *testing.T, mod func(*Config)) *Server {
	t.Helper()
	cfg := Defaults()
	cfg.PrefillPerToken = time.Millisecond
	cfg.DecodePerToken = 10 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type result struct {
	code    int
	elapsed time.Duration
	cached  int
	body    string
}

func do(s *Server, path, body string) result {
	start := time.Now()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	res := result{code: rec.Code, elapsed: time.Since(start), body: rec.Body.String()}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	res.cached = out.Usage.Details.Cached
	return res
}

func prompt(text string, maxTokens int) string {
	return `{"model":"sim","prompt":"` + text + `","max_tokens":` + itoa(maxTokens) + `}`
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestPrefillAndPrefixCache: TTFT is prefill time per uncached token; a
// repeated prompt reuses its full blocks.
func TestPrefillAndPrefixCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := testServer(t, nil)
		text := strings.Repeat("abcd", 100) // 100 tokens: 6 full blocks of 16
		first := do(s, "/v1/completions", prompt(text, 1))
		if first.code != 200 || first.elapsed != 100*time.Millisecond || first.cached != 0 {
			t.Fatalf("first: %+v", first)
		}
		second := do(s, "/v1/completions", prompt(text, 1))
		if second.cached != 96 || second.elapsed != 4*time.Millisecond {
			t.Fatalf("second: %+v", second)
		}
		third := do(s, "/v1/completions", prompt(text, 3)) // decode adds 2 x 10ms
		if third.elapsed != 24*time.Millisecond {
			t.Fatalf("decode: %+v", third)
		}
		if h := testutil.ToFloat64(s.m.hits); h != 192 {
			t.Fatalf("hits %v", h)
		}
		if q := testutil.ToFloat64(s.m.queries); q != 300 {
			t.Fatalf("queries %v", q)
		}
	})
}

// TestQueueing: with one sequence slot the second request waits for the
// first; with two slots prefill is still one stream, so TTFTs add up.
func TestQueueing(t *testing.T) {
	for _, tc := range []struct {
		seqs int
		want [2]time.Duration
	}{
		{1, [2]time.Duration{100*time.Millisecond + 40*time.Millisecond, 280 * time.Millisecond}},
		{2, [2]time.Duration{140 * time.Millisecond, 240 * time.Millisecond}},
	} {
		synctest.Test(t, func(t *testing.T) {
			s := testServer(t, func(c *Config) { c.MaxSeqs = tc.seqs })
			var wg sync.WaitGroup
			res := make([]result, 2)
			for i := range 2 {
				wg.Go(func() { res[i] = do(s, "/v1/completions", prompt(strings.Repeat(string(rune('a'+i)), 400), 5)) })
				synctest.Wait() // the first is admitted before the second arrives
			}
			wg.Wait()
			for i := range res {
				if res[i].elapsed != tc.want[i] {
					t.Fatalf("seqs %d request %d took %v, want %v", tc.seqs, i, res[i].elapsed, tc.want[i])
				}
			}
		})
	}
}

// TestAdmittedTogetherPrefillInOrder: requests waiting for KV room that
// one finish admits together prefill in arrival order, whatever order
// their goroutines wake in (the bench's virtual-time runs replay alike
// only so). Repeated because the wrong order shows up only when the
// scheduler wakes the later request first.
func TestAdmittedTogetherPrefillInOrder(t *testing.T) {
	for range 10 {
		synctest.Test(t, func(t *testing.T) {
			s := testServer(t, func(c *Config) { c.KVBlocks = 10 })
			// a: 6 prompt blocks and 1 for its output, 96 ms of prefill and
			// 40 of decode; b (4 blocks) does not fit beside it, and c (3)
			// queues behind b. a's end admits both at 136 ms.
			bodies := []string{prompt(strings.Repeat("a", 64*6), 5), prompt(strings.Repeat("b", 64*3), 5), prompt(strings.Repeat("c", 64*2), 5)}
			var wg sync.WaitGroup
			res := make([]result, len(bodies))
			for i, body := range bodies {
				wg.Go(func() { res[i] = do(s, "/v1/completions", body) })
				synctest.Wait()
			}
			wg.Wait()
			// b prefills 48 ms from 136, c its 32 ms after b's.
			want := []time.Duration{136 * time.Millisecond, 224 * time.Millisecond, 256 * time.Millisecond}
			for i := range res {
				if res[i].code != http.StatusOK || res[i].elapsed != want[i] {
					t.Fatalf("request %c: status %d after %v, want 200 after %v", 'a'+i, res[i].code, res[i].elapsed, want[i])
				}
			}
		})
	}
}

// TestEviction: a small cache evicts the least recently used prefix.
func TestEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := testServer(t, func(c *Config) { c.KVBlocks = 10 })
		a, b := strings.Repeat("a", 64*6), strings.Repeat("b", 64*6) // 6 blocks each
		do(s, "/v1/completions", prompt(a, 1))
		if r := do(s, "/v1/completions", prompt(a, 1)); r.cached != 16*6-16 && r.cached != 95 {
			t.Fatalf("warm a: %+v", r)
		}
		do(s, "/v1/completions", prompt(b, 1)) // needs 7 blocks: evicts a's tail
		if r := do(s, "/v1/completions", prompt(a, 1)); r.cached >= 95 || r.cached == 0 {
			t.Fatalf("a after b should be partly evicted (head kept): %+v", r)
		}
		if r := do(s, "/v1/completions", prompt(strings.Repeat("c", 64*20), 1)); r.code != 400 {
			t.Fatalf("prompt larger than the cache: %+v", r)
		}
	})
}

func TestStreaming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := testServer(t, nil)
		r := do(s, "/v1/chat/completions", `{"model":"sim","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`)
		events := strings.Split(strings.TrimSpace(r.body), "\n\n")
		if r.code != 200 || events[len(events)-1] != "data: [DONE]" || len(events) != 7 { // role, 4 tokens, finish, done
			t.Fatalf("%d events: %q", len(events), r.body)
		}
		var chunk struct {
			Object  string
			Choices []struct{ Delta struct{ Content string } }
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(events[1], "data: ")), &chunk); err != nil || chunk.Object != "chat.completion.chunk" || chunk.Choices[0].Delta.Content != " tok" {
			t.Fatalf("chunk %q: %v", events[1], err)
		}
	})
}

func TestBadRequests(t *testing.T) {
	s := testServer(t, nil)
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/v1/completions", `{"model":"sim",`, 400},
		{"/v1/completions", `{"model":"other","prompt":"x"}`, 404},
		{"/v1/completions", `{"model":"sim","messages":[]}`, 400},
		{"/v1/chat/completions", `{"model":"sim","prompt":"x"}`, 400},
	} {
		if r := do(s, tc.path, tc.body); r.code != tc.code || !strings.Contains(r.body, `"error"`) {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, r.code, r.body)
		}
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", `num_gpu_blocks="16384"`} {
		if !strings.Contains(rec.Body.String(), name) {
			t.Errorf("metrics lack %s", name)
		}
	}
}

// TestCancelWhileWaiting: a client that leaves while queued frees its place.
func TestCancelWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := testServer(t, func(c *Config) { c.MaxSeqs = 1 })
		var first sync.WaitGroup
		first.Go(func() { do(s, "/v1/completions", prompt("x", 50)) })
		defer first.Wait()
		synctest.Wait()
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(prompt("y", 1)))
		ctx, cancel := contextWithCancel(req)
		done := make(chan struct{})
		go func() { s.ServeHTTP(httptest.NewRecorder(), req.WithContext(ctx)); close(done) }()
		synctest.Wait()
		if w := testutil.ToFloat64(s.m.waiting); w != 1 {
			t.Fatalf("waiting %v", w)
		}
		cancel()
		<-done
		if w := testutil.ToFloat64(s.m.waiting); w != 0 {
			t.Fatalf("waiting after cancel %v", w)
		}
	})
}

// TestVirtualClock drives the simulator on a virtual clock the way the
// benchmark does: advance only when nothing is in motion.
func TestVirtualClock(t *testing.T) {
	clock := NewVirtualClock(time.Unix(0, 0))
	s := testServer(t, func(c *Config) { c.Clock = clock; c.MaxSeqs = 1 })
	res := make([]result, 2)
	done := make(chan int, 2)
	for i := range 2 {
		clock.Busy(1) // the request in transit
		go func() {
			start := clock.Now()
			res[i] = do(s, "/v1/completions", prompt(strings.Repeat(string(rune('a'+i)), 400), 3))
			res[i].elapsed = clock.Now().Sub(start)
			clock.Idle() // first byte landed (the recorder holds it)
			clock.Idle() // last byte landed
			done <- i
		}()
	}
	finished := 0
	for finished < 2 {
		for clock.Motion() != 0 {
			select {
			case <-done:
				finished++
			default:
				time.Sleep(time.Microsecond)
			}
		}
		next, ok := clock.Next()
		if !ok {
			if finished < 2 {
				<-done
				finished++
			}
			continue
		}
		clock.AdvanceTo(next)
	}
	// 100 tokens of prefill (100ms) + 2 more tokens (20ms) each; the second
	// waits for the only sequence slot.
	if res[0].elapsed+res[1].elapsed != 120*time.Millisecond+240*time.Millisecond {
		t.Fatalf("virtual latencies %v and %v", res[0].elapsed, res[1].elapsed)
	}
	if clock.Motion() != 0 {
		t.Fatalf("motion left %d", clock.Motion())
	}
}

func TestConfigValidate(t *testing.T) {
	if c := Defaults(); c.Validate() != nil {
		t.Fatalf("defaults rejected: %v", c.Validate())
	}
	for name, mutate := range map[string]func(*Config){
		"no model":           func(c *Config) { c.Model = "" },
		"no KV blocks":       func(c *Config) { c.KVBlocks = 0 },
		"no sequences":       func(c *Config) { c.MaxSeqs = 0 },
		"negative prefill":   func(c *Config) { c.PrefillPerToken = -1 },
		"time scale 0":       func(c *Config) { c.TimeScale = 0 },
		"time scale NaN":     func(c *Config) { c.TimeScale = math.NaN() },
		"time scale +Inf":    func(c *Config) { c.TimeScale = math.Inf(1) },
		"negative chunk gap": func(c *Config) { c.ChunkInterval = -time.Millisecond },
		"load factor 0.5":    func(c *Config) { c.LoadFactor = 0.5 },
		"load factor NaN":    func(c *Config) { c.LoadFactor = math.NaN() },
		"load factor 101":    func(c *Config) { c.LoadFactor = 101 },
	} {
		c := Defaults()
		mutate(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSideBySide: with SideBySide every admitted sequence prefills on its
// own clock; LoadFactor stretches that prefill and every decode step by
// the sequences running, as llm-d-inference-sim's time factor under load.
// a (100 prompt tokens, 2 decode steps) is admitted alone, b (200 tokens,
// no decode) beside it; with 2 slots and factor 2, two running sequences
// take twice as long.
func TestSideBySide(t *testing.T) {
	for _, tc := range []struct {
		sideBySide bool
		factor     float64
		a, b       time.Duration
	}{
		{false, 0, 120 * time.Millisecond, 300 * time.Millisecond}, // b prefills after a's 100 ms
		{true, 0, 120 * time.Millisecond, 200 * time.Millisecond},
		{true, 2, 140 * time.Millisecond, 400 * time.Millisecond}, // a's steps 20 ms while b runs
		{false, 2, 140 * time.Millisecond, 300 * time.Millisecond},
	} {
		synctest.Test(t, func(t *testing.T) {
			s := testServer(t, func(c *Config) { c.MaxSeqs, c.SideBySide, c.LoadFactor = 2, tc.sideBySide, tc.factor })
			var wg sync.WaitGroup
			var a, b result
			wg.Go(func() { a = do(s, "/v1/completions", prompt(strings.Repeat("a", 400), 3)) })
			synctest.Wait() // a is admitted before b arrives
			wg.Go(func() { b = do(s, "/v1/completions", prompt(strings.Repeat("b", 800), 1)) })
			wg.Wait()
			if a.code != 200 || b.code != 200 || a.elapsed != tc.a || b.elapsed != tc.b {
				t.Fatalf("side by side %v, factor %v: a %d after %v, b %d after %v; want %v and %v", tc.sideBySide, tc.factor, a.code, a.elapsed, b.code, b.elapsed, tc.a, tc.b)
			}
		})
	}
}
