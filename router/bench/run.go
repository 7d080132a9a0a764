package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
	ClosedPerBE   int
	RouterMaxInf  int // router's per-backend concurrency limit (0: none)
	LoadFactor    float64
	Slack         float64 // router slack (0: router default)
	ShareFactor   float64 // router share factor (0: router default)
	DecodeWeight  float64 // router decode weight (0: router default)
	BalanceSlack  float64 // router balance slack (0: router default)
	ShareHalfLife int     // router share half-life in decisions (0: router default)
	HotShare      float64 // router hot-prefix share (0: router default, off)
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

	Progress io.Writer // nil: quiet
}

// DefaultOptions are sized to finish in a few minutes on 2 cores.
func DefaultOptions() Options {
	sim := llmsim.Defaults()
	sim.KVBlocks = 65536 // 1M tokens per backend: a multi-GPU node
	return Options{
		Backends: 8, Load: 0.8, Requests: 1000, Workloads: AllWorkloads(),
		Strategies: []balance.Strategy{balance.Random, balance.LeastOutstanding, balance.PrefixAware},
		TracesDir:  "", Sim: sim, Seed: 1, Saturation: true, Replicas: 1,
		OverheadRate: 1000, OverheadDuration: 2 * time.Second, OverheadRounds: 3,
		DecisionBackends: 64, DecisionPrompt: 16000, DecisionSamples: 20000,
	}
}

// Results is the whole report.
type Results struct {
	Machine   Machine          `json:"machine"`
	Options   OptionsSummary   `json:"options"`
	Workloads []WorkloadResult `json:"workloads"`
	Overhead  *OverheadResult  `json:"overhead,omitempty"`
	Decision  *DecisionResult  `json:"decision,omitempty"`
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
}

// WorkloadResult is one workload under every strategy.
type WorkloadResult struct {
	Name           string           `json:"name"`
	Requests       int              `json:"requests"`
	MeanPrompt     float64          `json:"mean_prompt_tokens"`
	BestReuse      float64          `json:"best_reuse"`          // unlimited cache
	BestReuseFleet float64          `json:"best_reuse_fleet_kv"` // one LRU the size of the whole fleet's KV
	Strategies     []StrategyResult `json:"strategies"`
}

// StrategyResult is one strategy on one workload. Times are simulated seconds.
type StrategyResult struct {
	Strategy       balance.Strategy `json:"strategy"`
	HitRate        float64          `json:"kv_hit_rate"`
	TTFTp50        float64          `json:"ttft_p50_s"`
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
	// TTFTs are the successful requests' TTFTs in seconds (for plots).
	TTFTs []float64 `json:"-"`
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
	if err := o.Sim.Validate(); err != nil {
		return err
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
			Replicas: o.replicas()}}
	tok := llmsim.Tokenizer{CharsPerToken: o.Sim.CharsPerToken, BlockTokens: o.Sim.BlockTokens}
	for _, name := range o.Workloads {
		var w Workload
		var err error
		switch name {
		case WorkMoonConv, WorkMoonSynth:
			w, err = LoadTrace(o.TracesDir, name, o.TraceOffset, o.Requests, o.Sim.Model, o.Sim.CharsPerToken)
		default:
			w, err = Synthetic(name, o.Requests, o.Seed, o.Sim.Model, o.Sim.CharsPerToken, o.Sim.KVBlocks*o.Sim.BlockTokens)
		}
		if err != nil {
			return nil, err
		}
		w.Schedule(o.Load, o.Backends, o.Sim.PrefillPerToken, o.Seed)
		wr := WorkloadResult{Name: name, Requests: len(w.Requests), BestReuse: BestReuse(&w, tok, 0),
			BestReuseFleet: BestReuse(&w, tok, o.Backends*o.Sim.KVBlocks)}
		tokens := 0
		for _, r := range w.Requests {
			tokens += r.PromptTokens
		}
		wr.MeanPrompt = float64(tokens) / float64(len(w.Requests))
		for _, st := range o.Strategies {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			sr, err := runStrategy(ctx, &o, &w, st)
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", name, st, err)
			}
			o.logf("%-22s %-18s hit %.3f (best %.3f)  ttft p50 %.3fs p99 %.3fs  sat %.2f rps  busiest %.2fx  429 %d  503 %d  err %d  %v (%.0fs wall)",
				name, st, sr.HitRate, wr.BestReuse, sr.TTFTp50, sr.TTFTp99, sr.Throughput, sr.BusiestShare, sr.Rejected429, sr.Rejected503, sr.Errors, sr.Reasons, sr.WallSeconds)
			wr.Strategies = append(wr.Strategies, sr)
		}
		res.Workloads = append(res.Workloads, wr)
	}
	if o.DecisionBackends > 0 {
		d, err := measureDecision(o.DecisionBackends, o.DecisionPrompt, o.DecisionSamples, o.Seed)
		if err != nil {
			return nil, err
		}
		res.Decision = d
		o.logf("decision: %d backends, %d-byte prompts: p50 %.1fus p99 %.1fus", d.Backends, d.PromptBytes, d.P50us, d.P99us)
	}
	if o.OverheadRate > 0 {
		ov, err := measureOverhead(ctx, &o)
		if err != nil {
			return nil, err
		}
		res.Overhead = ov
		o.logf("overhead at %d req/s: direct p50 %.3fms p99 %.3fms, via router p50 %.3fms p99 %.3fms", ov.Rate, ov.DirectP50ms, ov.DirectP99ms, ov.RouterP50ms, ov.RouterP99ms)
	}
	res.Machine.LoadAvg1E = loadAvg()
	return res, nil
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
	return cfg
}

// maxReplicas bounds Options.Replicas: each replica is a router with its
// own index, and the phases run them all in this process.
const maxReplicas = 16

func (o *Options) replicas() int { return max(o.Replicas, 1) }

// fleet is N simulators and one or more routers over them, all listening
// on 127.0.0.1.
type fleet struct {
	sims    []*llmsim.Server
	simURLs []string
	routers []replica
	stop    func()
}

// replica is one router and where it listens.
type replica struct {
	rt  *router.Router
	url string
	reg *prometheus.Registry
}

// reasons sums every replica's decisions by reason and, when there are
// several replicas, counts each one's decisions.
func (f *fleet) reasons() (map[string]float64, []float64) {
	out := map[string]float64{}
	var each []float64
	for _, r := range f.routers {
		n := 0.0
		for k, v := range reasons(r.reg) {
			out[k] += v
			if !strings.HasPrefix(k, overflowPrefix) { // overflows are counted under their reason too
				n += v
			}
		}
		if len(f.routers) > 1 {
			each = append(each, n)
		}
	}
	return out, each
}

func serve(h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), func() { _ = srv.Close() }, nil
}

func startFleet(ctx context.Context, o *Options, n int, sim llmsim.Config, st balance.Strategy) (*fleet, error) {
	var sims []*llmsim.Server
	f, err := startFleetWith(ctx, o, n, o.replicas(), st, func() (http.Handler, error) {
		s, err := llmsim.New(sim, prometheus.NewRegistry())
		if err == nil {
			sims = append(sims, s)
		}
		return s, err
	})
	if err != nil {
		return nil, err
	}
	f.sims = sims
	return f, nil
}

// startFleetWith starts n backends from newBackend and the given number of
// router replicas over them.
func startFleetWith(ctx context.Context, o *Options, n, replicas int, st balance.Strategy, newBackend func() (http.Handler, error)) (*fleet, error) {
	f := &fleet{}
	var stops []func()
	f.stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	cfg := o.routerConfig()
	cfg.Strategy = st
	// No router-side limit by default: simulators queue like vLLM does, and
	// the router queue waits in wall time, which a virtual clock cannot see.
	cfg.MaxInflight = o.RouterMaxInf
	cfg.CharsPerToken = float64(o.Sim.CharsPerToken)
	cfg.QueueTimeout = 60 * time.Second
	cfg.ProbeInterval = -1 // probed once below; later probes would only add noise
	cfg.RampUp = 0
	for i := range n {
		h, err := newBackend()
		if err != nil {
			f.stop()
			return nil, err
		}
		u, stop, err := serve(h)
		if err != nil {
			f.stop()
			return nil, err
		}
		stops = append(stops, stop)
		f.simURLs = append(f.simURLs, u)
		// Rendezvous by name, not by the ephemeral port: the same seed
		// then makes the same decisions.
		cfg.Backends = append(cfg.Backends, router.BackendConfig{URL: u, ID: fmt.Sprintf("sim-%d", i)})
	}
	for i := range replicas {
		var onEvent func(router.Event)
		if o.ReplicaSync && replicas > 1 {
			// Synchronous: every replica knows of a request before it
			// reaches its backend, so the replay stays reproducible.
			from := strconv.Itoa(i)
			onEvent = func(e router.Event) {
				for j, r := range f.routers {
					if j != i {
						r.rt.Observe(from, e)
					}
				}
			}
		}
		r, stop, err := startRouter(ctx, cfg, o.Seed, uint64(i), onEvent)
		if err != nil {
			f.stop()
			return nil, err
		}
		stops = append(stops, stop)
		f.routers = append(f.routers, r)
	}
	return f, nil
}

// startRouter runs one router replica over cfg's backends. Each draws its
// own random numbers (the random strategy's, under its own lock).
func startRouter(ctx context.Context, cfg router.Config, seed, index uint64, onEvent func(router.Event)) (replica, func(), error) {
	src := router.NewStaticSource(router.StaticEndpoints(&cfg), nil)
	reg := prometheus.NewRegistry()
	rng := rand.New(rand.NewPCG(seed, 0x62656e6368+index))
	rt, err := router.New(cfg, router.Options{Source: src, HashKey: prefix.KeyFromBytes([]byte("bench")), Rand: rng.Uint64,
		Logger: slog.New(slog.DiscardHandler), Registry: reg, OnEvent: onEvent})
	if err != nil {
		return replica{}, nil, err
	}
	rt.ProbeOnce(ctx) // learn each backend's KV size before traffic
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = rt.Run(rctx); close(done) }()
	u, stopServe, err := serve(rt)
	if err != nil {
		cancel()
		<-done
		return replica{}, nil, err
	}
	return replica{rt: rt, url: u, reg: reg}, func() { stopServe(); cancel(); <-done }, nil
}

// newClient is the load generator's client. It runs in the router's process,
// so its garbage (net's generic copy allocates a buffer per request body that
// does not fit the write buffer) would trigger collections that stall the
// router being measured: bodies up to 64 KiB are copied into the buffer.
func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 4096, DisableCompression: true,
		IdleConnTimeout: time.Minute, WriteBufferSize: 64 << 10}}
}

func runStrategy(ctx context.Context, o *Options, w *Workload, st balance.Strategy) (StrategyResult, error) {
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
	outs, elapsed, err := v.openLoop(ctx, w.Requests)
	if err != nil {
		f.stop()
		return sr, err
	}
	var ttfts []float64
	for _, out := range outs {
		switch {
		case out.err != nil:
			sr.Errors++
		case out.status == http.StatusTooManyRequests:
			sr.Rejected429++
		case out.status == http.StatusServiceUnavailable:
			sr.Rejected503++
		case out.status != http.StatusOK:
			sr.Errors++
		default:
			ttfts = append(ttfts, out.ttft.Seconds())
		}
	}
	sr.TTFTp50, sr.TTFTp95, sr.TTFTp99 = quantile(ttfts, 0.5), quantile(ttfts, 0.95), quantile(ttfts, 0.99)
	sr.TTFTs = ttfts
	sr.OpenThroughput = float64(len(ttfts)) / elapsed.Seconds()
	stats, err := scrape(ctx, client, f.simURLs)
	if err != nil {
		f.stop()
		return sr, err
	}
	sr.HitRate, sr.BusiestShare, sr.BusiestWork = stats.hitRate(), busiest(stats.requests), busiest(stats.computed())
	sr.Reasons, sr.ByReplica = f.reasons()
	f.stop()
	if o.Saturation {
		clock := llmsim.NewVirtualClock(time.Unix(0, 0))
		f, err := startFleet(ctx, o, o.Backends, virtualSim(o.Sim, clock), st)
		if err != nil {
			return sr, err
		}
		v := newDriver(clock, client, f)
		perBE := o.ClosedPerBE
		if perBE == 0 {
			perBE = o.Sim.MaxSeqs
		}
		ends, err := v.closedLoop(ctx, w.Requests, o.Backends*perBE)
		if err != nil {
			f.stop()
			return sr, err
		}
		sr.Throughput = steadyRate(ends)
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

// virtualSim makes a simulator config run on clock: no wall-time scaling,
// and decode in one step (only the first and last byte matter to routing).
func virtualSim(c llmsim.Config, clock *llmsim.VirtualClock) llmsim.Config {
	c.Clock = clock
	c.TimeScale = 1
	c.ChunkInterval = 24 * time.Hour
	return c
}

// driver replays requests in virtual time over real HTTP: it advances the
// clock to the next arrival or simulator timer only once every request and
// response in transit has landed (motion zero), so the router sees exactly
// the in-flight state it would at that instant, however loaded the machine.
type driver struct {
	clock   *llmsim.VirtualClock
	client  *http.Client
	routers []replica
	sent    int // requests started so far: the next goes to replica sent mod len(routers)
	// open counts requests sent whose answer has not ended at the client.
	// Once a response's last byte lands the client is idle, but the
	// router may not have released the backend yet: quiet waits until
	// every open request is queued in or held by the router, so the next
	// decision sees the in-flight counts of this instant, not a race.
	open atomic.Int64
}

func newDriver(clock *llmsim.VirtualClock, client *http.Client, f *fleet) *driver {
	return &driver{clock: clock, client: client, routers: f.routers}
}

// held is how many requests the routers hold: queued for a backend, or
// sent to one and not yet released.
func (d *driver) held() (queued, inflight int64) {
	for _, r := range d.routers {
		queued += int64(r.rt.Queued())
		inflight += int64(r.rt.InFlight())
	}
	return queued, inflight
}

// start sends r in the background. It counts as motion, and as open,
// until its answer has ended and done has run.
func (d *driver) start(ctx context.Context, wg *sync.WaitGroup, r *Request, done func(outcome)) {
	d.open.Add(1)
	d.clock.Busy(1)
	base := d.routers[d.sent%len(d.routers)].url
	d.sent++
	wg.Go(func() {
		done(d.send(ctx, base, r))
		d.open.Add(-1)
		d.clock.Idle()
	})
}

// quiet waits until nothing is in motion at the current instant.
func (d *driver) quiet(ctx context.Context) error {
	watchdog := time.Now().Add(2 * time.Minute)
	zeros := 0
	for {
		queued, inflight := d.held()
		m := d.clock.Motion() - queued
		switch {
		case m < 0:
			return fmt.Errorf("bench: virtual clock accounting went negative (%d)", m)
		case m == 0 && inflight+queued == d.open.Load():
			// Seen idle several times in a row, with the scheduler given a
			// chance to run anything just woken.
			if zeros++; zeros >= 3 {
				return nil
			}
			runtime.Gosched()
			continue
		}
		zeros = 0
		if time.Now().After(watchdog) || ctx.Err() != nil {
			return fmt.Errorf("bench: stuck with %d in motion: %w", m, context.Cause(ctx))
		}
		time.Sleep(20 * time.Microsecond)
	}
}

type outcome struct {
	status int
	ttft   time.Duration // to the first body byte (virtual, or wall for sendReal)
	end    time.Time
	err    error
}

// send posts one request whose Busy the caller (start) counted, reads the
// whole answer, and leaves the last Idle to the caller.
func (d *driver) send(ctx context.Context, base string, r *Request) outcome {
	start := d.clock.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return outcome{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	fromSim := resp.Header.Get("X-Llmsim") != ""
	out := outcome{status: resp.StatusCode}
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 && out.ttft == 0 {
			out.ttft = max(d.clock.Now().Sub(start), time.Nanosecond)
			if fromSim {
				d.clock.Idle() // the first byte landed
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				out.err = err
			}
			out.end = d.clock.Now()
			return out
		}
	}
}

// openLoop sends each request at its arrival time.
func (d *driver) openLoop(ctx context.Context, reqs []Request) ([]outcome, time.Duration, error) {
	outs := make([]outcome, len(reqs))
	t0 := d.clock.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	next := 0
	for {
		if err := d.quiet(ctx); err != nil {
			return nil, 0, err
		}
		timer, hasTimer := d.clock.Next()
		if next < len(reqs) && (!hasTimer || !t0.Add(reqs[next].At).After(timer)) {
			// One arrival at a time, even at the same instant: each
			// decision then sees the one before it, in trace order.
			d.clock.AdvanceTo(t0.Add(reqs[next].At))
			i := next
			d.start(ctx, &wg, &reqs[i], func(o outcome) { outs[i] = o })
			next++
			continue
		}
		if !hasTimer {
			break
		}
		d.clock.AdvanceTo(timer)
	}
	wg.Wait()
	last := t0
	for _, o := range outs {
		if o.end.After(last) {
			last = o.end
		}
	}
	return outs, max(last.Sub(t0), time.Nanosecond), nil
}

// steadyRate is completions per second over the middle half of the
// completions (sorted offsets from the start): the ramp-up, when every client
// sends at once, and the drain, when the last stragglers run on an otherwise
// idle fleet, say nothing about capacity. 0 with fewer than 4 completions.
func steadyRate(ends []time.Duration) float64 {
	if len(ends) < 4 {
		return 0
	}
	ends = slices.Clone(ends)
	slices.Sort(ends)
	lo, hi := len(ends)/4, len(ends)*3/4
	return float64(hi-lo) / max(ends[hi]-ends[lo], time.Nanosecond).Seconds()
}

// closedLoop keeps `clients` requests outstanding until the list is done
// and returns when each successful one ended (virtual time since the start).
// A client whose request ended sends the next one only at quiet, one at a
// time in list order, like openLoop's arrivals: requests ending at the same
// instant would otherwise race to the router, and the same seed would not
// give the same decisions.
func (d *driver) closedLoop(ctx context.Context, reqs []Request, clients int) ([]time.Duration, error) {
	var mu sync.Mutex
	var ends []time.Duration
	freed := 0 // clients whose request ended since the last look
	t0 := d.clock.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	idle, next := clients, 0
	for {
		if err := d.quiet(ctx); err != nil {
			return nil, err
		}
		mu.Lock()
		idle += freed
		freed = 0
		mu.Unlock()
		if idle > 0 && next < len(reqs) {
			d.start(ctx, &wg, &reqs[next], func(out outcome) {
				mu.Lock()
				defer mu.Unlock()
				if out.err == nil && out.status == http.StatusOK {
					ends = append(ends, d.clock.Now().Sub(t0))
				}
				freed++
			})
			idle--
			next++
			continue
		}
		timer, ok := d.clock.Next()
		if !ok {
			break
		}
		d.clock.AdvanceTo(timer)
	}
	wg.Wait()
	return ends, nil
}

// sendReal posts one request in wall-clock time (overhead phase).
func sendReal(ctx context.Context, c *http.Client, base string, r *Request) outcome {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return outcome{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	out := outcome{status: resp.StatusCode}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		out.err = err
	}
	out.ttft = time.Since(start)
	return out
}

const overflowPrefix = "overflow/"

// reasons sums the router's decisions by reason, and its overflows by the
// bound that caused them ("overflow/load", say).
func reasons(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	fams, err := reg.Gather()
	if err != nil {
		return out
	}
	series := map[string]struct{ label, prefix string }{
		"warmfleet_router_decisions_total": {"reason", ""},
		"warmfleet_router_overflows_total": {"bound", overflowPrefix},
	}
	for _, f := range fams {
		s, ok := series[f.GetName()]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == s.label {
					out[s.prefix+l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

type simStats struct {
	hits, queries []float64
	requests      []float64
}

func (s simStats) hitRate() float64 {
	h, q := 0.0, 0.0
	for i := range s.hits {
		h += s.hits[i]
		q += s.queries[i]
	}
	if q == 0 {
		return 0
	}
	return h / q
}

// computed is each backend's prompt tokens not served from its cache.
func (s simStats) computed() []float64 {
	out := make([]float64, len(s.queries))
	for i := range s.queries {
		out[i] = s.queries[i] - s.hits[i]
	}
	return out
}

// busiest is the largest value over the mean.
func busiest(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	top, sum := 0.0, 0.0
	for _, r := range xs {
		top = max(top, r)
		sum += r
	}
	if sum == 0 {
		return 0
	}
	return top / (sum / float64(len(xs)))
}

// scrape reads the simulators' own vLLM-style metrics over HTTP.
func scrape(ctx context.Context, c *http.Client, urls []string) (simStats, error) {
	var st simStats
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		if err != nil {
			return st, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return st, fmt.Errorf("scrape %s: %w", u, err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return st, fmt.Errorf("scrape %s: %w", u, err)
		}
		sum := func(name string) float64 {
			total := 0.0
			if f := fams[name]; f != nil {
				for _, m := range f.GetMetric() {
					total += m.GetCounter().GetValue()
				}
			}
			return total
		}
		st.hits = append(st.hits, sum("vllm:prefix_cache_hits_total"))
		st.queries = append(st.queries, sum("vllm:prefix_cache_queries_total"))
		st.requests = append(st.requests, sum("vllm:request_success_total"))
	}
	return st, nil
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}
