// Package balance holds the routing decision as a pure function: given the
// eligible backends (their load, limits, ramp-up weight, warm flag and how
// much of the request's prefix each is expected to hold) it picks one and
// says why. No IO, no clock, no randomness of its own, so every rule is
// table-tested and several router replicas given the same view agree.
package balance

import (
	"fmt"
	"math"
)

// Strategy selects how requests for a model are spread.
type Strategy string

// The strategies.
const (
	Random           Strategy = "random"
	LeastOutstanding Strategy = "least-outstanding"
	PrefixAware      Strategy = "prefix-aware"
)

// ParseStrategy validates a strategy name.
func ParseStrategy(s string) (Strategy, error) {
	switch st := Strategy(s); st {
	case Random, LeastOutstanding, PrefixAware:
		return st, nil
	}
	return "", fmt.Errorf("unknown strategy %q (want prefix-aware, least-outstanding or random)", s)
}

// Reason says why a backend was chosen.
type Reason string

// Reasons. Hit: the backend expected to hold the longest prefix beyond what
// every backend holds. Cold: no backend holds more than the common prefix,
// so rendezvous hashing decided. Overflow: the preferred backend was at its
// load bound or limit, the next best by the same score took it. Retry: an
// earlier attempt could not be sent. Random/Least: the other strategies.
const (
	Hit      Reason = "hit"
	Cold     Reason = "cold"
	Overflow Reason = "overflow"
	Retry    Reason = "retry"
	Rand     Reason = "random"
	Least    Reason = "least"
)

// Candidate is one eligible backend as the decision sees it.
type Candidate struct {
	ID       uint64  // stable identity for rendezvous hashing
	Inflight int     // requests in flight now
	Limit    int     // own concurrency limit; 0 means none
	Weight   float64 // share of traffic relative to a settled backend: (0,1], lower while ramping up
	Warm     bool    // its node holds the model weights locally
	Matched  int     // leading prompt blocks it is expected to hold
	// Pending is the prompt blocks sent to it that it has not finished
	// prefilling (the router's estimate): in-flight counts say little about
	// LLM load because most in-flight time is decode.
	Pending int
}

// Input is everything one decision depends on.
type Input struct {
	Strategy   Strategy
	LoadFactor float64 // c in ceil(c x mean in-flight); 1.25 if <= 1
	// MinBound is a floor under every load bound: at low load the bare rule
	// (ceil(1.25 x 2 / 8) = 1) would push a second request off the backend
	// holding its prefix although that backend is nearly idle. 1 if zero.
	MinBound   int
	Candidates []Candidate
	// Keys are the request's chained block hashes (may be empty).
	Keys []uint64
	// Common is how many leading blocks every backend holds (a system prompt
	// everybody has seen): matching them says nothing about where to go.
	Common int
	// RendezvousBlocks is how many blocks past Common the cold-path key
	// covers; 16 if zero.
	RendezvousBlocks int
	// Slack is how much longer (as a fraction of the request's blocks) the
	// expected wait for the first token (pending prefill + own uncached
	// blocks) may be on a backend than on the best one, and still let
	// prefix affinity or rendezvous decide. 0.5 if zero; negative: none.
	Slack float64
	Rand  uint64 // caller-supplied randomness (random strategy, tie-breaks)
	Retry bool   // this is a second or later attempt
}

// Decision is the outcome.
type Decision struct {
	Pick      int // index into Candidates; -1 when none can take the request
	Preferred int // best by score ignoring load (prefix-aware), else Pick
	Reason    Reason
	Bound     int  // the pick's load bound (prefix-aware)
	Full      bool // no candidate is below its own limit: queue or refuse
	Matched   int  // blocks the pick is expected to hold
}

func (in *Input) loadFactor() float64 {
	if in.LoadFactor <= 1 {
		return 1.25
	}
	return in.LoadFactor
}

func weight(c *Candidate) float64 {
	if c.Weight <= 0 || math.IsNaN(c.Weight) {
		return 1e-3
	}
	return min(c.Weight, 1)
}

func underLimit(c *Candidate) bool { return c.Limit <= 0 || c.Inflight < c.Limit }

// Bounds returns each candidate's load bound: ceil(c x (total+1) x w / sum w),
// the bounded-load rule (Mirrokni et al.) with the new request counted and
// shares scaled by ramp-up weight, but at least minBound. Some candidate is
// always below its bound.
func Bounds(cands []Candidate, c float64, minBound int, dst []int) []int {
	total, wsum := 0, 0.0
	for i := range cands {
		total += cands[i].Inflight
		wsum += weight(&cands[i])
	}
	for i := range cands {
		b := int(math.Ceil(c * float64(total+1) * weight(&cands[i]) / wsum))
		dst = append(dst, max(b, minBound, 1))
	}
	return dst
}

// mix is a 64-bit finaliser (splitmix64) for rendezvous scores.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Rendezvous is the weighted rendezvous score of a backend for key: the
// highest score wins, and a backend's share of keys is proportional to w.
func Rendezvous(key, id uint64, w float64) float64 {
	u := (float64(mix(key^mix(id))>>11) + 0.5) / (1 << 53)
	return -w / math.Log(u)
}

// RendezvousKey is the cold-path key: the chain hash a few blocks past the
// common prefix, so a long prefix every request shares does not map all
// traffic to one backend, while requests sharing their first distinct
// blocks still agree.
func RendezvousKey(keys []uint64, common, extra int) uint64 {
	if len(keys) == 0 {
		return 0
	}
	if extra <= 0 {
		extra = 16
	}
	return keys[min(len(keys), common+extra)-1]
}

// Decide picks a backend.
func Decide(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1}
	if len(in.Candidates) == 0 {
		return d
	}
	switch in.Strategy {
	case Random:
		d = decideRandom(in)
	case LeastOutstanding:
		d = decideLeast(in)
	default:
		d = decidePrefix(in)
	}
	if in.Retry && d.Pick >= 0 {
		d.Reason = Retry
	}
	return d
}

func decideRandom(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1, Reason: Rand}
	wsum := 0.0
	for i := range in.Candidates {
		if underLimit(&in.Candidates[i]) {
			wsum += weight(&in.Candidates[i])
		}
	}
	if wsum == 0 {
		d.Full = true
		return d
	}
	target := float64(in.Rand>>11) / (1 << 53) * wsum
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if !underLimit(c) {
			continue
		}
		d.Pick = i
		if target -= weight(c); target < 0 {
			break
		}
	}
	d.Preferred = d.Pick
	d.Matched = in.Candidates[d.Pick].Matched
	return d
}

func decideLeast(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1, Reason: Least}
	bestLoad, bestTie := math.Inf(1), -1.0
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if !underLimit(c) {
			continue
		}
		load := float64(c.Inflight+1) / weight(c)
		if c.Warm {
			load -= 1e-9 // among equals, warm first
		}
		tie := Rendezvous(in.Rand, c.ID, 1) // random tie-break: no worker-0 bias
		if load < bestLoad || (load == bestLoad && tie > bestTie) {
			d.Pick, bestLoad, bestTie = i, load, tie
		}
	}
	if d.Pick < 0 {
		d.Full = true
		return d
	}
	d.Preferred = d.Pick
	d.Matched = in.Candidates[d.Pick].Matched
	return d
}

// better reports whether a ranks above b by prefix score: expected cached
// prefix, then warm node, then rendezvous score.
func better(a, b *Candidate, ra, rb float64) bool {
	if a.Matched != b.Matched {
		return a.Matched > b.Matched
	}
	if a.Warm != b.Warm {
		return a.Warm
	}
	return ra > rb
}

// decidePrefix: among backends under their load bound and limit, those
// whose expected time to first token (pending prefill plus this request's
// uncached blocks) is within Slack of the best are acceptable; of those the
// longest expected cached prefix wins, then a warm node, then rendezvous.
func cost(c *Candidate, blocks int) int {
	return max(c.Pending, 0) + max(blocks-c.Matched, 0)
}

func decidePrefix(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1}
	var boundBuf [64]int
	var rvBuf [64]float64
	var okBuf [64]bool
	bounds := Bounds(in.Candidates, in.loadFactor(), in.MinBound, boundBuf[:0])
	rv := rvBuf[:0]
	key := RendezvousKey(in.Keys, in.Common, in.RendezvousBlocks)
	for i := range in.Candidates {
		c := &in.Candidates[i]
		rv = append(rv, Rendezvous(key, c.ID, weight(c)))
	}
	n := len(in.Keys)
	slack := in.Slack
	if slack == 0 {
		slack = 0.5
	}
	ok := okBuf[:0]
	minCost := math.MaxInt
	anyUnderLimit := false
	for i := range in.Candidates {
		c := &in.Candidates[i]
		anyUnderLimit = anyUnderLimit || underLimit(c)
		if d.Preferred < 0 || better(c, &in.Candidates[d.Preferred], rv[i], rv[d.Preferred]) {
			d.Preferred = i
		}
		allowed := c.Inflight+1 <= bounds[i] && underLimit(c)
		ok = append(ok, allowed)
		if allowed {
			minCost = min(minCost, cost(c, n))
		}
	}
	limit := math.MaxInt
	if slack >= 0 && minCost < math.MaxInt {
		limit = minCost + max(1, int(slack*float64(n)))
	}
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if !ok[i] || cost(c, n) > limit {
			continue
		}
		if d.Pick < 0 || better(c, &in.Candidates[d.Pick], rv[i], rv[d.Pick]) {
			d.Pick = i
		}
	}
	if d.Pick < 0 && anyUnderLimit {
		// Only saturated backends were under their bound; the others have
		// room by their own limits, so exceed the bound rather than refuse.
		for i := range in.Candidates {
			c := &in.Candidates[i]
			if underLimit(c) && (d.Pick < 0 || better(c, &in.Candidates[d.Pick], rv[i], rv[d.Pick])) {
				d.Pick = i
			}
		}
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
	case p.Matched > in.Common:
		d.Reason = Hit
	default:
		d.Reason = Cold
	}
	return d
}
