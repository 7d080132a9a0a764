package router

// Self-tuning placement (balance.SelfTuning): what the router learns per
// backend to predict a request's time to first byte there, and what it
// reads of the engines' own metrics.
//
// Every streamed request that gets a 2xx answer is one observation: the
// features it was placed with (its uncached and cached blocks as the
// router estimated them, the prefill queued ahead of it, the requests in
// flight; balance.Features) against the time from sending it to the
// backend's first byte. A recursive least-squares fit with forgetting per
// backend, and one over the whole fleet, turn those into the coefficients
// of a linear model: what a cached and an uncached block cost there, what
// a queued block and a request in flight add. RLS needs no tuning of a
// learning rate, follows a backend whose speed changes (the forgetting
// factor weighs the last few hundred observations), and costs a 6x6
// update per request. Outliers (a stalled connection, an answer refused
// with status 200) are bounded: a residual counts at most a few times the
// model's typical error. Until a backend has enough observations of its
// own it is scored with the fleet's fit; until the fleet has, by queued
// plus uncached blocks, prefix-aware's measure.
//
// The engines' metrics (vLLM's num_requests_waiting/running,
// kv_cache_usage_perc, prefix_cache_hits/queries), read every
// EngineMetricsInterval, add what the router cannot see: requests other
// routers sent, how much KV cache is free for running requests, and how
// often cached blocks are reused. They also show an engine's sequence
// slots (the most requests running while others waited), which
// prefix-aware uses where no max_num_seqs is configured.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/warmfleet/warmfleet/router/balance"
)

const (
	// tuneForget is the RLS forgetting factor: an observation's weight
	// halves after about 140 newer ones.
	tuneForget = 0.995
	// tuneP0 is the initial covariance: a weak prior, so the first
	// observations move the fit at once.
	tuneP0 = 100.0
	// tuneMaxTrace bounds the covariance, which forgetting inflates along
	// directions no observation excites (a backend that only ever sees
	// cached prompts): past it the fit stops forgetting.
	tuneMaxTrace = 1e6
	// tuneMinSamples is how many observations a fit needs before its
	// coefficients are used.
	tuneMinSamples = 16
	// tuneClip bounds a residual to this many times the typical one.
	tuneClip = 3.0
	// tuneRateWindow is the time constant of the arrival rate estimate.
	tuneRateWindow = 10 * time.Second
	// maxObservedTTFB bounds an observation: longer is a stall, not a
	// prefill.
	maxObservedTTFB = 10 * time.Minute
)

// ttftModel is one recursive least-squares fit of time to first byte
// (seconds) over balance.Features.
type ttftModel struct {
	theta [balance.NumFeatures]float64
	p     [balance.NumFeatures][balance.NumFeatures]float64
	n     int
	// absErr is the decayed mean absolute residual, the outlier bound's
	// scale.
	absErr float64
}

func newTTFTModel() ttftModel {
	var m ttftModel
	for i := range m.p {
		m.p[i][i] = tuneP0
	}
	return m
}

func (m *ttftModel) predict(x *[balance.NumFeatures]float64) float64 {
	s := 0.0
	for i := range x {
		s += m.theta[i] * x[i]
	}
	return s
}

// observe updates the fit with one observation of y seconds at x.
func (m *ttftModel) observe(x [balance.NumFeatures]float64, y float64) {
	if !(y >= 0 && y <= maxObservedTTFB.Seconds()) {
		return
	}
	e := y - m.predict(&x)
	if m.n >= 4 && m.absErr > 0 {
		// Bounded, and the bound's scale is kept from bounded residuals
		// too, so outliers neither drag the fit nor loosen the bound; a
		// lasting change still gets through, its residuals widening the
		// bound a little with every observation.
		lim := tuneClip * m.absErr
		e = min(max(e, -lim), lim)
	}
	if m.n == 0 {
		m.absErr = math.Abs(e)
	} else {
		m.absErr += (math.Abs(e) - m.absErr) / 32
	}
	const n = balance.NumFeatures
	var px [n]float64
	den := tuneForget
	for i := range n {
		for j := range n {
			px[i] += m.p[i][j] * x[j]
		}
		den += x[i] * px[i]
	}
	if !(den > 0) || math.IsInf(den, 0) {
		return
	}
	trace := 0.0
	for i := range n {
		m.theta[i] += px[i] / den * e
	}
	for i := range n {
		for j := range n {
			m.p[i][j] -= px[i] * px[j] / den
		}
		trace += m.p[i][i]
	}
	if trace < tuneMaxTrace {
		for i := range n {
			for j := range n {
				m.p[i][j] /= tuneForget
			}
		}
	}
	for i := range m.theta {
		if math.IsNaN(m.theta[i]) || math.IsInf(m.theta[i], 0) {
			*m = newTTFTModel() // numerically lost: start over rather than route on garbage
			return
		}
	}
	m.n++
}

// engineStats is what a backend's engine last reported of itself.
type engineStats struct {
	at time.Time // zero: never read
	// others is how many requests the engine had beyond those the router
	// (and its peers) had in flight there at the reading.
	others        int
	kvUsage       float64 // fraction of KV blocks in use by running requests; <0 unknown
	hits, queries float64 // prefix cache counters at the last read
	reuse         float64 // decayed hit rate between reads; <0 unknown
	// slots is the most requests seen running while others waited: the
	// engine's sequence slots (max_num_seqs) as far as it has shown them
	// (0: never seen full).
	slots int
}

// tuneState is one backend's self-tuning state (under Router.mu).
type tuneState struct {
	model  ttftModel
	engine engineStats
}

func newTuneState() tuneState {
	return tuneState{model: newTTFTModel(), engine: engineStats{kvUsage: -1, reuse: -1}}
}

// tuneFleet is the router's self-tuning state (under Router.mu).
type tuneFleet struct {
	pooled ttftModel
	rate   float64 // requests per second, decayed
	last   time.Time
}

// countArrivalLocked updates the arrival rate with one request at now.
func (rt *Router) countArrivalLocked(now time.Time) {
	t := &rt.tune
	if !t.last.IsZero() {
		dt := max(now.Sub(t.last), 0)
		t.rate *= math.Exp(-dt.Seconds() / tuneRateWindow.Seconds())
	}
	t.rate += 1 / tuneRateWindow.Seconds()
	t.last = now
}

// estimatesLocked fills in the self-tuning inputs for members (cands in
// the same order).
func (rt *Router) estimatesLocked(in *balance.Input, members []*backend, exact bool, now time.Time) {
	in.KeyScale = rt.keyScaleLocked(exact)
	learned := rt.tune.pooled.n >= tuneMinSamples
	ests := rt.ests[:0]
	for _, b := range members {
		e := balance.Estimate{Theta: [balance.NumFeatures]float64{0, 1, 0, 1, 0, 0, 0}, KVFree: -1}
		switch {
		case b.tune.model.n >= tuneMinSamples:
			e.Theta = b.tune.model.theta
			// Its own fit may price a miss near 0 (balance.Estimate.MinUncached).
			e.MinUncached = rt.tune.pooled.theta[1] / balance.SpeedBand
		case learned:
			e.Theta = rt.tune.pooled.theta
		}
		e.Fill = rt.heldLocked(b, exact) / float64(max(b.kvSize, 1))
		e.Reuse = b.stats.hitRate()
		if es := &b.tune.engine; rt.engineFresh(es, now) {
			e.Others = es.others
			if es.kvUsage >= 0 {
				e.KVFree = int((1 - min(es.kvUsage, 1)) * float64(b.kvSize))
			}
			if es.reuse >= 0 {
				e.Reuse = es.reuse
			}
		}
		ests = append(ests, e)
	}
	rt.ests = ests
	in.Estimates, in.EvictWeight, in.LoadFactor, in.ShareFactor = ests, rt.cfg.EvictWeight, rt.cfg.TuneLoadFactor, rt.cfg.TuneShareFactor
	if learned {
		// Before the fit is in seconds the rate has no unit to meet.
		in.Rate = rt.tune.rate * math.Exp(-max(now.Sub(rt.tune.last), 0).Seconds()/tuneRateWindow.Seconds())
	}
}

// engineFresh reports whether es was read recently enough to trust.
func (rt *Router) engineFresh(es *engineStats, now time.Time) bool {
	iv := rt.cfg.EngineMetricsInterval
	return !es.at.IsZero() && iv > 0 && now.Sub(es.at) <= 3*iv
}

// keyScaleLocked is how many router blocks one key stands for: 1 for
// the router's own block hashes, less for an engine's (KV events), whose
// blocks hold kv_block_size tokens.
func (rt *Router) keyScaleLocked(exact bool) float64 {
	if !exact {
		return 1
	}
	return float64(rt.cfg.KVBlockSize) * rt.cfg.CharsPerToken / float64(rt.cfg.BlockChars)
}

// featuresLocked is what a request with uncached and cached keys is
// placed with on c (b's candidate): the same view the decision had.
func (rt *Router) featuresLocked(b *backend, c *balance.Candidate, uncached, cached int, exact bool, now time.Time) [balance.NumFeatures]float64 {
	in := balance.Input{KeyScale: rt.keyScaleLocked(exact)}
	uncached, cached = in.ScaleKeys(uncached), in.ScaleKeys(cached)
	inflight := c.Inflight
	if es := &b.tune.engine; rt.engineFresh(es, now) {
		inflight += es.others
	}
	return balance.Features(uncached, cached, c.Pending, inflight, c.Prefilling)
}

// learnLocked records r's time to first byte, d, in its backend's fit and
// the fleet's.
func (rt *Router) learnLocked(r *routed, d time.Duration) {
	if !r.learn {
		return
	}
	r.learn = false
	y := d.Seconds()
	r.b.tune.model.observe(r.feat, y)
	rt.tune.pooled.observe(r.feat, y)
}

// answered is prefilled for an answer with status: a 2xx answer's time to
// first byte teaches the backend's model.
func (rt *Router) answered(r *routed, status int) {
	if status/100 != 2 {
		r.learn, r.clockPrefill, r.clockSeq, r.clockContention = false, false, false, false
	}
	rt.prefilled(r)
}

// logDecisionLocked writes the self-tuning decision's reasoning at debug
// level: each candidate's cost and its terms.
func (rt *Router) logDecisionLocked(in *balance.Input, d *balance.Decision, members []*backend) {
	if !rt.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	costs := balance.TunedCosts(in, nil)
	var sb strings.Builder
	for i, c := range costs {
		if i > 0 {
			sb.WriteString(" ")
		}
		capped := ""
		if c.Capped {
			capped = "(capped)"
		}
		sb.WriteString(members[i].url + "=" + fmtSeconds(c.Total) + "[ttft " + fmtSeconds(c.TTFT) + " behind " + fmtSeconds(c.Behind) +
			" evict " + fmtSeconds(c.Evict) + "]" + capped)
	}
	b := members[d.Pick]
	rt.log.Debug("self-tuning decision", "backend", b.url, "reason", d.Reason, "yielded", d.Yielded, "matched", d.Matched,
		"blocks", len(in.Keys), "learned", b.tune.model.n >= tuneMinSamples, "rate", in.Rate, "costs", sb.String())
}

func fmtSeconds(s float64) string {
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return "inf"
	}
	return strconv.FormatFloat(s, 'g', 4, 64)
}

// learning reports whether the self-tuning fits learn: while a model is
// routed by self-tuning, or when asked to (learn_costs). Each observation
// is two 7x7 updates under the router's lock, and the features and arrival
// rate are computed at every decision for them: not worth it when nothing
// reads the result.
func (c *Config) learning() bool { return c.LearnCosts || c.usesSelfTuning() }

// usesSelfTuning reports whether any model is routed by self-tuning (the
// engines' metrics are only read then).
func (c *Config) usesSelfTuning() bool {
	if c.Strategy == balance.SelfTuning {
		return true
	}
	for _, mc := range c.Models {
		if mc.Strategy == balance.SelfTuning {
			return true
		}
	}
	return false
}

// readsEngines reports whether the engines' metrics are read: for
// self-tuning, and to learn sequence slots no max_num_seqs gives.
func (c *Config) readsEngines() bool {
	return c.EngineMetricsInterval > 0 && (c.usesSelfTuning() || c.MaxNumSeqs == 0)
}

// engineLoop reads every backend's engine metrics each
// EngineMetricsInterval while readsEngines.
func (rt *Router) engineLoop(ctx context.Context) {
	for {
		cfg := rt.Config()
		iv := cfg.EngineMetricsInterval
		if cfg.readsEngines() {
			rt.ReadEngines(ctx)
		} else {
			iv = time.Second // it may be enabled by a reload
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(iv):
		}
	}
}

// ReadEngines reads every backend's engine metrics once and waits for the
// results. A backend whose metrics cannot be read keeps its last reading,
// which ages out (engineFresh).
func (rt *Router) ReadEngines(ctx context.Context) {
	rt.mu.Lock()
	backends := append([]*backend(nil), rt.order...)
	rt.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range backends {
		wg.Go(func() {
			var st EngineStats
			ok := false
			rt.readMetrics(ctx, b.url, func(r io.Reader) { st, ok = ParseEngineStats(r) })
			if !ok {
				return
			}
			rt.mu.Lock()
			defer rt.mu.Unlock()
			es := &b.tune.engine
			reuse := es.reuse
			if dq := st.Queries - es.queries; !es.at.IsZero() && dq > 0 && st.Hits >= es.hits {
				r := min((st.Hits-es.hits)/dq, 1)
				if reuse < 0 {
					reuse = r
				} else {
					reuse += (r - reuse) / 4
				}
			}
			others := max(st.Waiting+st.Running-(b.inflight+b.peers.inflight), 0)
			slots := es.slots
			if st.Waiting > 0 {
				slots = max(slots, st.Running)
			}
			*es = engineStats{at: rt.now(), others: others, kvUsage: st.KVUsage, hits: st.Hits, queries: st.Queries, reuse: reuse, slots: slots}
			rt.slotsLocked(b)
		})
	}
	wg.Wait()
}

// readMetrics hands the body of base's /metrics page to read, if it
// answers 200.
func (rt *Router) readMetrics(ctx context.Context, base string, read func(io.Reader)) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return
	}
	resp, err := rt.probe.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		read(resp.Body)
	}
}

// EngineStats is what ParseEngineStats reads of an engine's metrics.
type EngineStats struct {
	Waiting, Running int
	KVUsage          float64 // -1 when not reported
	Hits, Queries    float64 // prefix cache counters (tokens), 0 when not reported
}

// ParseEngineStats reads vLLM's scheduler and cache metrics from
// Prometheus text (at most maxMetricsBytes): num_requests_waiting and
// num_requests_running (required; summed over their series),
// kv_cache_usage_perc (gpu_cache_usage_perc in older vLLM) and the
// prefix cache hit and query counters (with or without _total, gpu_
// prefixed in older vLLM). ok is false for a page without the request
// counts or with implausible values.
func ParseEngineStats(r io.Reader) (EngineStats, bool) {
	st := EngineStats{KVUsage: -1}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(r, maxMetricsBytes))
	if err != nil {
		return st, false
	}
	sum := func(names ...string) (float64, bool) {
		total, found := 0.0, false
		for _, name := range names {
			for _, m := range fams[name].GetMetric() {
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
				if !(v >= 0 && v < 1e15) {
					return 0, false
				}
				total, found = total+v, true
			}
		}
		return total, found
	}
	w, okW := sum("vllm:num_requests_waiting")
	run, okR := sum("vllm:num_requests_running")
	if !okW || !okR || w > 1e6 || run > 1e6 {
		return st, false
	}
	st.Waiting, st.Running = int(w), int(run)
	if u, ok := sum("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"); ok && u <= 1 {
		st.KVUsage = u
	}
	st.Hits, _ = sum("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits")
	st.Queries, _ = sum("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries")
	if st.Hits > st.Queries {
		st.Hits, st.Queries = 0, 0
	}
	return st, true
}

// tuneMetrics exports every backend's learned model.
type tuneMetrics struct {
	rt      *Router
	cost    *prometheus.Desc
	samples *prometheus.Desc
	absErr  *prometheus.Desc
}

// tuneTerms name the model's coefficients in metrics, in balance.Features
// order, and scale them to one block or one request.
var tuneTerms = [balance.NumFeatures]struct {
	name  string
	scale float64
}{{"request", 1}, {"uncached_block", 1.0 / balance.FeatureBlocks}, {"cached_block", 1.0 / balance.FeatureBlocks},
	{"queued_block", 1.0 / balance.FeatureBlocks}, {"inflight_request", 1}, {"uncached_block_per_inflight_request", 1.0 / balance.FeatureBlocks},
	{"prefilling_request", 1}}

func newTuneMetrics(reg prometheus.Registerer, rt *Router) error {
	m := &tuneMetrics{rt: rt,
		cost: prometheus.NewDesc("warmfleet_router_backend_ttft_cost_seconds",
			"Self-tuning: what each term adds to a request's predicted time to first byte on the backend, as learned from observed ones (term: request, uncached_block, cached_block, queued_block, inflight_request, uncached_block_per_inflight_request, prefilling_request; a block is block_chars prompt bytes).",
			[]string{"backend", "term"}, nil),
		samples: prometheus.NewDesc("warmfleet_router_backend_ttft_samples",
			"Self-tuning: times to first byte observed on the backend (its own model is used from 16 on, the fleet's before).", []string{"backend"}, nil),
		absErr: prometheus.NewDesc("warmfleet_router_backend_ttft_error_seconds",
			"Self-tuning: the backend's model's typical absolute error (decayed mean of recent residuals).", []string{"backend"}, nil),
	}
	if reg == nil {
		return nil
	}
	if err := reg.Register(m); err != nil {
		return fmt.Errorf("router metrics: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (m *tuneMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.cost
	ch <- m.samples
	ch <- m.absErr
}

// Collect implements prometheus.Collector.
func (m *tuneMetrics) Collect(ch chan<- prometheus.Metric) {
	rt := m.rt
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, b := range rt.order {
		md := &b.tune.model
		for i, t := range tuneTerms {
			ch <- prometheus.MustNewConstMetric(m.cost, prometheus.GaugeValue, md.theta[i]*t.scale, b.url, t.name)
		}
		ch <- prometheus.MustNewConstMetric(m.samples, prometheus.GaugeValue, float64(md.n), b.url)
		ch <- prometheus.MustNewConstMetric(m.absErr, prometheus.GaugeValue, md.absErr, b.url)
	}
}
