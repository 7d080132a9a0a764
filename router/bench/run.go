package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/llmsim"
	"github.com/warmfleet/warmfleet/router/prefix"
)

// Options control a benchmark run.
type Options struct {
	Backends    int
	Load        float64 // offered prefill work / fleet prefill capacity
	Requests    int     // per workload
	Workloads   []string
	Strategies  []balance.Strategy
	TracesDir   string // empty: the traces embedded in the binary
	TraceOffset int
	Sim         llmsim.Config // per backend (runs on a virtual clock; TimeScale is ignored)
	Seed        uint64
	Saturation  bool // also measure throughput with a closed loop
	// ClosedPerBE is closed-loop clients per backend; 0 fills every
	// sequence slot (Sim.MaxSeqs), so the backends, not the clients,
	// limit the rate: with fewer, a client's time is mostly decode and the
	// figure measures latency rather than capacity.
	ClosedPerBE int
	// Speeds, if set, is each backend's speed relative to Sim (one per
	// backend): a backend at 2 prefills and decodes in half Sim's times, as
	// a fleet of mixed GPU generations does. Load is then offered against
	// the fleet's summed capacity, and busiest shares are taken over each
	// backend's fair share (its speed over the mean). Backends a scale-out
	// phase adds run at 1. SpeedsConfigured tells the routers each
	// backend's speed, as an operator's config would (BackendConfig.Speed).
	Speeds           []float64
	SpeedsConfigured bool
	// SlotsConfigured tells the routers the engines' sequence slots
	// (Sim.MaxSeqs), as an operator's max_num_seqs would.
	SlotsConfigured bool
	RouterMaxInf    int // router's per-backend concurrency limit (0: none)
	LoadFactor      float64
	Slack           float64 // router slack (0: router default)
	ShareFactor     float64 // router share factor (0: router default)
	DecodeWeight    float64 // router decode weight (0: router default)
	BalanceSlack    float64 // router balance slack (0: router default)
	ShareHalfLife   int     // router share half-life in decisions (0: router default)
	HotShare        float64 // router hot-prefix share (0: router default, off)
	// Replicas is how many routers, each with its own state, share the
	// workload phases' traffic: request i goes to replica i mod Replicas,
	// as a load balancer in front of them would spread it, session turns
	// included. 1 if zero.
	Replicas int
	// ReplicaSync has every replica observe the others' requests at once
	// (router.Observe): placements, traffic shares and load.
	ReplicaSync bool

	OverheadRate     int           // requests per second for the overhead phase (0 skips it)
	OverheadDuration time.Duration // per round
	OverheadRounds   int
	DecisionBackends int // backends for the decision-time phase (0 skips it)
	DecisionPrompt   int // prompt bytes for the decision-time phase
	DecisionSamples  int
	// ScaleOut names the workload of the scale-out phase ("" skips it):
	// ScaleOutAdd backends join when half its requests have arrived.
	ScaleOut    string
	ScaleOutAdd int

	// KVEvents has every simulator publish its KV-cache events and the
	// routers follow them (kv_events); TokenPrompts sends every prompt as
	// token ids, whose engine block hashes the routers can compute.
	KVEvents, TokenPrompts bool
	// Engine is the backends: "" for llmsim in virtual time, or
	// EngineInferenceSim for llm-d-inference-sim processes in wall time
	// (no saturation phase): arrivals at Load x the engines' capacity
	// (engineCapacity), or with EngineClients > 0, that many closed-loop
	// clients instead.
	Engine        string
	EngineClients int
	// EngineLoadFactor is llm-d-inference-sim's time factor under load:
	// its prefill and decode take this many times longer with every
	// sequence slot (Sim.MaxSeqs) busy than with one (1: no slowdown).
	// llmsim takes it too (Sim.LoadFactor): its decode, and with
	// Sim.SideBySide its prefill, which then also schedules arrivals by
	// the engines' slots as for llm-d-inference-sim (engineCapacity).
	EngineLoadFactor float64

	Progress io.Writer // nil: quiet
	// RequestsOut, when set, receives every open-loop request of every
	// strategy as a JSON line (RequestRecord).
	RequestsOut io.Writer
}

// DefaultOptions are sized to finish in a few minutes on 2 cores.
func DefaultOptions() Options {
	sim := llmsim.Defaults()
	sim.KVBlocks = 65536 // 1M tokens per backend: a multi-GPU node
	return Options{
		Backends: 8, Load: 0.8, Requests: 1000, Workloads: AllWorkloads(),
		// kv-aware is prefix-aware's rule (which follows KV events wherever
		// they are published): running both would replay every workload twice.
		Strategies: slices.DeleteFunc(balance.Strategies(), func(s balance.Strategy) bool { return s == balance.KVAware }),
		TracesDir:  "", Sim: sim, Seed: 1, Saturation: true, Replicas: 1,
		OverheadRate: 1000, OverheadDuration: 2 * time.Second, OverheadRounds: 3,
		DecisionBackends: 64, DecisionPrompt: 16000, DecisionSamples: 20000,
		ScaleOut: WorkRAG, ScaleOutAdd: 2,
		EngineLoadFactor: 1, SlotsConfigured: true,
	}
}

// Results is the whole report.
type Results struct {
	Machine   Machine          `json:"machine"`
	Options   OptionsSummary   `json:"options"`
	Workloads []WorkloadResult `json:"workloads"`
	Overhead  *OverheadResult  `json:"overhead,omitempty"`
	Decision  *DecisionResult  `json:"decision,omitempty"`
	ScaleOut  *ScaleOutResult  `json:"scale_out,omitempty"`
}

// Machine describes where the run happened (noise context).
type Machine struct {
	CPUs      int     `json:"cpus"`
	LoadAvg1  float64 `json:"loadavg_1m_start"`
	LoadAvg1E float64 `json:"loadavg_1m_end"`
	GoVersion string  `json:"go"`
}

// OptionsSummary echoes the settings that shape the figures.
type OptionsSummary struct {
	Backends        int     `json:"backends"`
	Load            float64 `json:"load"`
	Requests        int     `json:"requests"`
	KVBlocks        int     `json:"kv_blocks"`
	BlockTokens     int     `json:"block_tokens"`
	MaxSeqs         int     `json:"max_seqs"`
	PrefillPerToken string  `json:"prefill_per_token"`
	DecodePerToken  string  `json:"decode_per_token"`
	LoadFactor      float64 `json:"load_factor"`
	ShareFactor     float64 `json:"share_factor"`
	BalanceSlack    float64 `json:"balance_slack"`
	Slack           float64 `json:"slack"`
	HotShare        float64 `json:"hot_share"`
	Replicas        int     `json:"router_replicas"`
	KVEvents        bool    `json:"kv_events"`
	TokenPrompts    bool    `json:"token_prompts"`
	Engine          string  `json:"engine,omitempty"`
	// EngineClients > 0: closed-loop clients instead of open-loop arrivals.
	EngineClients    int     `json:"engine_clients,omitempty"`
	EngineLoadFactor float64 `json:"engine_load_factor,omitempty"`
	// SideBySide: llmsim prefilled every sequence on its own clock
	// (llmsim.Config.SideBySide).
	SideBySide bool `json:"side_by_side_prefill,omitempty"`
	// Speeds: each backend's speed relative to the simulator's times;
	// SpeedsConfigured: the routers were told them.
	Speeds           []float64 `json:"backend_speeds,omitempty"`
	SpeedsConfigured bool      `json:"backend_speeds_configured,omitempty"`
	// SlotsConfigured: the routers were told the engines' sequence slots
	// (max_num_seqs).
	SlotsConfigured bool `json:"max_num_seqs_configured"`
}

// WorkloadResult is one workload under every strategy.
type WorkloadResult struct {
	Name     string `json:"name"`
	Requests int    `json:"requests"`
	// SatRequests is the saturation phase's requests: at least satRounds
	// x its clients (fewer where a trace ends first).
	SatRequests    int              `json:"saturated_requests,omitempty"`
	MeanPrompt     float64          `json:"mean_prompt_tokens"`
	BestReuse      float64          `json:"best_reuse"`          // unlimited cache
	BestReuseFleet float64          `json:"best_reuse_fleet_kv"` // one LRU the size of the whole fleet's KV
	Strategies     []StrategyResult `json:"strategies"`
	// EngineCapacity is the llm-d-inference-sim fleet's capacity in
	// requests per second (engineCapacity) and EngineRate the offered rate.
	EngineCapacity float64 `json:"engine_capacity_rps,omitempty"`
	EngineRate     float64 `json:"engine_offered_rps,omitempty"`
	// VsBest is the default strategy against the best other of this run.
	VsBest *DefaultVsBest `json:"default_vs_best,omitempty"`
}

// StrategyResult is one strategy on one workload. Times are simulated seconds.
type StrategyResult struct {
	Strategy       balance.Strategy `json:"strategy"`
	HitRate        float64          `json:"kv_hit_rate"`
	TTFTp50        float64          `json:"ttft_p50_s"`
	TTFTp90        float64          `json:"ttft_p90_s"`
	TTFTp95        float64          `json:"ttft_p95_s"`
	TTFTp99        float64          `json:"ttft_p99_s"`
	OpenThroughput float64          `json:"open_loop_rps"`
	Throughput     float64          `json:"saturated_rps,omitempty"`
	SatHitRate     float64          `json:"saturated_kv_hit_rate,omitempty"`
	BusiestShare   float64          `json:"busiest_share_over_mean"`
	// BusiestWork is the busiest backend's computed prompt tokens (not
	// served from cache) over the mean: the load that sets TTFT.
	BusiestWork float64            `json:"busiest_prefill_over_mean"`
	Rejected429 int                `json:"rejected_429"`
	Rejected503 int                `json:"rejected_503"`
	Errors      int                `json:"errors"`
	Reasons     map[string]float64 `json:"decisions_by_reason"`
	// ByReplica is each router replica's decisions, when there are several.
	ByReplica   []float64 `json:"decisions_by_replica,omitempty"`
	WallSeconds float64   `json:"wall_seconds"`
	// PrefillOverlap and PrefillSlowdown are what the (first) router
	// learned of its engines' prefill at the end of the open loop: the
	// share of queued prefill a prompt did not wait for and the stretch
	// of its prefill per request beside it (router.State).
	PrefillOverlap  float64 `json:"prefill_overlap"`
	PrefillSlowdown float64 `json:"prefill_slowdown"`
	// With llm-d-inference-sim: each backend's share of the work and its
	// TTFTs; the 99th percentile of how late a request left its
	// scheduled arrival (open loop); and the CPU the bench process (router
	// and clients) and the simulators used per wall second of the run,
	// start-up included.
	ByBackend  []BackendResult `json:"by_backend,omitempty"`
	SendLagP99 float64         `json:"send_lag_p99_s,omitempty"`
	BenchCPU   float64         `json:"bench_cpu_per_s,omitempty"`
	EngineCPU  float64         `json:"engines_cpu_per_s,omitempty"`
	// TTFTs are the successful requests' TTFTs in seconds (for plots).
	TTFTs []float64 `json:"-"`
	// ByRequest is every request's TTFT in seconds in arrival order, NaN
	// where it failed: strategies compared request by request
	// (compareDefault).
	ByRequest []float64 `json:"-"`
}

// BackendResult is one backend's part of a strategy's run.
type BackendResult struct {
	Requests     float64 `json:"requests"`
	OutputTokens float64 `json:"output_tokens"`
	HitRate      float64 `json:"kv_hit_rate"`
	TTFTp50      float64 `json:"ttft_p50_s"`
	TTFTp99      float64 `json:"ttft_p99_s"`
}

func (o *Options) logf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// Validate checks the options before any phase starts.
func (o *Options) Validate() error {
	if o.Backends < 1 || o.Backends > prefix.MaxSlots || !(o.Load > 0 && o.Load <= 100) || o.Requests < 1 || o.ClosedPerBE < 0 || o.TraceOffset < 0 {
		return errors.New("bench: backends must be 1..256; load in (0, 100]; requests positive; closed-loop clients and trace offset not negative")
	}
	if o.Replicas < 0 || o.Replicas > maxReplicas {
		return fmt.Errorf("bench: router replicas must be 1..%d (0: 1)", maxReplicas)
	}
	if o.OverheadRate < 0 || o.OverheadRate > 100_000 ||
		(o.OverheadRate > 0 && (o.OverheadRounds < 1 || float64(o.OverheadRate)*o.OverheadDuration.Seconds() < 1)) {
		return errors.New("bench: overhead rate must be 0 (skip) to 100000 requests/s, with at least one round whose duration holds a request")
	}
	if o.DecisionBackends < 0 || o.DecisionBackends > prefix.MaxSlots ||
		(o.DecisionBackends > 0 && (o.DecisionPrompt < 1 || o.DecisionPrompt > 8<<20 || o.DecisionSamples < 1)) {
		return errors.New("bench: decision backends must be 0 (skip) to 256, with a prompt of 1 byte to 8 MiB and at least one sample")
	}
	if o.ScaleOut != "" && (!slices.Contains(AllWorkloads(), o.ScaleOut) || o.ScaleOutAdd < 1 || o.Backends+o.ScaleOutAdd > prefix.MaxSlots) {
		return fmt.Errorf("bench: the scale-out workload must be one of %v, adding 1 or more backends (at most %d in all)", AllWorkloads(), prefix.MaxSlots)
	}
	if err := o.Sim.Validate(); err != nil {
		return err
	}
	if len(o.Speeds) > 0 {
		if len(o.Speeds) != o.Backends {
			return fmt.Errorf("bench: %d backend speeds for %d backends: give one per backend", len(o.Speeds), o.Backends)
		}
		for i, v := range o.Speeds {
			if !(v >= 0.01 && v <= 100) {
				return fmt.Errorf("bench: backend %d's speed %v: want 0.01..100 (relative to the simulator's times)", i, v)
			}
		}
		if o.Engine != "" {
			return errors.New("bench: backend speeds apply to llmsim backends only")
		}
	}
	if o.SpeedsConfigured && len(o.Speeds) == 0 {
		return errors.New("bench: the routers can be told backend speeds only when they are given")
	}
	switch o.Engine {
	case "":
		if !(o.EngineLoadFactor >= 1 && o.EngineLoadFactor <= 100) {
			return errors.New("bench: the engine load factor must be in [1, 100]")
		}
	case EngineInferenceSim:
		if o.Sim.SideBySide {
			return errors.New("bench: side-by-side prefill is llmsim's imitation of llm-d-inference-sim, which prefills so on its own")
		}
		if bt := o.Sim.BlockTokens; bt != 8 && bt != 16 && bt != 32 && bt != 64 && bt != 128 || o.EngineClients < 0 || o.EngineClients > 1024 ||
			!(o.EngineLoadFactor >= 1 && o.EngineLoadFactor <= 100) {
			return errors.New("bench: llm-d-inference-sim takes block sizes 8, 16, 32, 64 or 128; engine clients must be 0 (open loop) to 1024 and the engine load factor in [1, 100]")
		}
	default:
		return fmt.Errorf("bench: unknown engine %q (want llmsim or %s)", o.Engine, EngineInferenceSim)
	}
	rc := o.routerConfig()
	if err := rc.Validate(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// Run runs every phase.
func Run(ctx context.Context, o Options) (*Results, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	rc := o.routerConfig()
	res := &Results{Machine: Machine{CPUs: runtime.NumCPU(), LoadAvg1: loadAvg(), GoVersion: runtime.Version()},
		Options: OptionsSummary{Backends: o.Backends, Load: o.Load, Requests: o.Requests, KVBlocks: o.Sim.KVBlocks, BlockTokens: o.Sim.BlockTokens,
			MaxSeqs: o.Sim.MaxSeqs, PrefillPerToken: o.Sim.PrefillPerToken.String(), DecodePerToken: o.Sim.DecodePerToken.String(),
			LoadFactor: rc.LoadFactor, ShareFactor: rc.ShareFactor, BalanceSlack: rc.BalanceSlack, Slack: rc.Slack, HotShare: rc.HotShare,
			Replicas: o.replicas(), KVEvents: o.KVEvents, TokenPrompts: o.TokenPrompts, Engine: o.Engine, Speeds: o.Speeds, SpeedsConfigured: o.SpeedsConfigured,
			SlotsConfigured: o.SlotsConfigured}}
	if o.Engine != "" {
		res.Options.EngineClients, res.Options.EngineLoadFactor = o.EngineClients, o.EngineLoadFactor
	} else {
		o.Sim.LoadFactor = o.EngineLoadFactor
		if o.Sim.SideBySide || o.EngineLoadFactor != 1 {
			res.Options.EngineLoadFactor, res.Options.SideBySide = o.EngineLoadFactor, o.Sim.SideBySide
		}
	}
	tok := llmsim.Tokenizer{CharsPerToken: o.Sim.CharsPerToken, BlockTokens: o.Sim.BlockTokens}
	for _, name := range o.Workloads {
		w, err := o.replayed(name, o.Requests)
		if err != nil {
			return nil, err
		}
		wr := WorkloadResult{Name: name, Requests: len(w.Requests), BestReuse: BestReuse(&w, tok, 0),
			BestReuseFleet: BestReuse(&w, tok, o.Backends*o.Sim.KVBlocks)}
		var sat *Workload
		if o.Saturation && o.Engine == "" {
			sw, err := o.replayed(name, max(o.Requests, satRounds*o.closedClients()))
			if err != nil {
				return nil, err
			}
			sat, wr.SatRequests = &sw, len(sw.Requests)
		}
		switch {
		case o.Engine == EngineInferenceSim:
			if wr.EngineCapacity, err = engineWorkload(&o, &w); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if o.EngineClients == 0 {
				wr.EngineRate = o.Load * wr.EngineCapacity
			}
			o.logf("%s: engine capacity %.1f requests/s with nothing cached; offered %.1f/s", name, wr.EngineCapacity, wr.EngineRate)
		case o.Sim.SideBySide:
			// Its slots fill, not a prefill stream: arrivals as for
			// llm-d-inference-sim, whose latency model it imitates.
			if wr.EngineCapacity, err = slotCapacity(&o, &w, func(r *Request) (int, error) { return r.PromptTokens, nil }); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			wr.EngineRate = o.Load * wr.EngineCapacity
			w.ScheduleRate(wr.EngineRate, o.Seed)
		}
		tokens := 0
		for _, r := range w.Requests {
			tokens += r.PromptTokens
		}
		wr.MeanPrompt = float64(tokens) / float64(len(w.Requests))
		for _, st := range o.Strategies {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var sr StrategyResult
			if o.Engine == EngineInferenceSim {
				sr, err = runEngine(ctx, &o, &w, st)
			} else {
				sr, err = runStrategy(ctx, &o, &w, sat, st)
			}
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", name, st, err)
			}
			o.logf("%-22s %-18s hit %.3f (best %.3f)  ttft p50 %.3fs p99 %.3fs  sat %.2f rps  busiest %.2fx  429 %d  503 %d  err %d  %v (%.0fs wall)",
				name, st, sr.HitRate, wr.BestReuse, sr.TTFTp50, sr.TTFTp99, sr.Throughput, sr.BusiestShare, sr.Rejected429, sr.Rejected503, sr.Errors, sr.Reasons, sr.WallSeconds)
			wr.Strategies = append(wr.Strategies, sr)
		}
		wr.VsBest = compareDefault(&wr, router.Defaults().Strategy, o.Seed)
		res.Workloads = append(res.Workloads, wr)
	}
	if o.DecisionBackends > 0 {
		d, err := measureDecision(o.DecisionBackends, o.DecisionPrompt, o.DecisionSamples, o.Seed, o.Strategies)
		if err != nil {
			return nil, err
		}
		res.Decision = d
		o.logf("decision: %d backends, %d-byte prompts: p50 %.1fus p99 %.1fus (a fixed computation as long: p50 %.1fus p99 %.1fus)",
			d.Backends, d.PromptBytes, d.P50us, d.P99us, d.Floor.P50us, d.Floor.P99us)
	}
	if o.ScaleOut != "" {
		w, err := o.workload(o.ScaleOut, o.Requests)
		if err != nil {
			return nil, err
		}
		so, err := measureScaleOut(ctx, &o, &w)
		if err != nil {
			return nil, err
		}
		res.ScaleOut = so
		o.logf("scale-out: %s, %d backends + %d at request %d", so.Workload, so.Backends, so.Added, so.AddedAt)
	}
	if o.OverheadRate > 0 {
		ov, err := measureOverhead(ctx, &o)
		if err != nil {
			return nil, err
		}
		res.Overhead = ov
		o.logf("overhead at %d req/s: direct p50 %.3fms p99 %.3fms, via a bare proxy p50 %.3fms p99 %.3fms, via router p50 %.3fms p99 %.3fms",
			ov.Rate, ov.DirectP50ms, ov.DirectP99ms, ov.HopP50ms, ov.HopP99ms, ov.RouterP50ms, ov.RouterP99ms)
	}
	res.Machine.LoadAvg1E = loadAvg()
	return res, nil
}

// satRounds is how many times over the saturation phase's clients its
// list of requests holds at least. steadyRate counts neither the first
// round of completions (the t=0 burst: every client at once, on a fleet
// that holds nothing) nor the last (the drain); four rounds leave it two
// of sustained load. The phase used to replay the open loop's list: with
// 1000 requests for 512 clients, every completion it measured fell in the
// burst or the drain. Rounds, not a length of time, so the phase's cost
// follows the fleet's size.
const satRounds = 4

// closedClients is the saturation phase's clients.
func (o *Options) closedClients() int {
	perBE := o.ClosedPerBE
	if perBE == 0 {
		perBE = o.Sim.MaxSeqs
	}
	return o.Backends * perBE
}

// replayed is the named workload of n requests as the fleets receive it:
// scheduled (workload) and, with TokenPrompts, as token ids.
func (o *Options) replayed(name string, n int) (Workload, error) {
	w, err := o.workload(name, n)
	if err != nil || !o.TokenPrompts {
		return w, err
	}
	return tokenWorkload(w, o.Sim.CharsPerToken)
}

// workload builds the named workload of n requests (fewer where a trace
// ends first), scheduled at the offered load for Backends backends.
func (o *Options) workload(name string, n int) (Workload, error) {
	var w Workload
	var err error
	switch name {
	case WorkMoonConv, WorkMoonSynth:
		w, err = LoadTrace(o.TracesDir, name, o.TraceOffset, n, o.Sim.Model, o.Sim.CharsPerToken)
	default:
		w, err = Synthetic(name, n, o.Seed, o.Sim.Model, o.Sim.CharsPerToken, o.Sim.KVBlocks*o.Sim.BlockTokens)
	}
	if err != nil {
		return w, err
	}
	// Mixed speeds: the fleet's capacity is its mean backend's times.
	w.Schedule(o.Load, o.Backends, time.Duration(float64(o.Sim.PrefillPerToken)/o.meanSpeed()), o.Seed)
	return w, nil
}

// speed is backend i's speed (Speeds; 1 when not given, as for backends
// a scale-out phase adds).
func (o *Options) speed(i int) float64 {
	if i < len(o.Speeds) {
		return o.Speeds[i]
	}
	return 1
}

// meanSpeed is the mean of the first Backends backends' speeds.
func (o *Options) meanSpeed() float64 {
	sum := 0.0
	for i := range o.Backends {
		sum += o.speed(i)
	}
	return sum / float64(o.Backends)
}

// fairBusiest is busiest over backends whose fair shares follow their
// speeds: each one's figure is taken over its speed first.
func (o *Options) fairBusiest(xs []float64) float64 {
	if len(o.Speeds) == 0 {
		return busiest(xs)
	}
	scaled := make([]float64, len(xs))
	for i, x := range xs {
		scaled[i] = x / o.speed(i)
	}
	return busiest(scaled)
}

// routerConfig is the router configuration the options produce: 0 keeps
// the router's default; anything else, also NaN and negatives, is taken and
// left to Validate.
func (o *Options) routerConfig() router.Config {
	cfg := router.Defaults()
	set := func(dst *float64, v float64) {
		if v != 0 {
			*dst = v
		}
	}
	set(&cfg.LoadFactor, o.LoadFactor)
	set(&cfg.Slack, o.Slack)
	set(&cfg.DecodeWeight, o.DecodeWeight)
	set(&cfg.ShareFactor, o.ShareFactor)
	set(&cfg.BalanceSlack, o.BalanceSlack)
	set(&cfg.HotShare, o.HotShare)
	if o.ShareHalfLife != 0 {
		cfg.ShareHalfLife = o.ShareHalfLife
	}
	if o.SlotsConfigured {
		cfg.MaxNumSeqs = o.Sim.MaxSeqs
	}
	return cfg
}

// runStrategy replays w open loop and, if sat is not nil, sat closed loop.
func runStrategy(ctx context.Context, o *Options, w, sat *Workload, st balance.Strategy) (StrategyResult, error) {
	sr := StrategyResult{Strategy: st}
	began := time.Now()
	client := newClient()
	defer client.CloseIdleConnections()

	clock := llmsim.NewVirtualClock(time.Unix(0, 0))
	f, err := startFleet(ctx, o, o.Backends, virtualSim(o.Sim, clock), st)
	if err != nil {
		return sr, err
	}
	v := newDriver(clock, client, f)
	v.debug = o.RequestsOut != nil
	outs, elapsed, err := v.openLoop(ctx, w.Requests)
	if err != nil {
		f.stop()
		return sr, err
	}
	ttfts := tally(&sr, outs)
	if o.RequestsOut != nil {
		if err := writeRequests(o.RequestsOut, w.Name, &sr, f.simURLs, w.Requests, outs); err != nil {
			f.stop()
			return sr, err
		}
	}
	sr.TTFTp50, sr.TTFTp90, sr.TTFTp95, sr.TTFTp99 = quantile(ttfts, 0.5), quantile(ttfts, 0.9), quantile(ttfts, 0.95), quantile(ttfts, 0.99)
	sr.TTFTs = ttfts
	sr.OpenThroughput = float64(len(ttfts)) / elapsed.Seconds()
	stats, err := scrape(ctx, client, f.simURLs)
	if err != nil {
		f.stop()
		return sr, err
	}
	sr.HitRate, sr.BusiestShare, sr.BusiestWork = stats.hitRate(), o.fairBusiest(stats.requests), o.fairBusiest(stats.computed())
	sr.Reasons, sr.ByReplica = f.reasons()
	learned(&sr, f.routers[0].rt)
	f.stop()
	if sat != nil {
		clock := llmsim.NewVirtualClock(time.Unix(0, 0))
		f, err := startFleet(ctx, o, o.Backends, virtualSim(o.Sim, clock), st)
		if err != nil {
			return sr, err
		}
		v := newDriver(clock, client, f)
		clients := o.closedClients()
		ends, err := v.closedLoop(ctx, sat.Requests, clients)
		if err != nil {
			f.stop()
			return sr, err
		}
		sr.Throughput = steadyRate(ends, clients)
		stats, err := scrape(ctx, client, f.simURLs)
		f.stop()
		if err != nil {
			return sr, err
		}
		sr.SatHitRate = stats.hitRate()
	}
	sr.WallSeconds = time.Since(began).Seconds()
	return sr, nil
}

// learned records in sr what rt learned of its engines' prefill.
func learned(sr *StrategyResult, rt *router.Router) {
	st := rt.Snapshot()
	sr.PrefillOverlap, sr.PrefillSlowdown = st.PrefillOverlap, st.PrefillSlowdown
}
