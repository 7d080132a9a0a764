package balance

import "math"

// SelfTuning places each request where its expected time to first token is
// lowest, by a cost model the router learns per backend from what it
// observes (see Estimate) instead of by thresholds an operator sets:
//
//	cost = TTFT + behind + evict
//
// TTFT is the learned model's prediction for this request on the backend
// (its uncached and cached blocks, the prefill queued there, the requests
// in flight there). behind is what the request costs the ones that will
// queue behind it: the arrivals expected at that backend while it prefills
// (Input.Rate) times the delay one more queued request and its uncached
// blocks add to each of them, by the same model. evict is the cache its
// uncached blocks push out once the backend's cache is full: the cost of
// recomputing them, weighted by how often that backend's cached blocks are
// reused and by Input.EvictWeight.
//
// The bounded-load rule (Bounds over prefill-weighted load, LoadFactor,
// MinBound) stays a safety cap: a backend over it, or one whose engine
// reports too little free KV cache to hold the request, takes it only if
// no other can. Among equal costs the rendezvous score decides, so router
// replicas with the same view agree.
const SelfTuning Strategy = "self-tuning"

// NumFeatures is the length of the feature vector the TTFT model is linear in.
const NumFeatures = 7

// FeatureBlocks scales block counts in the features, so every coefficient
// is of a similar magnitude and a recursive least-squares fit stays well
// conditioned.
const FeatureBlocks = 64

// Features is the vector a backend's time to first byte is modelled as
// linear in: a constant, the request's uncached and cached blocks, the
// uncached blocks queued ahead of it (not yet prefilled), the requests in
// flight there, uncached x in flight (an engine that batches prefills
// with running sequences slows each by how many share a step), and the
// requests there still waiting for their first token (an engine with a
// fixed number of sequence slots queues past them).
func Features(uncached, cached, pending, inflight, prefilling int) [NumFeatures]float64 {
	u := float64(max(uncached, 0)) / FeatureBlocks
	r := float64(max(inflight, 0))
	return [NumFeatures]float64{1, u, float64(max(cached, 0)) / FeatureBlocks, float64(max(pending, 0)) / FeatureBlocks, r, u * r,
		float64(max(prefilling, 0))}
}

// Estimate is what the router knows of one backend's speed and cache for
// the self-tuning strategy.
type Estimate struct {
	// Theta is the learned TTFT model over Features, in seconds (or in
	// any unit shared by every candidate of a decision, before anything
	// was learned). Negative coefficients are read as 0: more work never
	// makes a backend faster.
	Theta [NumFeatures]float64
	// Others is how many requests the engine had in flight (vLLM's
	// num_requests_waiting + running) beyond those this router knew of
	// when it last read them: other routers' traffic. They add to the
	// candidate's Inflight. The engine's count is not used directly: it
	// is seconds old, while the router's own count is current.
	Others int
	// KVFree is how many router blocks the engine's KV cache has free for
	// running requests (from its reported usage); negative: not known. A
	// request needing more uncached blocks than that would be refused or
	// preempted there.
	KVFree int
	// Fill is how full the router's view of its cache is (0..1): at 1,
	// every uncached block evicts one.
	Fill float64
	// Reuse is the fraction of prompt blocks found cached there lately
	// (the engine's prefix cache hit rate, or the router's estimate).
	Reuse float64
	// MinUncached is the least an uncached block may cost there, in
	// Theta's unit per FeatureBlocks blocks (0: no floor); the router
	// sets it to the fleet's fitted price over SpeedBand. A backend's own
	// fit can price its uncached blocks near 0 when the requests it saw
	// had similar features (the constant and the cached blocks take the
	// time instead), and a backend where a miss looks free draws every
	// large uncached prompt until its queue is many seconds long.
	MinUncached float64
}

// TunedCost is one candidate's cost under SelfTuning, in the unit of its
// Estimate's Theta.
type TunedCost struct {
	TTFT, Behind, Evict, Total float64
	// Capped: over its load bound (Over), over ShareFactor x its fair
	// share of recent traffic (OverShare), or too little free KV cache.
	Capped, Over, OverShare bool
}

// coef is the model's coefficient i as the decision reads it: negative,
// infinite and NaN ones as 0 (more work never makes a backend faster),
// an uncached block at least MinUncached, and a cached block at most an
// uncached one (reading a block from the cache never costs more than
// computing it; a fit that says otherwise has mistaken which of two
// features that moved together took the time).
func (e *Estimate) coef(i int) float64 {
	t := e.Theta[i]
	if !(t > 0) || math.IsInf(t, 1) {
		t = 0
	}
	switch i {
	case 1:
		if m := e.MinUncached; m > 0 && !math.IsInf(m, 1) {
			t = max(t, m)
		}
	case 2:
		t = min(t, e.coef(1))
	}
	return t
}

// queueCoef is what a block queued ahead costs: at least what one of the
// request's own uncached blocks does, since the engine prefills it first.
// A fit learns the queue's cost only once queues have formed (until then
// its coefficient stays near 0, and a router that trusted it would pile
// cache hits onto one backend until they do), and it learns it low while
// the requests in flight are partly prefilled: both underestimate the
// wait exactly when the tail is made.
func (e *Estimate) queueCoef() float64 {
	return max(e.coef(3), e.coef(1))
}

// predict is the model's TTFT for feature vector x.
func (e *Estimate) predict(x *[NumFeatures]float64) float64 {
	s := 0.0
	for i := range x {
		c := e.coef(i)
		if i == 3 {
			c = e.queueCoef()
		}
		s += c * x[i]
	}
	return s
}

// maxBehind bounds the arrivals counted as queueing behind one request:
// past it the rate estimate says more about a burst than about the queue.
const maxBehind = 16

// TunedCosts returns each candidate's cost under SelfTuning (see there),
// appended to dst. Candidates without an Estimate cost as prefix-aware
// counts its expected wait: queued plus uncached blocks.
func TunedCosts(in *Input, dst []TunedCost) []TunedCost {
	var boundBuf [64]int
	var shareBuf [64]float64
	bounds := LoadBounds(in.Candidates, in.loadFactor(), in.decodeWeight(), max(in.MinBound, 1), boundBuf[:0])
	shares := tunedShares(in, shareBuf[:0])
	sf := in.shareFactor()
	n := len(in.Keys)
	wsum := 0.0
	for i := range in.Candidates {
		wsum += weight(&in.Candidates[i])
	}
	for i := range in.Candidates {
		c := &in.Candidates[i]
		e := Estimate{Theta: [NumFeatures]float64{0, 1, 0, 1, 0, 0, 0}, KVFree: -1}
		if i < len(in.Estimates) {
			e = in.Estimates[i]
		}
		u, m := in.ScaleKeys(max(n-c.Matched, 0)), in.ScaleKeys(min(max(c.Matched, 0), n))
		x := Features(u, m, c.Pending, c.Inflight+max(e.Others, 0), c.Prefilling)
		var tc TunedCost
		tc.TTFT = e.predict(&x)
		// Each later arrival finds this request's blocks queued and one
		// more request in flight, waiting for its first token.
		delay := e.queueCoef()*float64(u)/FeatureBlocks + e.coef(4) + e.coef(6)
		rate := max(in.Rate, 0) * weight(c) / wsum
		if !math.IsNaN(rate) && !math.IsInf(rate, 0) {
			tc.Behind = min(rate*tc.TTFT, maxBehind) * delay
		}
		if fill := min(max(e.Fill, 0), 1); fill > 0 {
			tc.Evict = max(in.EvictWeight, 0) * min(max(e.Reuse, 0), 1) * fill * fill * e.coef(1) * float64(u) / FeatureBlocks
		}
		tc.Total = tc.TTFT + tc.Behind + tc.Evict
		if math.IsNaN(tc.Total) {
			tc.Total = math.Inf(1)
		}
		tc.Over = load(c, in.decodeWeight())+1 > float64(bounds[i])
		tc.OverShare = shares[i] > sf
		tc.Capped = tc.Over || tc.OverShare || (e.KVFree >= 0 && u > e.KVFree)
		dst = append(dst, tc)
	}
	return dst
}

// tunedShares is each candidate's recent traffic over its fair share,
// where a backend's fair share is in proportion to its weight and to the
// speed its model learned (1 / the cost of an uncached block) relative to
// the candidates' mean: a backend twice as fast as the others should take
// more of their requests. Speeds within SpeedBand of the mean count as
// equal: the fits of equal engines differ by their noise, and shares
// weighted by it would load some backends more for nothing. While any
// candidate's speed is unknown, by weight alone (Shares).
func tunedShares(in *Input, dst []float64) []float64 {
	known := len(in.Estimates) == len(in.Candidates) && len(in.Candidates) > 0
	mean := 0.0
	for i := range in.Estimates {
		known = known && in.Estimates[i].coef(1) > 0
		mean += in.Estimates[i].coef(1) / float64(len(in.Estimates))
	}
	if !known {
		return Shares(in.Candidates, dst)
	}
	speed := func(i int) float64 {
		r := mean / in.Estimates[i].coef(1)
		if r > 1/SpeedBand && r < SpeedBand {
			return 1
		}
		return r
	}
	sum, csum := 0.0, 0.0
	for i := range in.Candidates {
		sum += max(in.Candidates[i].Recent, 0)
		csum += weight(&in.Candidates[i]) * speed(i)
	}
	for i := range in.Candidates {
		s := 0.0
		if sum > 0 {
			s = max(in.Candidates[i].Recent, 0) / sum * csum / (weight(&in.Candidates[i]) * speed(i))
		}
		dst = append(dst, s)
	}
	return dst
}

// SpeedBand is how much faster or slower than the mean a backend's learned
// speed must be for its fair share of traffic to change, and how much
// cheaper than the fleet's a backend's own fit may price an uncached block
// (Estimate.MinUncached).
const SpeedBand = 2

// ScaleKeys converts a count of keys into the estimates' blocks (KeyScale).
func (in *Input) ScaleKeys(k int) int {
	if !(in.KeyScale > 0) || in.KeyScale == 1 {
		return k
	}
	return int(math.Round(float64(k) * min(in.KeyScale, 1e6)))
}

// tieTolerance is how close two costs are, relative to the lower one, to
// count as a tie. The model's terms for requests in flight are fitted
// noise on an engine whose decoding sequences do not slow its prefills,
// and a fraction of a millisecond of it should not decide between two
// backends that cost the same; the one with less recent traffic is the
// better guess (its last prefill started longest ago).
const tieTolerance = 0.02

// decideTuned is SelfTuning's decision.
func decideTuned(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1}
	var costBuf [64]TunedCost
	var boundBuf [64]int
	costs := TunedCosts(&in, costBuf[:0])
	bounds := LoadBounds(in.Candidates, in.loadFactor(), in.decodeWeight(), max(in.MinBound, 1), boundBuf[:0])
	key := RendezvousKey(in.Keys, in.Common, in.RendezvousBlocks)
	rv := func(i int) float64 { return Rendezvous(key, in.Candidates[i].ID, weight(&in.Candidates[i])) }
	less := func(i, j int) bool {
		ci, cj := costs[i].Total, costs[j].Total
		if math.Abs(ci-cj) > tieTolerance*min(ci, cj) {
			return ci < cj
		}
		ri, rj := in.Candidates[i].Recent/weight(&in.Candidates[i]), in.Candidates[j].Recent/weight(&in.Candidates[j])
		if ri != rj {
			return ri < rj
		}
		return rv(i) > rv(j)
	}
	for i := range in.Candidates {
		if !underLimit(&in.Candidates[i]) {
			continue
		}
		if d.Preferred < 0 || less(i, d.Preferred) {
			d.Preferred = i
		}
		if !costs[i].Capped && (d.Pick < 0 || less(i, d.Pick)) {
			d.Pick = i
		}
	}
	if d.Pick < 0 {
		d.Pick = d.Preferred // every backend is capped: the cheapest under its limit
	}
	if d.Pick < 0 {
		d.Full = true
		return d
	}
	p := &in.Candidates[d.Pick]
	d.Bound, d.Matched = bounds[d.Pick], p.Matched
	switch {
	case d.Pick != d.Preferred:
		d.Reason = Overflow
		switch pr := &costs[d.Preferred]; {
		case pr.Over:
			d.Yielded = BoundLoad
		case pr.OverShare:
			d.Yielded = BoundShare
		default:
			d.Yielded = BoundKV
		}
	case p.Matched > in.Common:
		d.Reason = Hit
	default:
		d.Reason = Cold
	}
	return d
}
