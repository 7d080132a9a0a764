// Package llmsim is an OpenAI-compatible simulated inference backend that
// behaves like vLLM where routing is concerned: a paged KV cache of fixed
// size with prefix caching (chained block hashes, LRU eviction), a limit on
// concurrent sequences with a FIFO waiting queue, prefill time per uncached
// prompt token on one compute-bound prefill stream (TTFT = queueing +
// prefill), decode time per output token, SSE streaming and vLLM-style
// metrics. Time can run faster than the wall clock (TimeScale) so benchmarks
// finish sooner; all durations it reports are simulated time.
//
// With SideBySide and LoadFactor it behaves instead like
// llm-d-inference-sim's latency model, where routing is concerned: every
// admitted sequence prefills on its own clock, and prefill and decode
// stretch with the sequences running (its --time-factor-under-load), so
// the bench can replay that engine in virtual time too.
package llmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/warmfleet/warmfleet/router/kvevents"
	"github.com/warmfleet/warmfleet/router/oai"
)

// Config describes the simulated engine.
type Config struct {
	Model           string
	KVBlocks        int           // KV cache capacity in blocks
	BlockTokens     int           // tokens per KV block (vLLM: 16)
	CharsPerToken   int           // prompt bytes per token
	MaxSeqs         int           // concurrent sequences
	PrefillPerToken time.Duration // simulated compute per uncached prompt token
	DecodePerToken  time.Duration // simulated time per output token
	DefaultMaxTok   int           // output tokens when the request names none
	MaxBodyBytes    int64
	// TimeScale runs simulated time this many times faster than the wall
	// clock (1 = real time).
	TimeScale float64
	// ChunkInterval coalesces streamed tokens into one SSE event per this
	// much simulated time (0: one event per token), to spare CPU.
	ChunkInterval time.Duration
	// Clock is the time source; nil means the wall clock.
	Clock Clock
	// Events, if set, is told of every change to the prefix cache as vLLM
	// publishes it (BlockStored, BlockRemoved), one batch per change, in
	// order, from under the simulator's lock: it must not block
	// (kvevents.Publisher does not).
	Events EventSink
	// HashSeed seeds the block hashes of token-id prompts, which are
	// llm-d's (kvevents.LLMDChain over the model name), as
	// llm-d-inference-sim's --hash-seed does; a router given the same seed
	// computes them too. Text prompts keep the simulator's own hashes.
	HashSeed string
	// SideBySide prefills each admitted sequence on its own clock, as
	// llm-d-inference-sim does, instead of on the one prefill stream
	// (vLLM's scheduler, the default): a prompt's first token then waits
	// for no other prompt's prefill, only for a sequence slot and KV room.
	SideBySide bool
	// LoadFactor (1 to 100; 0 counts as 1) stretches a sequence's
	// side-by-side prefill, and every sequence's decode, by
	// 1 + (LoadFactor-1) x (running-1)/(MaxSeqs-1): llm-d-inference-sim's
	// --time-factor-under-load, running counted at admission for the
	// prefill and at each step of decode.
	LoadFactor float64
}

// EventSink takes KV event batches (kvevents.Publisher is one).
type EventSink interface {
	Publish([]kvevents.Event) error
}

// Defaults resemble an 8B model on one modern GPU.
func Defaults() Config {
	return Config{
		Model: "sim", KVBlocks: 16384, BlockTokens: 16, CharsPerToken: 4, MaxSeqs: 64,
		PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 10 * time.Millisecond,
		DefaultMaxTok: 16, MaxBodyBytes: 32 << 20, TimeScale: 1,
	}
}

// Validate checks a config.
func (c *Config) Validate() error {
	if c.Model == "" || c.KVBlocks < 1 || c.BlockTokens < 1 || c.CharsPerToken < 1 || c.MaxSeqs < 1 ||
		c.PrefillPerToken < 0 || c.DecodePerToken < 0 || c.DefaultMaxTok < 1 || c.MaxBodyBytes < 1 ||
		!(c.TimeScale > 0 && c.TimeScale <= 1e6) || c.ChunkInterval < 0 || // !(>0): NaN too
		!(c.LoadFactor == 0 || c.LoadFactor >= 1 && c.LoadFactor <= 100) {
		return errors.New("llmsim: model must be set; kv-blocks, block-tokens, chars-per-token, max-seqs, default max tokens and max body must be positive, time scale in (0, 1e6], load factor 0 or in [1, 100]; durations non-negative")
	}
	return nil
}

// Server is one simulated backend (an http.Handler).
type Server struct {
	cfg   Config
	clock Clock
	tok   Tokenizer
	mux   *http.ServeMux

	mu          sync.Mutex
	kv          *kvCache
	running     int
	waiting     []*seq
	prefillFree time.Time // wall time the prefill stream is next idle
	nextID      uint64

	m simMetrics
}

type seq struct {
	hashes []uint64
	anon   int
	tokens int
	cached int // prompt tokens found in the cache at admission
	// admitted and firstToken are set at admission, under the server's
	// lock: requests admitted together (one finish freeing room for
	// several) queue for prefill in admission order, not in the order
	// their goroutines happen to wake, so virtual-time runs replay alike.
	admitted, firstToken time.Time
	admit                chan struct{}
	started              bool
	parked               bool // its goroutine waits for admission
}

type simMetrics struct {
	running, waiting, kvUsage  prometheus.Gauge
	queries, hits, prompt, gen prometheus.Counter
	success                    *prometheus.CounterVec
	ttft, e2e, queue           prometheus.Histogram
}

// New builds a simulator; its metrics go to reg (and /metrics serves reg if
// it is also a Gatherer).
func New(cfg Config, reg *prometheus.Registry) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	s := &Server{clock: cfg.Clock, cfg: cfg, tok: Tokenizer{CharsPerToken: cfg.CharsPerToken, BlockTokens: cfg.BlockTokens}, kv: newKVCache(cfg.KVBlocks)}
	s.kv.record = cfg.Events != nil
	s.kv.blockTokens = cfg.BlockTokens
	labels := prometheus.Labels{"model_name": cfg.Model}
	secs := prometheus.ExponentialBucketsRange(0.001, 600, 30)
	s.m = simMetrics{
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_running", Help: "Sequences running.", ConstLabels: labels}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", Help: "Sequences waiting.", ConstLabels: labels}),
		kvUsage: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc", Help: "Fraction of KV blocks pinned by running sequences.", ConstLabels: labels}),
		queries: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total", Help: "Prompt tokens looked up in the prefix cache.", ConstLabels: labels}),
		hits:    prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total", Help: "Prompt tokens found in the prefix cache.", ConstLabels: labels}),
		prompt:  prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total", Help: "Prompt tokens processed.", ConstLabels: labels}),
		gen:     prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:generation_tokens_total", Help: "Tokens generated.", ConstLabels: labels}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: "Finished requests.", ConstLabels: labels}, []string{"finished_reason"}),
		ttft:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds", Help: "Simulated TTFT.", ConstLabels: labels, Buckets: secs}),
		e2e:     prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds", Help: "Simulated request latency.", ConstLabels: labels, Buckets: secs}),
		queue:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:request_queue_time_seconds", Help: "Simulated time waiting for admission.", ConstLabels: labels, Buckets: secs}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "KV cache configuration.",
		ConstLabels: prometheus.Labels{"block_size": strconv.Itoa(cfg.BlockTokens), "num_gpu_blocks": strconv.Itoa(cfg.KVBlocks), "enable_prefix_caching": "True"}})
	info.Set(1)
	s.mux = http.NewServeMux()
	if reg != nil {
		for _, c := range []prometheus.Collector{s.m.running, s.m.waiting, s.m.kvUsage, s.m.queries, s.m.hits, s.m.prompt, s.m.gen,
			s.m.success, s.m.ttft, s.m.e2e, s.m.queue, info} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("llmsim metrics: %w", err)
			}
		}
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("POST /v1/completions", s.generate)
	s.mux.HandleFunc("POST /v1/chat/completions", s.generate)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Tokenizer returns how this server tokenizes and hashes prompts.
func (s *Server) Tokenizer() Tokenizer { return s.tok }

func (s *Server) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) / s.cfg.TimeScale)
}

func (s *Server) simSeconds(elapsed time.Duration) float64 {
	return elapsed.Seconds() * s.cfg.TimeScale
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"warmfleet-llmsim","max_model_len":%d}]}`,
		s.cfg.Model, s.cfg.KVBlocks*s.cfg.BlockTokens)
}

// fail answers with an error: the first and last byte leave together.
func (s *Server) fail(w http.ResponseWriter, status int, typ, code, msg string) {
	s.clock.Busy(2)
	oai.WriteError(w, &oai.APIError{Status: status, Type: typ, Code: code, Message: msg})
}

// admitLocked starts waiting sequences in FIFO order while there is a free
// slot and KV room (head-of-line blocking, as vLLM's scheduler does).
func (s *Server) admitLocked() {
	for len(s.waiting) > 0 && s.running < s.cfg.MaxSeqs {
		q := s.waiting[0]
		if s.kv.need(q.hashes, q.anon) > s.kv.free() {
			break
		}
		s.waiting = s.waiting[1:]
		if q.parked {
			s.clock.Busy(1) // wakes a parked request
		}
		s.startLocked(q)
	}
	s.m.waiting.Set(float64(len(s.waiting)))
	s.m.running.Set(float64(s.running))
	s.m.kvUsage.Set(s.kv.used())
}

// publishLocked sends the cache's changes since the last call, if anyone
// listens.
func (s *Server) publishLocked() {
	evs := s.kv.takeEvents()
	if s.cfg.Events != nil && len(evs) > 0 {
		// The sink drops (and its subscribers see a gap) rather than
		// block; an encoding error cannot happen for these events.
		_ = s.cfg.Events.Publish(evs)
	}
}

// startLocked pins the sequence's blocks and counts its cache hits.
func (s *Server) startLocked(q *seq) {
	cached := s.kv.cachedPrefix(q.hashes) * s.cfg.BlockTokens
	cached = min(cached, q.tokens-1) // the last prompt token is always computed
	cached = max(cached, 0)
	s.kv.pin(q.hashes, q.anon)
	s.publishLocked()
	s.running++
	q.started = true
	s.m.queries.Add(float64(q.tokens))
	s.m.hits.Add(float64(cached))
	s.m.prompt.Add(float64(q.tokens))
	q.cached = cached
	q.admitted = s.clock.Now()
	prefill := time.Duration(q.tokens-cached) * s.cfg.PrefillPerToken
	if s.cfg.SideBySide {
		q.firstToken = q.admitted.Add(s.wall(s.stretchLocked(prefill)))
		close(q.admit)
		return
	}
	start := q.admitted
	if s.prefillFree.After(start) {
		start = s.prefillFree
	}
	s.prefillFree = start.Add(s.wall(prefill))
	q.firstToken = s.prefillFree
	close(q.admit)
}

// loadStepTokens is how many tokens a decode step takes at most under a
// load factor: each step's pace is set by the sequences running as it
// starts (llm-d-inference-sim sets each token's).
const loadStepTokens = 8

// stretchLocked is d stretched by the load factor at the sequences running
// now (see Config.LoadFactor).
func (s *Server) stretchLocked(d time.Duration) time.Duration {
	if s.cfg.LoadFactor <= 1 || s.cfg.MaxSeqs <= 1 {
		return d
	}
	f := 1 + (s.cfg.LoadFactor-1)*float64(max(s.running-1, 0))/float64(s.cfg.MaxSeqs-1)
	return time.Duration(float64(d) * f)
}

func (s *Server) finish(q *seq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.started {
		s.kv.unpin(q.hashes, q.anon)
		s.running--
	} else {
		for i, x := range s.waiting {
			if x == q {
				s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
				break
			}
		}
	}
	s.admitLocked()
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request) {
	// The request arrived carrying its sender's Busy; it ends with the handler.
	defer s.clock.Idle()
	w.Header().Set("X-Llmsim", "1")
	arrived := s.clock.Now()
	if r.ContentLength > s.cfg.MaxBodyBytes {
		s.fail(w, http.StatusRequestEntityTooLarge, oai.TypeInvalidRequest, "request_too_large", "request body too large")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
	if err != nil || int64(len(body)) > s.cfg.MaxBodyBytes {
		s.fail(w, http.StatusRequestEntityTooLarge, oai.TypeInvalidRequest, "request_too_large", "request body unreadable or too large")
		return
	}
	req, err := oai.Scan(body)
	if err != nil {
		s.fail(w, http.StatusBadRequest, oai.TypeInvalidRequest, "invalid_request", err.Error())
		return
	}
	if req.Model != s.cfg.Model {
		s.fail(w, http.StatusNotFound, oai.TypeNotFound, "model_not_found", fmt.Sprintf("the model `%s` does not exist", req.Model))
		return
	}
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	if chat != req.HasMessages || (!chat && !req.HasPrompt) {
		s.fail(w, http.StatusBadRequest, oai.TypeInvalidRequest, "invalid_request", "completions need a prompt, chat completions need messages")
		return
	}
	var hashes []uint64
	var tokens int
	if ids, ok := oai.TokenIDs(req.Prompt, nil); ok && !req.HasMessages && req.CacheSalt == "" {
		// Token ids: the engine's hashes, as llm-d-inference-sim's.
		tokens = max(len(ids), 1)
		hashes = kvevents.LLMDChain(s.cfg.HashSeed, s.cfg.Model, ids, s.cfg.BlockTokens)
	} else {
		text := Render(&req)
		tokens = max(s.tok.Tokens(text), 1)
		hashes = s.tok.BlockHashes(text, req.CacheSalt)
	}
	outTokens := req.MaxTokens
	if outTokens <= 0 {
		outTokens = s.cfg.DefaultMaxTok
	}
	// Blocks for the partial prompt tail and the output, never reusable.
	tail := tokens - len(hashes)*s.cfg.BlockTokens
	anon := (tail + outTokens + s.cfg.BlockTokens - 1) / s.cfg.BlockTokens
	if len(hashes)+anon > s.cfg.KVBlocks {
		s.fail(w, http.StatusBadRequest, oai.TypeInvalidRequest, "context_length_exceeded",
			fmt.Sprintf("prompt of %d tokens plus %d output tokens exceeds the KV cache of %d tokens", tokens, outTokens, s.cfg.KVBlocks*s.cfg.BlockTokens))
		return
	}
	q := &seq{hashes: hashes, anon: anon, tokens: tokens, admit: make(chan struct{})}
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.waiting = append(s.waiting, q)
	s.admitLocked()
	if !q.started {
		q.parked = true
		s.clock.Idle()
	}
	s.mu.Unlock()
	defer s.finish(q)

	ctx := r.Context()
	select {
	case <-q.admit:
	case <-ctx.Done():
		s.mu.Lock()
		if !q.started {
			s.clock.Busy(1) // unparks itself
		}
		q.parked = false
		s.mu.Unlock()
		return
	}
	s.m.queue.Observe(s.simSeconds(q.admitted.Sub(arrived)))
	cached := q.cached
	if s.clock.SleepUntil(ctx, q.firstToken) != nil {
		return
	}
	s.m.ttft.Observe(s.simSeconds(s.clock.Now().Sub(arrived)))
	resp := responder{w: w, clock: s.clock, chat: chat, stream: req.Stream, id: fmt.Sprintf("cmpl-%d", id), model: s.cfg.Model, created: arrived.Unix()}
	resp.begin()
	resp.tokens(1)
	perToken := s.cfg.DecodePerToken
	at := s.clock.Now()
	for sent := 1; sent < outTokens; {
		n := outTokens - sent
		if perToken > 0 && s.cfg.ChunkInterval < time.Duration(n)*perToken {
			n = max(1, int(s.cfg.ChunkInterval/perToken))
		}
		if s.cfg.LoadFactor > 1 {
			n = min(n, loadStepTokens) // the factor follows the sequences running
		}
		step := time.Duration(n) * perToken
		if s.cfg.LoadFactor > 1 {
			s.mu.Lock()
			step = s.stretchLocked(step)
			s.mu.Unlock()
		}
		at = at.Add(s.wall(step))
		if s.clock.SleepUntil(ctx, at) != nil {
			return
		}
		resp.tokens(n)
		sent += n
	}
	resp.end(tokens, outTokens, cached)
	s.m.gen.Add(float64(outTokens))
	s.m.success.WithLabelValues("length").Inc()
	s.m.e2e.Observe(s.simSeconds(s.clock.Now().Sub(arrived)))
}

// responder writes OpenAI-shaped output, streamed or whole.
type responder struct {
	w       http.ResponseWriter
	clock   Clock
	chat    bool
	stream  bool
	id      string
	model   string
	created int64
	text    strings.Builder
}

func (p *responder) begin() {
	if p.stream {
		p.clock.Busy(1) // the first byte is on its way
		p.w.Header().Set("Content-Type", "text/event-stream")
		p.w.Header().Set("Cache-Control", "no-cache")
		p.w.WriteHeader(http.StatusOK)
		if p.chat {
			p.event(map[string]any{"role": "assistant", "content": ""}, nil)
		}
	}
}

func (p *responder) event(delta map[string]any, finish *string) {
	obj := "text_completion"
	choice := map[string]any{"index": 0, "finish_reason": finish}
	if p.chat {
		obj = "chat.completion.chunk"
		choice["delta"] = delta
	} else {
		choice["text"] = delta["content"]
	}
	b, _ := json.Marshal(map[string]any{"id": p.id, "object": obj, "created": p.created, "model": p.model, "choices": []any{choice}})
	fmt.Fprintf(p.w, "data: %s\n\n", b)
	if f, ok := p.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (p *responder) tokens(n int) {
	chunk := strings.Repeat(" tok", n)
	if p.stream {
		p.event(map[string]any{"content": chunk}, nil)
		return
	}
	p.text.WriteString(chunk)
}

func (p *responder) end(promptTokens, outTokens, cached int) {
	usage := map[string]any{"prompt_tokens": promptTokens, "completion_tokens": outTokens, "total_tokens": promptTokens + outTokens,
		"prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	reason := "length"
	if p.stream {
		p.clock.Busy(1) // the last byte is on its way
	} else {
		p.clock.Busy(2) // first and last byte leave together
	}
	if p.stream {
		p.event(map[string]any{}, &reason)
		fmt.Fprint(p.w, "data: [DONE]\n\n")
		return
	}
	choice := map[string]any{"index": 0, "finish_reason": reason}
	obj := "text_completion"
	if p.chat {
		obj = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": p.text.String()}
	} else {
		choice["text"] = p.text.String()
	}
	p.w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(p.w).Encode(map[string]any{"id": p.id, "object": obj, "created": p.created, "model": p.model,
		"choices": []any{choice}, "usage": usage})
}
