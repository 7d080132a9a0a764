package balance

import (
	"math"
	"testing"
)

// theta is a learned model in seconds: 10 ms per request, 100 ms per 64
// uncached blocks, 1 ms per 64 cached, 100 ms per 64 blocks queued ahead,
// 5 ms per request in flight.
var theta = [NumFeatures]float64{0.01, 0.1, 0.001, 0.1, 0.005, 0, 0}

func est(fill, reuse float64) Estimate {
	return Estimate{Theta: theta, KVFree: -1, Fill: fill, Reuse: reuse}
}

func TestDecideTuned(t *testing.T) {
	k := keys(3, 128)
	tests := []struct {
		name    string
		setup   func(c []Candidate, e []Estimate, in *Input)
		want    int
		reason  Reason
		yielded Bound
		full    bool
	}{
		{name: "a deep queue costs more than recomputing the prompt elsewhere", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending, c[0].Inflight, c[0].Prefilling = 128, 640, 4, 4
		}, want: 1, reason: Cold},
		{name: "a short queue is worth the cached prompt", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending, c[0].Inflight, c[0].Prefilling = 128, 64, 1, 1
		}, want: 0, reason: Hit},
		{name: "other routers' requests on the engine count", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched = 128
			e[0].Others = 48 // 48 x 5 ms
		}, want: 1, reason: Cold},
		{name: "without arrivals the faster first token wins", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending = 96, 128
		}, want: 1, reason: Cold},
		{name: "under traffic a miss costs the requests behind it", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending = 96, 128
			in.Rate = 20
		}, want: 0, reason: Hit},
		{name: "evicting a reused full cache costs", setup: func(c []Candidate, e []Estimate, in *Input) {
			e[0], e[1] = est(1, 0.8), est(0.2, 0.8)
			in.EvictWeight = 1
		}, want: 1, reason: Cold},
		{name: "evicting a reused full cache costs, the other way round", setup: func(c []Candidate, e []Estimate, in *Input) {
			e[0], e[1] = est(0.2, 0.8), est(1, 0.8)
			in.EvictWeight = 1
		}, want: 0, reason: Cold},
		{name: "the load bound caps the cheapest", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Inflight, c[0].Prefilling = 128, 3, 3
			e[0].Theta[4] = 0
		}, want: 1, reason: Overflow, yielded: BoundLoad},
		{name: "a queue the fit has not priced yet costs at least what the prompt's own uncached blocks do", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending = 128, 640
			e[0].Theta[3], e[1].Theta[3] = 0, 0 // no queue seen yet: the fit left it at its start
		}, want: 1, reason: Cold},
		{name: "a queue priced below an uncached block still costs one", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending = 128, 192
			e[0].Theta[3], e[1].Theta[3] = 0.02, 0.02
		}, want: 1, reason: Cold},
		{name: "a queue priced above an uncached block costs its price", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Pending = 128, 96 // 96 x 0.2 > 128 x 0.1: recomputing is cheaper
			e[0].Theta[3], e[1].Theta[3] = 0.2, 0.2
		}, want: 1, reason: Cold},
		{name: "over the share factor x its fair share of recent traffic it yields", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Recent, c[1].Recent = 128, 13, 7 // 1.3 x fair
			in.ShareFactor = 1.2
		}, want: 1, reason: Overflow, yielded: BoundShare},
		{name: "a backend the model finds faster has a larger fair share", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Recent, c[1].Recent = 128, 13, 7 // 1.3 x fair by count, 0.87 x by speed
			e[0].Theta[1] = 0.02
			in.ShareFactor = 1.2
		}, want: 0, reason: Hit},
		{name: "speeds within the band of the mean are equal: noise in the fits moves no share", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Recent, c[1].Recent = 128, 13, 7
			e[0].Theta[1] = 0.06
			in.ShareFactor = 1.2
		}, want: 1, reason: Overflow, yielded: BoundShare},
		{name: "within the share factor it keeps its cached prompt", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Recent, c[1].Recent = 128, 11, 9 // 1.1 x fair
			in.ShareFactor = 1.2
		}, want: 0, reason: Hit},
		{name: "costs within the tie tolerance: the backend with less recent traffic", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Inflight, c[0].Recent, c[1].Recent = 1, 1, 1.1
			e[0].Theta[4], e[1].Theta[4] = 0.001, 0.001 // 0.211 s against 0.210 s
		}, want: 0, reason: Cold},
		{name: "costs beyond the tie tolerance: the cheaper, whatever its traffic", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Inflight, c[0].Recent, c[1].Recent = 1, 1, 1.1
			e[0].Theta[4], e[1].Theta[4] = 0.01, 0.01 // 0.220 s against 0.210 s
		}, want: 1, reason: Cold},
		{name: "a fit that prices a miss near 0 is held to the fleet's price over SpeedBand", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Pending = 96 // 0.15 s queued: with misses at 0.001 per 64 blocks it would look cheaper than the idle one
			e[0].Theta[1] = 0.001
			e[0].MinUncached, e[1].MinUncached = 0.05, 0.05
		}, want: 1, reason: Cold},
		{name: "a fit that prices a cached block above an uncached one: it costs no more than one", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[1].Pending = 128, 32
			e[0].Theta[2] = 0.5 // read as 0.1: the whole prompt cached costs what computing it would, less than computing it behind a queue
		}, want: 0, reason: Hit},
		{name: "too little free KV cache caps it", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, e[0].KVFree = 120, 4
		}, want: 1, reason: Overflow, yielded: BoundKV},
		{name: "every backend capped: the cheapest under its limit", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, e[0].KVFree, e[1].KVFree = 64, 0, 0
		}, want: 0, reason: Hit},
		{name: "at its own limit it is skipped", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched, c[0].Inflight, c[0].Limit = 128, 1, 1
		}, want: 1, reason: Cold},
		{name: "all at their limits: full", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Inflight, c[0].Limit, c[1].Inflight, c[1].Limit = 1, 1, 2, 2
		}, want: -1, full: true},
		{name: "negative, infinite and NaN coefficients read as none", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[0].Matched = 128
			e[0].Theta = [NumFeatures]float64{math.NaN(), math.Inf(1), -5, math.Inf(-1), 0, 0, 0}
			e[1].Theta[0] = math.NaN()
		}, want: 0, reason: Hit},
		{name: "router blocks: queued blocks are worth the cached half", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[1].Matched, c[1].Pending = 64, 40
		}, want: 1, reason: Hit},
		{name: "engine blocks (KV events) a quarter the size: the same keys cost less to recompute", setup: func(c []Candidate, e []Estimate, in *Input) {
			c[1].Matched, c[1].Pending = 64, 40
			in.KeyScale = 0.25
		}, want: 0, reason: Cold},
		{name: "no estimates: queued plus uncached blocks, as prefix-aware counts", setup: func(c []Candidate, e []Estimate, in *Input) {
			in.Estimates = nil
			c[0].Matched, c[0].Pending = 100, 20 // 48 vs 128
		}, want: 0, reason: Hit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cands(2)
			e := []Estimate{est(0, 0), est(0, 0)}
			in := Input{Strategy: SelfTuning, Candidates: c, Keys: k, Estimates: e, MinBound: 2}
			tt.setup(c, e, &in)
			d := Decide(in)
			if d.Pick != tt.want || d.Full != tt.full || (tt.want >= 0 && (d.Reason != tt.reason || d.Yielded != tt.yielded)) {
				t.Fatalf("got pick %d reason %s yielded %q full %v; want %d %s %q %v (costs %+v)", d.Pick, d.Reason, d.Yielded, d.Full,
					tt.want, tt.reason, tt.yielded, tt.full, TunedCosts(&in, nil))
			}
			if tt.want >= 0 && d.Matched != c[tt.want].Matched {
				t.Fatalf("matched %d, want %d", d.Matched, c[tt.want].Matched)
			}
		})
	}
}

// Equal costs are broken by rendezvous on the request's key: replicas
// agree, and cold groups spread instead of all going to the first backend.
func TestDecideTunedTieSpreads(t *testing.T) {
	c := cands(4)
	e := []Estimate{est(0, 0), est(0, 0), est(0, 0), est(0, 0)}
	seen := map[int]int{}
	for g := range 64 {
		in := Input{Strategy: SelfTuning, Candidates: c, Keys: keys(uint64(100+g), 8), Estimates: e}
		d, again := Decide(in), Decide(in)
		if d.Pick != again.Pick {
			t.Fatalf("group %d: %d then %d", g, d.Pick, again.Pick)
		}
		seen[d.Pick]++
	}
	if len(seen) != 4 {
		t.Fatalf("64 cold groups went to %v, want all 4 backends", seen)
	}
}

func TestFeatures(t *testing.T) {
	got := Features(128, 64, -5, 3, 2)
	want := [NumFeatures]float64{1, 2, 1, 0, 3, 6, 2}
	if got != want {
		t.Fatalf("Features = %v, want %v", got, want)
	}
}
