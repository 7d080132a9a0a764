// Package balance holds the routing decision as a pure function: given the
// eligible backends (their load, limits, ramp-up weight, warm flag and how
// much of the request's prefix each is expected to hold) it picks one and
// says why. No IO, no clock, no randomness of its own, so every rule is
// table-tested and several router replicas given the same view agree.
package balance

import (
	"fmt"
	"math"
	"slices"
)

// Strategy selects how requests for a model are spread.
type Strategy string

// The strategies.
const (
	Random           Strategy = "random"
	LeastOutstanding Strategy = "least-outstanding"
	PrefixAware      Strategy = "prefix-aware"
	// KVAware is the prefix-aware decision, under the same bounds, with
	// each backend's expected prefix taken from its engine's KV events
	// where it publishes them (the router's job: to this package both are
	// the same rule over Candidate.Matched).
	KVAware Strategy = "kv-aware"
)

// ParseStrategy validates a strategy name.
func ParseStrategy(s string) (Strategy, error) {
	switch st := Strategy(s); st {
	case Random, LeastOutstanding, PrefixAware, KVAware, SelfTuning:
		return st, nil
	}
	if slices.Contains(fieldStrategies, Strategy(s)) {
		return Strategy(s), nil
	}
	return "", fmt.Errorf("unknown strategy %q (want one of %v)", s, Strategies())
}

// Reason says why a backend was chosen.
type Reason string

// Reasons. Hit: the backend expected to hold the longest prefix beyond what
// every backend holds. Cold: no backend holds more than the common prefix,
// so rendezvous hashing among backends not above their fair share of traffic
// decided. Overflow: the backend holding the longest prefix (or, for a cold
// request, the rendezvous choice at its load bound or limit) could not take
// it; the next best by the same score did. Retry: an earlier attempt could
// not be sent. Random/Least: the other strategies.
const (
	Hit      Reason = "hit"
	Cold     Reason = "cold"
	Overflow Reason = "overflow"
	Retry    Reason = "retry"
	Rand     Reason = "random"
	Least    Reason = "least"
)

// Bound names the rule that kept a request off its preferred backend.
type Bound string

// Bounds an overflow can come from, in the order they are checked.
const (
	BoundLimit Bound = "limit" // the backend's own concurrency limit
	BoundLoad  Bound = "load"  // ceil(c x mean in-flight)
	BoundShare Bound = "share" // ShareFactor x fair share of recent traffic
	BoundWait  Bound = "wait"  // expected wait beyond Slack of the best
	BoundKV    Bound = "kv"    // too little free KV cache on the engine (self-tuning)
	BoundSlots Bound = "slots" // every sequence slot busy while another backend has one free
)

// HoldLoad and HoldShare cap how far past its load bound and its share
// factor a backend holding part of a prompt keeps it (prefix-aware): as
// long as moving would cost the request more than Slack in expected wait,
// up to HoldLoad x its load bound and HoldShare x ShareFactor x its fair
// share of traffic, and while at most one request there waits for its
// first token. Past them the bounds hold as before, so a hot prefix group
// still spreads.
const (
	HoldLoad  = 1.5
	HoldShare = 1.5
)

// DefaultSlack is the Slack used when none is given: affinity may cost a
// tenth of the prompt in extra expected wait, no more, or requests queue
// behind others' prefill.
const DefaultSlack = 0.1

// Candidate is one eligible backend as the decision sees it.
type Candidate struct {
	ID       uint64  // stable identity for rendezvous hashing
	Inflight int     // requests in flight now
	Limit    int     // own concurrency limit; 0 means none
	Weight   float64 // share of traffic relative to a settled backend: (0,1], lower while ramping up
	Warm     bool    // its node holds the model weights locally
	// Slots is how many sequences its engine runs at once (vLLM's
	// max_num_seqs; 0: unknown). A request beyond them waits in the
	// engine's queue for a running sequence to end. 32 bits, beside Warm:
	// candidates are filled and read per backend per decision.
	Slots   int32
	Matched int // leading prompt blocks it is expected to hold
	// Pending is the prompt blocks sent to it that it has not finished
	// prefilling (the router's estimate): in-flight counts say little about
	// LLM load because most in-flight time is decode.
	Pending int
	// Prefilling is how many of the in-flight requests have not had their
	// first token yet.
	Prefilling int
	// Recent is its recent traffic: requests routed to it, decayed (only
	// ratios between candidates matter).
	Recent float64
	// Held is how many blocks the router's index has it hold (the size of
	// its approximate prefix tree, for cache-aware).
	Held int
	// SlotWait is how long a request would wait there for one of its
	// engine's sequence slots, in blocks of prefill at speed 1 (the
	// router's estimate from the ages of the sequences running there; 0:
	// a slot is free, or not known). Prefix-aware adds it to the
	// expected wait: an engine with few slots (a simulator's 4, a large
	// model's) makes that wait longer than a recompute, and priced at the
	// prefill queued there alone, a backend holding a conversation kept
	// it with requests queued for its slots while others had one about
	// to free.
	SlotWait int
	// Speed is how fast it prefills and decodes relative to the fleet's
	// usual backend (2: twice as fast, a newer GPU generation; 0: 1): it
	// gets Speed times the fair share of recent traffic (and of random
	// picks), and prefix-aware prices its queue in time, not blocks.
	// Self-tuning uses it only until it has learned speeds itself.
	Speed float64
}

// Input is everything one decision depends on.
type Input struct {
	Strategy   Strategy
	LoadFactor float64 // c in ceil(c x mean in-flight); 1.25 if <= 1
	// DecodeWeight is what a request past its first token counts for in the
	// load bound, relative to one still waiting for prefill: decoding
	// sequences cost an engine far less per step than a prefill. 1 (plain
	// in-flight count) unless in (0, 1].
	DecodeWeight float64
	// BalanceSlack caps how much longer (as a fraction of the request's
	// blocks) the expected wait may be on the backend a new group is sent to
	// for balance than on the best backend overall. 0: no cap beyond Slack
	// among the backends at or under their fair share.
	BalanceSlack float64
	// MinBound is a floor under every load bound: at low load the bare rule
	// (ceil(1.25 x 2 / 8) = 1) would push a second request off the backend
	// holding its prefix although that backend is nearly idle. 1 if zero.
	MinBound   int
	Candidates []Candidate
	// Keys are the request's chained block hashes (may be empty).
	Keys []uint64
	// Common is how many leading blocks every backend holds (a system prompt
	// everybody has seen): matching them says nothing about where to go. A
	// backend that holds nothing at all (new, restarted, cleared) may be left
	// out of it, its Matched below Common: its expected wait prices the
	// common prefix as held, as it is after its first request (see cost).
	Common int
	// RendezvousBlocks is how many blocks past Common the cold-path key
	// covers; 16 if zero.
	RendezvousBlocks int
	// Slack is how much longer (as a fraction of the request's blocks) the
	// expected wait for the first token (pending prefill + own uncached
	// blocks) may be on a backend than on the best one, and still let
	// prefix affinity or rendezvous decide. DefaultSlack if zero;
	// negative: none.
	Slack float64
	// ShareFactor s bounds traffic: a backend whose recent traffic exceeds
	// s x its fair share (by weight) keeps no affinity and takes no new
	// prefix group. 1.1 if below 1.
	ShareFactor float64
	Rand        uint64 // caller-supplied randomness (random strategy, tie-breaks)
	Retry       bool   // this is a second or later attempt
	// Session is the hash of the request's session id (0: none), for the
	// session strategy.
	Session uint64
	// CacheThreshold, BalanceAbs and BalanceRel are cache-aware's
	// thresholds (SGLang's defaults where zero).
	CacheThreshold float64
	BalanceAbs     int
	BalanceRel     float64
	// Estimates are the self-tuning strategy's per-candidate models, in
	// the order of Candidates; Rate is the requests per second arriving
	// at all of them, and EvictWeight how much the cache a placement
	// evicts counts (see SelfTuning).
	Estimates   []Estimate
	Rate        float64
	EvictWeight float64
	// KeyScale is how many of the blocks the estimates count one key
	// stands for (the engine's blocks of KV events against the router's
	// own); 1 if not positive.
	KeyScale float64
	// Overlap is the share (0..1) of a backend's queued prefill that a
	// new prompt does not wait for, and Slowdown how much each request
	// running beside it stretches its own prefill (0..1), as the router
	// learned them from first bytes (router/slotclock.go; the slowdown as
	// far as it is sure of it). 0 and 0, the default, are an engine that
	// prefills one prompt after another (vLLM); prefix-aware prices an
	// engine with Overlap of at least OverlapAt as one that prefills
	// prompts side by side (sideBySideCost), and one with Slowdown of at
	// least SlowdownAt as one whose prompts prefill slower beside running
	// requests, whichever Overlap it reads (stretch).
	Overlap, Slowdown float64
}

// OverlapAt is the Overlap from which prefix-aware takes prefill to run
// side by side rather than in a queue. Below 1 because an engine that
// prefills side by side is not seen exactly so, and well above 0 because
// one that queues is not either: the router's count of the prefill queued
// there overstates it by the cache hits it did not expect, which the fit
// reads as prefill not waited for (0.3-0.7 on the Mooncake traces against
// 0.97-1 for prompts prefilled side by side, on llmsim's two models).
const OverlapAt = 0.85

// SlowdownAt is the Slowdown from which prefix-aware counts, on an engine
// it takes to queue prefill, how much the requests running on a backend
// stretch a prompt's own prefill (stretch). The fit tells a slowdown from
// a queue's wait on most traffic, where prompt sizes and running counts
// vary, but tells prefill side by side from queued only where prompts
// nobody holds find prefill queued ahead of them, which prefix-aware's own
// placements make rare: an engine that prefills side by side and slows
// under load (llm-d-inference-sim) often reads as a queue that slows.
// Slowdown is what the router is sure of (router/slotclock.go), and this
// is a margin above it still: one that does not slow reads a little at
// times (llmsim's one prefill stream, 64 slots), and a backend's slots
// multiply whatever is read.
const SlowdownAt = 0.05

// overlaps reports whether prefix-aware prices prefill as side by side.
func (in *Input) overlaps() bool { return in.Overlap >= OverlapAt && in.Overlap <= 1 }

// Decision is the outcome.
type Decision struct {
	Pick      int // index into Candidates; -1 when none can take the request
	Preferred int // best by score ignoring load (prefix-aware), else Pick
	Reason    Reason
	Bound     int  // the pick's load bound (prefix-aware)
	Full      bool // no candidate is below its own limit: queue or refuse
	Matched   int  // blocks the pick is expected to hold
	// Share is the pick's recent traffic over its fair share (prefix-aware).
	Share float64
	// Yielded is the rule the preferred backend failed when Reason is
	// Overflow (empty otherwise).
	Yielded Bound
}

func (in *Input) loadFactor() float64 {
	if in.LoadFactor <= 1 {
		return 1.25
	}
	return in.LoadFactor
}

// weight is c's ramp-up weight, (0, 1]: its share of groups and its load
// bound. Speed does not scale them: a backend twice as fast holds the same
// KV cache (more groups there would evict each other), and it keeps twice
// the arrivals at the same in-flight count, since each leaves in half the
// time.
func weight(c *Candidate) float64 {
	if c.Weight <= 0 || math.IsNaN(c.Weight) {
		return 1e-3
	}
	return min(c.Weight, 1)
}

// rateShare is c's share of the request rate: its weight times its speed.
func rateShare(c *Candidate) float64 { return weight(c) * speed(c) }

// MaxSpeed bounds Candidate.Speed both ways (1/MaxSpeed..MaxSpeed).
const MaxSpeed = 64

// speed is c.Speed within 1/MaxSpeed..MaxSpeed; 1 when unset or not a
// number.
func speed(c *Candidate) float64 {
	if !(c.Speed > 0) || math.IsInf(c.Speed, 1) {
		return 1
	}
	return min(max(c.Speed, 1.0/MaxSpeed), MaxSpeed)
}

// inTime converts blocks of prefill on c into blocks at speed 1.
func inTime(c *Candidate, blocks int) int {
	if s := speed(c); s != 1 {
		return int(math.Ceil(float64(blocks) / s))
	}
	return blocks
}

func (in *Input) decodeWeight() float64 {
	if !(in.DecodeWeight > 0 && in.DecodeWeight <= 1) { // also NaN
		return 1
	}
	return in.DecodeWeight
}

// load is c's load for the bound: prefilling requests count 1, decoding
// ones dw.
func load(c *Candidate, dw float64) float64 {
	pre := min(max(c.Prefilling, 0), c.Inflight)
	return float64(pre) + dw*float64(c.Inflight-pre)
}

func underLimit(c *Candidate) bool { return c.Limit <= 0 || c.Inflight < c.Limit }

// slotFree reports whether c's engine has a sequence slot free for one
// more request (or its slots are unknown).
func slotFree(c *Candidate) bool { return c.Slots <= 0 || c.Inflight < int(c.Slots) }

// startsAtOnce reports whether some backend would start a request at
// once: under its limit, a sequence slot free (or its slots unknown) and
// not queueing prefill (queues). A backend with a free slot
// and a queue of prefill is no such place: at saturation the slot a
// request just left is there, and sending held requests to it spends a
// recompute out of the fleet's capacity while they wait all the same.
func (in *Input) startsAtOnce() bool {
	for i := range in.Candidates {
		if c := &in.Candidates[i]; slotFree(c) && underLimit(c) && !in.queues(c) {
			return true
		}
	}
	return false
}

// Bounds returns each candidate's load bound: ceil(c x (total+1) x w / sum w),
// the bounded-load rule (Mirrokni et al.) with the new request counted and
// shares scaled by ramp-up weight, but at least minBound. Some candidate is
// always below its bound.
func Bounds(cands []Candidate, c float64, minBound int, dst []int) []int {
	return LoadBounds(cands, c, 1, minBound, dst)
}

// LoadBounds is Bounds over prefill-weighted load: a request past its first
// token counts decodeWeight (0..1) instead of 1. A candidate may take the
// request while load+1 <= its bound.
func LoadBounds(cands []Candidate, c, decodeWeight float64, minBound int, dst []int) []int {
	total, wsum := 0.0, 0.0
	for i := range cands {
		total += load(&cands[i], decodeWeight)
		wsum += weight(&cands[i])
	}
	for i := range cands {
		dst = append(dst, loadBound(c, total, weight(&cands[i]), wsum, minBound))
	}
	return dst
}

// loadBound is one candidate's bound given the fleet's total load and
// weight (see LoadBounds).
func loadBound(c, total, w, wsum float64, minBound int) int {
	return max(int(math.Ceil(c*(total+1)*w/wsum)), minBound, 1)
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
	return rendezvousScore(mix(key^mix(id)), w)
}

// rendezvousScore is Rendezvous given the mixed key and id.
func rendezvousScore(h uint64, w float64) float64 {
	u := (float64(h>>11) + 0.5) / (1 << 53)
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
	case SelfTuning:
		d = decideTuned(in)
	default:
		var ok bool
		if d, ok = decideField(in); !ok {
			d = decidePrefix(in)
		}
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
			wsum += rateShare(&in.Candidates[i])
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
		if target -= rateShare(c); target < 0 {
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

// tierBetter reports whether candidate a (pa: what decidePrefix worked out
// about it) ranks above b within tier t (see the tier constants). Past
// tierCold the shortest expected wait wins; past tierHit then the least
// recent traffic: among backends whose queues are within slack of the
// shortest, the one sent the fewest requests lately is likely the one whose
// queued prefill started first and ends first, where rendezvous would pile
// arrivals on one of them.
func tierBetter(t int8, a, b *Candidate, pa, pb *prefixView) bool {
	if t >= tierFair && pa.cost != pb.cost {
		return pa.cost < pb.cost
	}
	if t >= tierCold {
		if ra, rb := a.Recent/speed(a), b.Recent/speed(b); ra != rb {
			return ra < rb
		}
	}
	return better(a, b, pa.rv, pb.rv)
}

// cost is the expected wait for the first token in blocks of prefill: what
// is queued on the backend plus this request's uncached blocks, the common
// prefix counted as held. A backend holding nothing recomputes it once, and
// then holds it like every other: priced at that first recompute, it lost
// every comparison with a backend holding the prefix and sat idle while
// the rest of the fleet took its share (seconds of the multi-turn workload).
func cost(c *Candidate, blocks, common int) int {
	return max(c.Pending, 0) + max(blocks-max(c.Matched, common), 0)
}

// sideBySideCost is cost on an engine that prefills prompts side by side
// (Input.overlaps): a prompt waits for little of the prefill queued there
// (1 - Overlap of it) and its own prefill stretches by Slowdown for each
// request running beside it, so the backend with the fewest requests in
// flight is the quickest for a prompt nobody holds, whatever they have
// left to prefill. Apart from cost, which stays small enough to inline.
func (in *Input) sideBySideCost(c *Candidate, blocks int) int {
	own, others := in.beside(c, blocks)
	slow := min(max(in.Slowdown, 0), 1)
	return int(math.Round((1-in.Overlap)*float64(max(c.Pending, 0)) + own*(1+slow*others)))
}

// stretch is how much longer than its uncached blocks a prompt's own
// prefill takes on c, in blocks, for the requests running there: cost's
// addition on an engine that queues prefill but slows under load
// (SlowdownAt).
func (in *Input) stretch(c *Candidate, blocks int) int {
	own, others := in.beside(c, blocks)
	return int(math.Round(own * min(in.Slowdown, 1) * others))
}

// beside is a prompt's own uncached blocks on c and how many requests run
// beside its prefill there: those in flight, up to its slots less one
// (past them it waits for a slot, which SlotWait prices, and then starts
// beside the rest).
func (in *Input) beside(c *Candidate, blocks int) (own, others float64) {
	n := max(c.Inflight, 0)
	if c.Slots > 0 {
		n = min(n, int(c.Slots)-1)
	}
	return float64(max(blocks-max(c.Matched, in.Common), 0)), float64(n)
}

// queues reports whether c's engine is taken to queue prefill: more than
// one request there waits for its first token, on an engine that prefills
// one prompt after another.
func (in *Input) queues(c *Candidate) bool { return c.Prefilling > 1 && !in.overlaps() }

// maxSlotWait bounds Candidate.SlotWait, so that sums of costs cannot
// overflow.
const maxSlotWait = 1 << 40

func (in *Input) shareFactor() float64 {
	if !(in.ShareFactor >= 1) { // also NaN
		return 1.1
	}
	return in.ShareFactor
}

// Shares returns each candidate's recent traffic over its fair share, in
// proportion to its weight and speed (1 is exactly fair; 0 for all when
// there is no history yet).
func Shares(cands []Candidate, dst []float64) []float64 {
	sum, wsum := 0.0, 0.0
	for i := range cands {
		sum += max(cands[i].Recent, 0)
		wsum += rateShare(&cands[i])
	}
	for i := range cands {
		dst = append(dst, share(cands[i].Recent, sum, rateShare(&cands[i]), wsum))
	}
	return dst
}

// share is one candidate's recent traffic over its fair share given the
// fleet's total traffic and rate share (see Shares).
func share(recent, sum, rs, rsum float64) float64 {
	if sum > 0 {
		return max(recent, 0) / sum * rsum / rs
	}
	return 0
}

// Tiers rank candidates for one request; the lowest non-empty tier wins.
// Within tierHit the prefix score decides (the longest cached prefix;
// rendezvous, so replicas agree); within tierCold the least recent
// traffic, then the prefix score; within the others, which take a request
// only once those rules have failed, the shortest expected wait first.
const (
	tierHit   = iota // holds more than the common prefix; passes every bound, or holds past them (HoldLoad)
	tierCold         // at most its fair share of traffic; passes every bound: may start a new group
	tierFair         // passes every bound, above its fair share but within ShareFactor
	tierLoad         // under the load bound, but over ShareFactor or beyond slack
	tierOver         // only under its own limit
	tierSlots        // every sequence slot busy while another backend has one free
	tierNone         // at its own limit
)

// yielded names the bound behind a tier that lost the request; share
// tells the two reasons for tierLoad apart.
func yielded(tier int8, overShare bool) Bound {
	switch {
	case tier == tierNone:
		return BoundLimit
	case tier == tierSlots:
		return BoundSlots
	case tier == tierOver:
		return BoundLoad
	case overShare:
		return BoundShare
	}
	return BoundWait
}

// decidePrefix ranks the candidates in tiers (see the constants): a backend
// expected to hold more than the common prefix keeps the request if it is
// under its load bound and own limit, within Slack of the best expected time
// to first token among backends within their traffic share, and not above
// ShareFactor x its fair share of recent traffic; past the load bound and
// ShareFactor it still keeps it, up to HoldLoad and HoldShare, while moving
// would cost the request more than Slack. Otherwise a backend at or
// under its fair share starts the group (within Slack of the best such
// backend): the one with the least recent traffic (rendezvous only among
// exact ties; replicas that share their counts, --peer-listen, still
// agree). Bounds are relaxed in
// that order before the request is refused. A backend whose sequence
// slots (Candidate.Slots) are all busy is passed over while another has
// one free, whatever it holds: the request would wait there for a running
// sequence to end, most of a request's time being decode, which costs
// more than the prefill a hit saves. Only for a backend where the request
// would start at once (a free slot, at most one request before its first
// token: startsAtOnce), so not on a saturated fleet: there every request
// waits wherever it goes, and moving a held one spends a recompute out of
// the fleet's capacity.
func decidePrefix(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1}
	n := len(in.Keys)
	dw := in.decodeWeight()
	key := RendezvousKey(in.Keys, in.Common, in.RendezvousBlocks)
	slack := in.Slack
	if slack == 0 {
		slack = DefaultSlack
	}
	sf := in.shareFactor()
	// First pass: each candidate's own figures and the fleet's sums that
	// the bounds and shares divide by. The fleet is saturated when every
	// backend that may take a request queues prefill behind prefill: each
	// will be busy until its queue drains wherever the request goes, so
	// moving the request off the backend that alone holds most of it buys
	// no wait worth having and spends the recompute out of the fleet's
	// capacity (see hold).
	var viewBuf [64]prefixView
	v := viewBuf[:]
	if len(in.Candidates) > len(v) {
		v = make([]prefixView, len(in.Candidates))
	}
	v = v[:len(in.Candidates)]
	total, wsum, sum, rsum := 0.0, 0.0, 0.0, 0.0
	w0 := weight(&in.Candidates[0])
	equal := true
	busy := 0 // backends with a request before its first token
	saturated := slack >= 0
	anyBusy := false    // some backend has every sequence slot taken
	top, next := -1, -1 // the two longest matches
	side := in.overlaps()
	for i := range in.Candidates {
		c := &in.Candidates[i]
		p := &v[i]
		p.slot = min(max(c.SlotWait, 0), maxSlotWait)
		wait := cost(c, n, in.Common)
		if side {
			wait = in.sideBySideCost(c, n)
		} else if in.Slowdown >= SlowdownAt {
			wait += in.stretch(c, n)
		}
		p.w, p.load, p.cost, p.h = weight(c), load(c, dw), inTime(c, wait)+p.slot, mix(key^mix(c.ID))
		p.slotsBusy = !slotFree(c)
		anyBusy = anyBusy || p.slotsBusy
		p.rs = p.w * speed(c)
		total += p.load
		wsum += p.w
		sum += max(c.Recent, 0)
		rsum += p.rs
		equal = equal && p.w == w0
		if c.Prefilling > 0 {
			busy++
		}
		if underLimit(c) && !in.queues(c) {
			saturated = false
		}
		switch {
		case top < 0 || c.Matched > in.Candidates[top].Matched:
			top, next = i, top
		case next < 0 || c.Matched > in.Candidates[next].Matched:
			next = i
		}
	}
	// slotRule: a backend with every slot taken goes to tierSlots.
	slotRule := anyBusy && in.startsAtOnce()
	// Second pass: bounds, shares and rendezvous scores, the preferred
	// backend, and the best expected waits among those under their bounds.
	// The expected-wait filter compares backends that pass the other
	// bounds: one over its traffic share does not set the pace, and a
	// backend under its fair share is compared with its peers, so a new
	// group goes where traffic is short unless that costs more than slack.
	lf := in.loadFactor()
	minCost, minFair, minAny := math.MaxInt, math.MaxInt, math.MaxInt
	best, bestAny := -1, -1                               // where minCost and minAny are
	first, second := -1, -1                               // the two shortest waits under their load bounds
	bound0 := loadBound(lf, total, w0, wsum, in.MinBound) // everyone's, with equal weights
	for i := range v {
		c, p := &in.Candidates[i], &v[i]
		p.bound = bound0
		if !equal {
			p.bound = loadBound(lf, total, p.w, wsum, in.MinBound)
		}
		p.share = share(c.Recent, sum, p.rs, rsum)
		if equal {
			// -w/log(u) is increasing in u: with equal weights the raw
			// hash orders backends the same, without a logarithm each.
			p.rv = float64(p.h >> 11)
		} else {
			p.rv = rendezvousScore(p.h, p.w)
		}
		if d.Preferred < 0 || better(c, &in.Candidates[d.Preferred], p.rv, v[d.Preferred].rv) {
			d.Preferred = i
		}
		if !underLimit(c) || p.load+1 > float64(p.bound) || (slotRule && p.slotsBusy) {
			continue
		}
		if p.cost < minAny {
			minAny, bestAny = p.cost, i
		}
		if p.share <= sf && p.cost < minCost {
			minCost, best = p.cost, i
		}
		if p.share <= 1 {
			minFair = min(minFair, p.cost)
		}
		switch {
		case first < 0 || p.cost < v[first].cost:
			first, second = i, first
		case second < 0 || p.cost < v[second].cost:
			second = i
		}
	}
	if minCost == math.MaxInt {
		minCost, best = minAny, bestAny
	}
	// Moving a request off the backend holding more of it recomputes
	// what that backend held. The request's own wait counts the recompute
	// once (cost); the requests that arrive behind it on the backend it
	// moves to wait for it too, and lost hits raise the fleet's load. How
	// many wait is estimated from how much of the fleet is prefilling:
	// with busy of N backends holding a request before its first token,
	// busy/(N-busy+1) (none on an idle fleet, N when every backend
	// prefills: the mean queue of a server busy busy/(N+1) of the time).
	// The wait rule and the hold's cost test charge a move that many
	// times its recompute on top of the wait it saves: priced at the wait
	// alone, long prompts (the Mooncake traces) left the backend holding
	// them whenever its queue was longer, and the recomputes queued
	// everyone behind them.
	charge := float64(busy) / float64(len(in.Candidates)-busy+1)
	recompute := func(i, j int) int {
		if j < 0 || charge == 0 {
			return 0
		}
		lost := in.Candidates[i].Matched - max(in.Candidates[j].Matched, in.Common)
		if lost <= 0 {
			return 0
		}
		return inTime(&in.Candidates[j], int(charge*float64(lost)))
	}
	within := func(base int) int {
		if slack < 0 || base == math.MaxInt {
			return math.MaxInt
		}
		return base + max(1, int(slack*float64(n)))
	}
	// A request no backend holds may go past the load bound and the
	// share factor, up to the hold caps, to a backend whose expected wait
	// is shorter than the best one's within the bounds by more than
	// slack: in-flight counts are mostly decode and traffic shares count
	// requests, not prefill, so with long, uneven prompts (the Mooncake
	// traces) the bounds alone queued new prompts behind far longer
	// prefill than a backend just past them had.
	// A backend over its fair share goes past the bounds this way only
	// when no backend at or under its fair share would: prefill is what
	// the wait rule balances, and the backend with the shortest queue is
	// often the one that took short prompts, so cold prompts went on
	// piling there in requests long after its share of work was even.
	slackBlocks := max(1, int(slack*float64(n)))
	holdShare := HoldShare * sf
	minPastFair, minPastHeld := math.MaxInt, math.MaxInt
	anyFair := false
	for i := range v {
		c, p := &in.Candidates[i], &v[i]
		p.past = slack >= 0 && c.Matched <= in.Common && underLimit(c) && !(slotRule && p.slotsBusy) &&
			p.load+1 <= HoldLoad*float64(p.bound) &&
			(minCost == math.MaxInt || p.cost+slackBlocks < minCost)
		if !p.past {
			continue
		}
		if p.share <= 1 {
			anyFair, minPastFair = true, min(minPastFair, p.cost)
		}
		if p.share <= holdShare {
			minPastHeld = min(minPastHeld, p.cost)
		}
	}
	pastShare, minPast := holdShare, minPastHeld
	if anyFair {
		pastShare, minPast = 1, minPastFair
	}
	past := func(i int) bool { return v[i].past && v[i].share <= pastShare }
	minBest := min(minCost, minPast) // the best wait a request no backend holds may take
	limit, limitFair, limitBest := within(minCost), within(minFair), within(minBest)
	if bs := in.BalanceSlack; bs > 0 && minBest < math.MaxInt {
		// A new group may wait this much longer than on the best backend
		// to go where traffic is short.
		limitFair = min(limitFair, minBest+max(1, int(bs*float64(n))))
	}
	// A backend holding part of the prompt keeps it past its traffic share
	// and load bound, up to the hold caps, while moving would cost the
	// request more than slack in expected wait: the recompute of a long
	// match (a conversation's history) costs more than the balance gains.
	// Not while more than one request there waits for its first token: a
	// backend that is queueing prefill (saturation) needs the bounds to
	// spread work, or a closed loop of clients piles onto it. On a
	// saturated fleet the backend that alone holds most of the prompt
	// keeps it past the bounds and the wait rule, up to the hold caps,
	// which still spread a hot group. Where another backend holds nearly
	// as much (a system prompt most of them hold) the wait rule still
	// chooses between them: the recompute saved is small, and holding
	// piled such prompts on one backend. Nor while the wait for one of its
	// sequence slots is longer than the best alternative's by more than
	// the recompute a move spends: the request would wait there for
	// running sequences to end, not for prefill, and that is the fleet's
	// capacity idling elsewhere.
	hold := func(i int) bool {
		c, p := &in.Candidates[i], &v[i]
		if slack < 0 || c.Matched <= in.Common || p.load+1 > HoldLoad*float64(p.bound) || p.share > holdShare {
			return false
		}
		alt := first
		if alt == i {
			alt = second
		}
		if saturated && i == top && (next < 0 || c.Matched-max(in.Candidates[next].Matched, in.Common) > slackBlocks) &&
			(alt < 0 || p.slot-v[alt].slot <= c.Matched-max(in.Candidates[alt].Matched, in.Common)) {
			return true
		}
		return alt >= 0 && !in.queues(c) && p.cost+max(1, int(slack*float64(n))) < v[alt].cost+recompute(i, alt)
	}
	for i := range v {
		c, p := &in.Candidates[i], &v[i]
		fair := p.share <= 1 && p.cost <= limitFair
		held := hold(i)
		t := tierNone
		switch {
		case !underLimit(c):
		case slotRule && p.slotsBusy:
			t = tierSlots
		case p.cost <= limitBest && past(i):
			t = tierFair
			if fair {
				t = tierCold
			}
		case p.load+1 > float64(p.bound) && !held:
			t = tierOver
		case (p.share > sf && !held) || (p.cost-recompute(i, best) > limit && !fair && !(saturated && held)):
			t = tierLoad
		case c.Matched > in.Common:
			t = tierHit
		case fair:
			t = tierCold
		default:
			t = tierFair
		}
		p.tier = int8(t)
		if t == tierNone {
			continue
		}
		if d.Pick < 0 || p.tier < v[d.Pick].tier ||
			(p.tier == v[d.Pick].tier && tierBetter(p.tier, c, &in.Candidates[d.Pick], p, &v[d.Pick])) {
			d.Pick = i
		}
	}
	if d.Pick < 0 {
		d.Full = true
		return d
	}
	p, pv := &in.Candidates[d.Pick], &v[d.Pick]
	d.Bound, d.Matched, d.Share = pv.bound, p.Matched, pv.share
	switch pref := &v[d.Preferred]; {
	case d.Pick != d.Preferred && (in.Candidates[d.Preferred].Matched > in.Common || pref.tier >= tierOver):
		// Lost affinity, or the rendezvous choice was at a hard bound. A
		// cold request steered to a backend with less traffic is Cold.
		d.Reason = Overflow
		d.Yielded = yielded(pref.tier, pref.share > sf)
	case p.Matched > in.Common:
		d.Reason = Hit
	default:
		d.Reason = Cold
	}
	return d
}

// prefixView is what decidePrefix works out about one candidate.
type prefixView struct {
	w, rs float64 // weight and rate share
	load  float64 // prefill-weighted in-flight requests
	share float64 // recent traffic over its fair share
	h     uint64  // the rendezvous key mixed with its ID
	rv    float64 // rendezvous score
	cost  int     // expected wait in blocks at speed 1, a sequence slot's included
	slot  int     // the part of cost that waits for a sequence slot
	bound int     // load bound
	past  bool    // may go past the bounds for a shorter wait, within the share the caller allows
	// slotsBusy: every sequence slot of its engine is taken.
	slotsBusy bool
	tier      int8
}
