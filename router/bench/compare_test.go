package bench

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/warmfleet/warmfleet/router/balance"
)

// TestPairedRatioIntervals: the same requests are drawn from both
// strategies, so equal TTFTs give exactly 1 in every resample (drawn
// independently they would not), and a tail of three slow requests makes a
// p99 ratio of 3 whose interval still reaches 1.
func TestPairedRatioIntervals(t *testing.T) {
	ramp := make([]float64, 200)
	for i := range ramp {
		ramp[i] = float64(i+1) / 100
	}
	scaled := func(xs []float64, f float64) []float64 {
		out := slices.Clone(xs)
		for i := range out {
			out[i] *= f
		}
		return out
	}
	slowTail := slices.Clone(ramp)
	for i := len(slowTail) - 3; i < len(slowTail); i++ {
		slowTail[i] *= 3
	}
	withFailures := slices.Clone(ramp)
	for i := 0; i < len(withFailures); i += 2 {
		withFailures[i] = math.NaN()
	}
	allFailed := slices.Repeat([]float64{math.NaN()}, 10)
	for _, tc := range []struct {
		name   string
		a, b   []float64
		q      float64
		lo, hi float64 // want exactly, or a range the interval must reach
		exact  bool
	}{
		{name: "equal", a: ramp, b: slices.Clone(ramp), q: 0.99, lo: 1, hi: 1, exact: true},
		{name: "twice as fast", a: ramp, b: scaled(ramp, 2), q: 0.5, lo: 0.5, hi: 0.5, exact: true},
		{name: "three slow requests", a: slowTail, b: ramp, q: 0.99, lo: 1, hi: 3},
		{name: "failed requests are left out", a: withFailures, b: withFailures, q: 0.9, lo: 1, hi: 1, exact: true},
		{name: "no request succeeded", a: allFailed, b: allFailed, q: 0.5, lo: 0, hi: 0, exact: true},
		{name: "no requests", q: 0.5, lo: 0, hi: 0, exact: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			interval := func() (float64, float64) {
				lo, hi := pairedRatioIntervals(tc.a, [][]float64{tc.b}, []float64{tc.q}, bootstrapRounds, 1)
				return lo[0], hi[0]
			}
			lo, hi := interval()
			if tc.exact && (lo != tc.lo || hi != tc.hi) || !tc.exact && (lo > tc.lo || hi < tc.hi) {
				t.Errorf("interval [%v, %v], want [%v, %v] (exact %v)", lo, hi, tc.lo, tc.hi, tc.exact)
			}
			if lo2, hi2 := interval(); lo2 != lo || hi2 != hi {
				t.Errorf("the same seed gave [%v, %v], then [%v, %v]", lo, hi, lo2, hi2)
			}
		})
	}
}

// TestPairedRatioIntervalsShareResamples: a strategy best at several
// quantiles is resampled once a round, and each quantile gets the interval
// it gets alone.
func TestPairedRatioIntervalsShareResamples(t *testing.T) {
	a, b := make([]float64, 300), make([]float64, 300)
	for i := range a {
		a[i], b[i] = float64(i%17+1), float64(i%23+1)
	}
	qs := []float64{0.5, 0.9, 0.99}
	lo, hi := pairedRatioIntervals(a, [][]float64{b, b, b}, qs, bootstrapRounds, 3)
	for k, q := range qs {
		l, h := pairedRatioIntervals(a, [][]float64{b}, []float64{q}, bootstrapRounds, 3)
		if lo[k] != l[0] || hi[k] != h[0] || lo[k] == 0 {
			t.Errorf("q %v: [%v, %v] together, [%v, %v] alone", q, lo[k], hi[k], l[0], h[0])
		}
	}
}

// TestCompareDefault: the best other strategy is picked per quantile, and
// nothing is compared when the default did not run or ran alone.
func TestCompareDefault(t *testing.T) {
	// res: 100 requests, the last 5 taking tail seconds, the rest body.
	res := func(s balance.Strategy, body, tail float64) StrategyResult {
		ttfts := append(slices.Repeat([]float64{body}, 95), slices.Repeat([]float64{tail}, 5)...)
		return StrategyResult{Strategy: s, ByRequest: ttfts,
			TTFTp50: quantileSorted(ttfts, 0.5), TTFTp90: quantileSorted(ttfts, 0.9), TTFTp99: quantileSorted(ttfts, 0.99)}
	}
	def := balance.PrefixAware
	wr := WorkloadResult{Strategies: []StrategyResult{
		res(def, 1, 4),
		res(balance.LeastOutstanding, 2, 2), // the shortest tail
		res(balance.Random, 0.5, 8),         // the fastest body
	}}
	vs := compareDefault(&wr, def, 7)
	if vs == nil {
		t.Fatal("no comparison")
	}
	for _, c := range []struct {
		name  string
		got   QuantileRatio
		by    balance.Strategy
		ratio float64
	}{
		{"p50", vs.P50, balance.Random, 2},
		{"p90", vs.P90, balance.Random, 2},
		{"p99", vs.P99, balance.LeastOutstanding, 2},
	} {
		if c.got.By != c.by || c.got.Ratio != c.ratio || c.got.Low > c.got.Ratio || c.got.High < c.got.Ratio {
			t.Errorf("%s: %+v, want best by %s, ratio %v inside its interval", c.name, c.got, c.by, c.ratio)
		}
	}
	if s := vs.P99.String(); s != fmt.Sprintf("2.00 [%.2f-%.2f]", vs.P99.Low, vs.P99.High) {
		t.Errorf("p99 printed %q", s)
	}
	if (QuantileRatio{Ratio: 1.5}).String() != "1.50" {
		t.Error("a ratio without an interval should print alone")
	}
	alone := WorkloadResult{Strategies: wr.Strategies[:1]}
	without := WorkloadResult{Strategies: wr.Strategies[1:]}
	if compareDefault(&alone, def, 7) != nil || compareDefault(&without, def, 7) != nil {
		t.Error("compared a default that ran alone or not at all")
	}
}
