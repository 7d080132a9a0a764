package bench

import (
	"fmt"
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
	var others [len(ttftQuantiles)][]float64
	for k, b := range best {
		others[k] = b.ByRequest
	}
	lo, hi := pairedRatioIntervals(p.ByRequest, others[:], ttftQuantiles[:], bootstrapRounds, seed)
	var out [len(ttftQuantiles)]QuantileRatio
	for k, b := range best {
		out[k] = QuantileRatio{By: b.Strategy, Ratio: ratio(p.ttftAt(k), b.ttftAt(k)), Low: lo[k], High: hi[k]}
	}
	return &DefaultVsBest{P50: out[0], P90: out[1], P99: out[2]}
}

// pairedRatioIntervals resamples the request indices of a and of each
// bs[k] (each request's TTFT under two strategies, NaN where it failed)
// with replacement, the same indices for all, and returns for each k the
// 5th and 95th percentiles of quantile(a, qs[k]) / quantile(bs[k], qs[k])
// over rounds resamples. A slice given for several k (the same strategy
// best at several quantiles) is resampled and sorted once a round.
// Resamples with no TTFT on one side, or a zero quantile below, are
// skipped; 0, 0 where none is left.
func pairedRatioIntervals(a []float64, bs [][]float64, qs []float64, rounds int, seed uint64) (lo, hi []float64) {
	lo, hi = make([]float64, len(bs)), make([]float64, len(bs))
	n := len(a)
	// first[k] is the first j with bs[j] the same slice as bs[k].
	first := make([]int, len(bs))
	for k, b := range bs {
		n = min(n, len(b))
		first[k] = slices.IndexFunc(bs[:k+1], func(x []float64) bool { return sameSlice(x, b) })
	}
	if n == 0 || rounds < 1 {
		return lo, hi
	}
	rng := rand.New(rand.NewPCG(seed, 0xb007))
	idx := make([]int, n)
	resample := func(xs, into []float64) []float64 {
		into = into[:0]
		for _, i := range idx {
			if !math.IsNaN(xs[i]) {
				into = append(into, xs[i])
			}
		}
		slices.Sort(into)
		return into
	}
	ra := make([]float64, 0, n)
	rb := make([][]float64, len(bs))
	ratios := make([][]float64, len(bs))
	for range rounds {
		for j := range idx {
			idx[j] = rng.IntN(n)
		}
		ra = resample(a, ra)
		for k, b := range bs {
			if first[k] == k {
				rb[k] = resample(b, rb[k])
			}
			den := rb[first[k]]
			if len(ra) == 0 || len(den) == 0 {
				continue
			}
			if d := quantileSorted(den, qs[k]); d > 0 {
				ratios[k] = append(ratios[k], quantileSorted(ra, qs[k])/d)
			}
		}
	}
	for k, r := range ratios {
		if len(r) > 0 {
			slices.Sort(r)
			lo[k], hi[k] = quantileSorted(r, 0.05), quantileSorted(r, 0.95)
		}
	}
	return lo, hi
}

// sameSlice reports whether x and y are the same slice of the same array.
func sameSlice(x, y []float64) bool {
	return len(x) == len(y) && (len(x) == 0 || &x[0] == &y[0])
}

// String is the ratio and its interval: "1.41 [0.82-2.05]".
func (q QuantileRatio) String() string {
	if q.Low == 0 && q.High == 0 {
		return fmt.Sprintf("%.2f", q.Ratio)
	}
	return fmt.Sprintf("%.2f [%.2f-%.2f]", q.Ratio, q.Low, q.High)
}

// tally counts outs' failures into sr by kind, fills sr.ByRequest (each
// request's TTFT in seconds in arrival order, NaN where it did not
// succeed) and returns the successful requests' TTFTs.
func tally(sr *StrategyResult, outs []outcome) []float64 {
	var ttfts []float64
	sr.ByRequest = make([]float64, len(outs))
	for i := range outs {
		o := &outs[i]
		sr.ByRequest[i] = math.NaN()
		switch {
		case o.err != nil:
			sr.Errors++
		case o.status == http.StatusTooManyRequests:
			sr.Rejected429++
		case o.status == http.StatusServiceUnavailable:
			sr.Rejected503++
		case o.status != http.StatusOK:
			sr.Errors++
		default:
			sr.ByRequest[i] = o.ttft.Seconds()
			ttfts = append(ttfts, sr.ByRequest[i])
		}
	}
	return ttfts
}
