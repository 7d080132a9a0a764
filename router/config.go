package router

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
	"gopkg.in/yaml.v3"
)

// Config is the router's tunable behaviour. Zero fields take the defaults
// from Defaults; a config file (YAML) uses the yaml names below.
type Config struct {
	Strategy balance.Strategy       `yaml:"strategy"`
	Models   map[string]ModelConfig `yaml:"models"` // per model (variant) overrides
	Backends []BackendConfig        `yaml:"backends"`

	LoadFactor       float64 `yaml:"load_factor"`       // c of the load bound
	MinLoadBound     int     `yaml:"min_load_bound"`    // floor of the load bound (low load keeps affinity)
	BlockChars       int     `yaml:"block_chars"`       // prompt bytes per hashed block
	MaxBlocks        int     `yaml:"max_blocks"`        // leading blocks hashed per request
	RendezvousBlocks int     `yaml:"rendezvous_blocks"` // blocks past the common prefix in the cold key
	Slack            float64 `yaml:"slack"`             // tolerated extra expected wait, as a fraction of the prompt, for affinity
	DecodeWeight     float64 `yaml:"decode_weight"`     // a request past its first token in the load bound (1: plain in-flight)
	ShareFactor      float64 `yaml:"share_factor"`      // recent traffic above this x fair share loses affinity
	ShareHalfLife    int     `yaml:"share_half_life"`   // decisions over which recent traffic halves
	HotShare         float64 `yaml:"hot_share"`         // a prefix in at least hot_share/backends of recent requests counts as common (0: off)
	BalanceSlack     float64 `yaml:"balance_slack"`     // cap on the extra expected wait a new group takes for balance (0: none)
	CharsPerToken    float64 `yaml:"chars_per_token"`   // to size the index from KV cache tokens
	KVCacheTokens    int     `yaml:"kv_cache_tokens"`   // default backend KV cache size
	MaxInflight      int     `yaml:"max_inflight"`      // default backend concurrency limit (0: none)
	// MaxNumSeqs is the engines' sequence slots (vLLM's --max-num-seqs):
	// prefix-aware passes over a backend whose slots are all busy while
	// another has one free. 0: unknown (the rule is off for a backend
	// unless its own max_num_seqs is set).
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// KV events (backends' kv_events): the engines' block size in tokens
	// and hash seed, to compute their block hashes for token-id prompts,
	// and how long a view rebuilt after a gap stays untrusted.
	KVBlockSize int           `yaml:"kv_block_size"`
	KVHashSeed  string        `yaml:"kv_hash_seed"`
	KVResync    time.Duration `yaml:"kv_resync"`

	// The cache-aware strategy's thresholds, as SGLang's router names them.
	CacheThreshold      float64 `yaml:"cache_threshold"`       // match rate above which the best match wins, in (0, 1]
	BalanceAbsThreshold int     `yaml:"balance_abs_threshold"` // in-flight gap (max-min) beyond which load decides...
	BalanceRelThreshold float64 `yaml:"balance_rel_threshold"` // ...when max also exceeds this x min

	// The self-tuning strategy's: its load factor (the bounded-load cap
	// is only a safety net under it: the learned costs do the balancing),
	// its share factor (a backend whose recent traffic is above this x its
	// fair share takes a request only if none other can: cached prompts
	// cost so little that, uncapped, a few backends would draw most
	// requests, beyond what an operator sizes a backend for), how much the cache a placement evicts counts against it (0: not at
	// all, 1: as much as the requests it delays), and how often the
	// engines' metrics are read (<= 0: never).
	TuneLoadFactor        float64       `yaml:"self_tuning_load_factor"`
	TuneShareFactor       float64       `yaml:"self_tuning_share_factor"`
	EvictWeight           float64       `yaml:"evict_weight"`
	EngineMetricsInterval time.Duration `yaml:"engine_metrics_interval"`
	// LearnCosts keeps the self-tuning fits learning (and their
	// warmfleet_router_backend_ttft_* metrics current) while no model uses
	// self-tuning, so a switch to it starts informed; off, they learn only
	// while some model does.
	LearnCosts bool `yaml:"learn_costs"`

	MaxBodyBytes  int64         `yaml:"max_body_bytes"`
	BodyTimeout   time.Duration `yaml:"body_timeout"`    // to read a whole request body, however it trickles in
	MaxSlowBodies int           `yaml:"max_slow_bodies"` // bodies still arriving after slowBodyAfter at once; more are refused (408)
	QueueTimeout  time.Duration `yaml:"queue_timeout"`   // bounded wait when every backend is at its limit
	MaxQueue      int           `yaml:"max_queue"`       // waiting requests beyond which 429 is immediate
	MaxRetries    int           `yaml:"max_retries"`     // extra attempts for requests that could not be sent

	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// FirstByteTimeout bounds the wait for a backend's first response body
	// byte (after the request is sent) for streamed requests and other
	// paths; a backend that misses it is ejected and the request retried
	// on another, as nothing has reached the client yet.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// ResponseTimeout is the same bound for non-streamed completions, whose
	// first byte comes with the whole answer.
	ResponseTimeout time.Duration `yaml:"response_timeout"`
	// IdleTimeout bounds the gap between two reads of an answer once it has
	// begun; a backend that misses it broke the answer and is ejected.
	IdleTimeout   time.Duration `yaml:"idle_timeout"`
	ProbeInterval time.Duration `yaml:"probe_interval"` // active health probes; negative disables
	ProbePath     string        `yaml:"probe_path"`
	ProbeTimeout  time.Duration `yaml:"probe_timeout"`
	EjectBase     time.Duration `yaml:"eject_base"` // first passive ejection; doubles per failure
	EjectMax      time.Duration `yaml:"eject_max"`
	Eject5xx      int           `yaml:"eject_5xx"` // consecutive 5xx answers that eject a backend (0: never)
	RampUp        time.Duration `yaml:"ramp_up"`   // a new endpoint reaches a full share after this

	SessionHeader string `yaml:"session_header"` // request header whose value is mixed into the hash
	DebugHeader   bool   `yaml:"debug_header"`   // answer X-Warmfleet-Debug with X-Warmfleet-Route
	HashKeyFile   string `yaml:"hash_key_file"`  // per-fleet secret keying the block hashes
	// ForwardPaths are the path prefixes the public listener forwards to
	// backends (a prefix matches itself and what lies below it); the
	// router answers everything else itself, with 404.
	ForwardPaths []string `yaml:"forward_paths"`
}

// DefaultForwardPaths are the OpenAI API paths forwarded by default.
var DefaultForwardPaths = []string{"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/embeddings"}

// ModelConfig overrides settings for one model name.
type ModelConfig struct {
	Strategy balance.Strategy `yaml:"strategy"`
}

// BackendConfig is one statically configured inference endpoint.
type BackendConfig struct {
	URL           string   `yaml:"url"`
	ID            string   `yaml:"id"`     // identity in rendezvous hashing; default: the URL
	Models        []string `yaml:"models"` // empty: serves whatever model is asked for
	MaxInflight   int      `yaml:"max_inflight"`
	MaxNumSeqs    int      `yaml:"max_num_seqs"` // its engine's sequence slots; 0: the default max_num_seqs
	KVCacheTokens int      `yaml:"kv_cache_tokens"`
	HoldsWeights  *bool    `yaml:"holds_weights"` // default true
	// KVEvents is where the backend's engine publishes its KV-cache
	// events: tcp://HOST:PORT to connect to a publisher that binds (vLLM's
	// default), bind:tcp://HOST:PORT for the router to bind and the engine
	// to connect (llm-d-inference-sim's --zmq-endpoint). Empty: none.
	KVEvents string `yaml:"kv_events"`
	// Speed is how fast its engine prefills and decodes relative to the
	// fleet's usual backend, e.g. 2 for a GPU generation twice as fast (0:
	// 1). It scales the backend's fair share of traffic, and prefix-aware
	// prices its queue in time; self-tuning uses it until it has learned
	// speeds itself.
	Speed float64 `yaml:"speed"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Strategy:         balance.PrefixAware,
		LoadFactor:       1.25,
		MinLoadBound:     2,
		BlockChars:       256,
		MaxBlocks:        1024,
		RendezvousBlocks: 16,
		Slack:            balance.DefaultSlack,
		BalanceSlack:     0.1,
		DecodeWeight:     1,
		ShareFactor:      1.1,
		ShareHalfLife:    256,
		CharsPerToken:    4,
		KVCacheTokens:    262144,

		// SGLang's cache_aware defaults.
		CacheThreshold:      balance.DefaultCacheThreshold,
		BalanceAbsThreshold: balance.DefaultBalanceAbsThreshold,
		BalanceRelThreshold: balance.DefaultBalanceRelThreshold,

		TuneLoadFactor:        3,
		TuneShareFactor:       1.2,
		EvictWeight:           0.5,
		EngineMetricsInterval: 2 * time.Second,

		KVBlockSize:      16,
		KVResync:         30 * time.Second,
		MaxBodyBytes:     16 << 20,
		BodyTimeout:      30 * time.Second,
		MaxSlowBodies:    256,
		QueueTimeout:     2 * time.Second,
		MaxQueue:         1024,
		MaxRetries:       2,
		ConnectTimeout:   2 * time.Second,
		FirstByteTimeout: 60 * time.Second,
		ResponseTimeout:  10 * time.Minute,
		IdleTimeout:      60 * time.Second,
		ProbeInterval:    5 * time.Second,
		ProbePath:        "/health",
		ProbeTimeout:     2 * time.Second,
		EjectBase:        time.Second,
		EjectMax:         30 * time.Second,
		Eject5xx:         5,
		RampUp:           60 * time.Second,
		SessionHeader:    "X-Session-Id",
		DebugHeader:      true,
		ForwardPaths:     slices.Clone(DefaultForwardPaths),
	}
}

// LoadConfig reads a YAML config file over Defaults. Unknown keys are
// errors. It also returns the bytes it parsed, so a caller that watches
// the file compares later reads with what it loaded, read once.
func LoadConfig(path string) (Config, []byte, error) {
	cfg := Defaults()
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, nil, fmt.Errorf("router config: %w", err)
	}
	if err := ParseConfig(b, &cfg); err != nil {
		return cfg, nil, fmt.Errorf("router config %s: %w", path, err)
	}
	return cfg, b, nil
}

// ParseConfig decodes YAML into cfg (fields absent keep their values) and validates.
func ParseConfig(b []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) { // io.EOF: empty file
		return err
	}
	return cfg.Validate()
}

// Validate checks values a person may have typed.
func (c *Config) Validate() error {
	var errs []error
	if _, err := balance.ParseStrategy(string(c.Strategy)); err != nil {
		errs = append(errs, err)
	}
	for m, mc := range c.Models {
		if _, err := balance.ParseStrategy(string(mc.Strategy)); err != nil {
			errs = append(errs, fmt.Errorf("model %q: %w", m, err))
		}
	}
	// Every float is checked as "inside", so NaN (YAML .nan, flag NaN) fails
	// too: it would turn the load bound and the index size into garbage.
	within := func(x, lo, hi float64) bool { return x >= lo && x <= hi }
	if !within(c.LoadFactor, 1, 1000) {
		errs = append(errs, fmt.Errorf("load_factor %v must be in [1, 1000]", c.LoadFactor))
	}
	if !within(c.Slack, 0, 100) {
		errs = append(errs, fmt.Errorf("slack %v must be in [0, 100]", c.Slack))
	}
	if !within(c.BalanceSlack, 0, 100) {
		errs = append(errs, fmt.Errorf("balance_slack %v must be in [0, 100]", c.BalanceSlack))
	}
	if !(c.DecodeWeight > 0 && c.DecodeWeight <= 1) {
		errs = append(errs, fmt.Errorf("decode_weight %v must be in (0, 1]", c.DecodeWeight))
	}
	if !within(c.ShareFactor, 1, 100) || c.ShareHalfLife < 1 {
		errs = append(errs, fmt.Errorf("share_factor %v must be in [1, 100] and share_half_life %d >= 1", c.ShareFactor, c.ShareHalfLife))
	}
	if !within(c.HotShare, 0, 100) {
		errs = append(errs, fmt.Errorf("hot_share %v must be in [0, 100]", c.HotShare))
	}
	if !(c.CacheThreshold > 0 && c.CacheThreshold <= 1) || c.BalanceAbsThreshold < 1 || !within(c.BalanceRelThreshold, 1, 1000) {
		errs = append(errs, fmt.Errorf("cache_threshold %v must be in (0, 1], balance_abs_threshold %d >= 1, balance_rel_threshold %v in [1, 1000]",
			c.CacheThreshold, c.BalanceAbsThreshold, c.BalanceRelThreshold))
	}
	if !within(c.EvictWeight, 0, 10) || !within(c.TuneLoadFactor, 1, 1000) || !within(c.TuneShareFactor, 1, 100) {
		errs = append(errs, fmt.Errorf("evict_weight %v must be in [0, 10], self_tuning_load_factor %v in [1, 1000] and self_tuning_share_factor %v in [1, 100]",
			c.EvictWeight, c.TuneLoadFactor, c.TuneShareFactor))
	}
	if c.MinLoadBound < 1 {
		errs = append(errs, fmt.Errorf("min_load_bound %d must be >= 1", c.MinLoadBound))
	}
	if c.BlockChars < 16 || c.MaxBlocks < 1 || c.RendezvousBlocks < 1 {
		errs = append(errs, errors.New("block_chars must be >= 16, max_blocks and rendezvous_blocks >= 1"))
	}
	if !(c.CharsPerToken > 0 && c.CharsPerToken <= 64) || c.KVCacheTokens < 1 || c.MaxInflight < 0 || c.MaxNumSeqs < 0 {
		errs = append(errs, errors.New("chars_per_token must be in (0, 64], kv_cache_tokens positive, max_inflight and max_num_seqs >= 0"))
	}
	if c.KVBlockSize < 1 || c.KVBlockSize > 4096 || c.KVResync <= 0 || len(c.KVHashSeed) > 1024 {
		errs = append(errs, errors.New("kv_block_size must be in [1, 4096], kv_resync positive and kv_hash_seed at most 1024 bytes"))
	}
	if c.MaxBodyBytes < 1 || c.MaxQueue < 0 || c.MaxRetries < 0 || c.QueueTimeout < 0 || c.Eject5xx < 0 {
		errs = append(errs, errors.New("max_body_bytes must be positive; max_queue, max_retries, queue_timeout, eject_5xx >= 0"))
	}
	if c.EjectBase <= 0 || c.EjectMax < c.EjectBase || c.ConnectTimeout <= 0 || c.ProbeTimeout <= 0 || c.BodyTimeout <= 0 {
		errs = append(errs, errors.New("eject_base, connect_timeout, probe_timeout, body_timeout must be positive and eject_max >= eject_base"))
	}
	if c.FirstByteTimeout <= 0 || c.ResponseTimeout <= 0 || c.IdleTimeout <= 0 || c.MaxSlowBodies < 0 {
		errs = append(errs, errors.New("first_byte_timeout, response_timeout, idle_timeout must be positive and max_slow_bodies >= 0"))
	}
	for _, p := range c.ForwardPaths {
		if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || slices.Contains(routerPaths, p) {
			errs = append(errs, fmt.Errorf("forward_paths: %q must start with / and not end with one, and must not be one of the router's own paths %v", p, routerPaths))
		}
	}
	if c.ProbeInterval > 0 && !strings.HasPrefix(c.ProbePath, "/") {
		errs = append(errs, fmt.Errorf("probe_path %q must start with /", c.ProbePath))
	}
	seen, ids := map[string]bool{}, map[string]bool{}
	for i, b := range c.Backends {
		u, err := ParseBackendURL(b.URL)
		if err != nil {
			errs = append(errs, fmt.Errorf("backends[%d]: %w", i, err))
			continue
		}
		id := cmp.Or(b.ID, u)
		switch {
		case seen[u]:
			errs = append(errs, fmt.Errorf("backends[%d]: duplicate url %s", i, u))
		case ids[id]:
			errs = append(errs, fmt.Errorf("backends[%d]: duplicate id %q (an id must differ from every other backend's id or url)", i, id))
		}
		seen[u], ids[id] = true, true
		if b.KVEvents != "" {
			if _, _, err := ParseKVEvents(b.KVEvents); err != nil {
				errs = append(errs, fmt.Errorf("backends[%d]: kv_events: %w", i, err))
			}
		}
		if b.MaxInflight < 0 || b.KVCacheTokens < 0 || b.MaxNumSeqs < 0 {
			errs = append(errs, fmt.Errorf("backends[%d]: max_inflight, max_num_seqs and kv_cache_tokens must be >= 0", i))
		}
		if b.Speed != 0 && !(b.Speed >= 1.0/balance.MaxSpeed && b.Speed <= balance.MaxSpeed) {
			errs = append(errs, fmt.Errorf("backends[%d]: speed %v: want 1/%d..%d relative to the fleet's usual backend (0: 1)", i, b.Speed, balance.MaxSpeed, balance.MaxSpeed))
		}
	}
	return errors.Join(errs...)
}

// ParseBackendURL validates and normalises a backend base URL.
func ParseBackendURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("backend url %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("backend url %q: want http(s)://host[:port][/base] without query or credentials", s)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// StrategyFor returns the strategy for model.
func (c *Config) StrategyFor(model string) balance.Strategy {
	if mc, ok := c.Models[model]; ok && mc.Strategy != "" {
		return mc.Strategy
	}
	return c.Strategy
}

// Forwards reports whether the public listener forwards path to backends.
func (c *Config) Forwards(path string) bool {
	for _, p := range c.ForwardPaths {
		if strings.HasPrefix(path, p) && (len(path) == len(p) || path[len(p)] == '/') {
			return true
		}
	}
	return false
}
