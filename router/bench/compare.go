package bench

import (
	"math"
	"math/rand/v2"
	"net/http"
	"slices"

	"github.com/warmfleet/warmfleet/router/balance"
)

// DefaultVsBest sets the default strategy's TTFT quantiles against the best
// other strategy's in the same run, each with the interval that resampling
// the run's requests gives the ratio. Both strategies served the same
// arrivals (the same trace, the same seed), so a resample draws the same
// requests from each: the interval shows how much of a ratio is which
// requests happened to land in the tail. A p99 of a few hundred requests
// is its few slowest requests, and a ratio whose interval spans 1 says
// nothing either way. The best other is picked on the whole run, so the
// interval is for the ratio against that strategy, not against whichever
// would be best in each resample.
type DefaultVsBest struct {
	P50 QuantileRatio `json:"ttft_p50"`
	P90 QuantileRatio `json:"ttft_p90"`
	P99 QuantileRatio `json:"ttft_p99"`
}

// QuantileRatio is the default's TTFT quantile over the best other's.
type QuantileRatio struct {
	By    balance.Strategy `json:"best_by"`
	Ratio float64          `json:"ratio"`
	// Low and High bound the middle 90% of the ratio over bootstrapRounds
	// resamples of the requests (both 0 when no resample had a TTFT from
	// each strategy: JSON has no NaN).
	Low  float64 `json:"ci90_low"`
	High float64 `json:"ci90_high"`
}

// ttftQuantiles are the quantiles DefaultVsBest compares, in its order.
var ttftQuantiles = [...]float64{0.5, 0.9, 0.99}

// ttftAt is s's TTFT at ttftQuantiles[k].
func (s *StrategyResult) ttftAt(k int) float64 {
	return [len(ttftQuantiles)]float64{s.TTFTp50, s.TTFTp90, s.TTFTp99}[k]
}

// bootstrapRounds is how many resamples the intervals are read from: each
// end of the interval is then read past 50 ratios, and a round costs two
// sorts of the run's TTFTs.
const bootstrapRounds = 1000

// compareDefault returns def against the best other strategy of wr per
// TTFT quantile, or nil when def did not run or ran alone. seed fixes the
// resamples, so a run is reproducible.
func compareDefault(wr *WorkloadResult, def balance.Strategy, seed uint64) *DefaultVsBest {
	p := wr.get(def)
	if p == nil || len(wr.Strategies) < 2 {
		return nil
	}
	var best [len(ttftQuantiles)]*StrategyResult
	for i := range wr.Strategies {
		s := &wr.Strategies[i]
		if s.Strategy == def {
			continue
		}
		for k := range best {
			if best[k] == nil || s.ttftAt(k) < best[k].ttftAt(k) {
				best[k] = s
			}
		}
	}
	var out [len(ttftQuantiles)]QuantileRatio
	for k, b := range best {
		lo, hi := pairedRatioInterval(p.ByRequest, b.ByRequest, ttftQuantiles[k], bootstrapRounds, seed)
		out[k] = QuantileRatio{By: b.Strategy, Ratio: ratio(p.ttftAt(k), b.ttftAt(k)), Low: lo, High: hi}
	}
	return &DefaultVsBest{P50: out[0], P90: out[1], P99: out[2]}
}

// pairedRatioInterval resamples the request indices of a and b (each
// request's TTFT under two strategies, NaN where it failed) with
// replacement, the same indices for both, and returns the 5th and 95th
// percentiles of quantile(a, q) / quantile(b, q) over rounds resamples.
// Resamples with no TTFT on one side, or a zero quantile below, are
// skipped; 0, 0 if none is left.
func pairedRatioInterval(a, b []float64, q float64, rounds int, seed uint64) (lo, hi float64) {
	n := min(len(a), len(b))
	if n == 0 || rounds < 1 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(seed, 0xb007))
	ra, rb := make([]float64, 0, n), make([]float64, 0, n)
	ratios := make([]float64, 0, rounds)
	for range rounds {
		ra, rb = ra[:0], rb[:0]
		for range n {
			i := rng.IntN(n)
			if !math.IsNaN(a[i]) {
				ra = append(ra, a[i])
			}
			if !math.IsNaN(b[i]) {
				rb = append(rb, b[i])
			}
		}
		if len(ra) == 0 || len(rb) == 0 {
			continue
		}
		slices.Sort(ra)
		slices.Sort(rb)
		if den := quantileSorted(rb, q); den > 0 {
			ratios = append(ratios, quantileSorted(ra, q)/den)
		}
	}
	if len(ratios) == 0 {
		return 0, 0
	}
	slices.Sort(ratios)
	return quantileSorted(ratios, 0.05), quantileSorted(ratios, 0.95)
}

// byRequest returns each outcome's TTFT in seconds in request order, NaN
// where the request did not succeed.
func byRequest(outs []outcome) []float64 {
	t := make([]float64, len(outs))
	for i := range outs {
		t[i] = math.NaN()
		if o := &outs[i]; o.err == nil && o.status == http.StatusOK {
			t[i] = o.ttft.Seconds()
		}
	}
	return t
}
