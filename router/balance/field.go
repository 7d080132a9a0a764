package balance

import "math"

// The field's policies, each implemented from its published description so
// the bench can set warmfleet's own strategy against them in one run, and
// selectable in the router for users who want one of them. Their reasons:
// Hit when the policy's own choice (the hash's, the best match, the pinned
// backend) took the request, Overflow when a limit or load bound sent it
// to another; cache-aware says Cold for its smallest-tree choice and Least
// for its shortest-queue one.
const (
	// PrefixHash is the naive prefix-hash proxy: the hash of the prompt's
	// first RendezvousBlocks blocks, modulo the number of eligible
	// backends, picks the backend (the "hash(key) mod n" placement Karger
	// et al., STOC 1997, set out to replace); at its own limit, the next
	// one round the list. It knows nothing of load or of what backends
	// hold beyond that one prefix.
	PrefixHash Strategy = "prefix-hash"
	// CacheAware is SGLang's cache-aware load balancing (sgl-router
	// "cache_aware", https://docs.sglang.ai/router/router.html): the
	// router keeps an approximate prefix tree per worker from the requests
	// it sent there. When the system is imbalanced, that is when both
	// max_load - min_load > balance_abs_threshold and max_load >
	// balance_rel_threshold x min_load (load: requests in flight), the
	// request goes to the shortest queue. Otherwise to the worker with the
	// highest prefix match if the match rate exceeds cache_threshold, else
	// to the worker with the smallest tree (the most cache to spare). The
	// per-worker tree here is the router's block index, which holds what
	// was sent to each backend, LRU-evicted at its KV size.
	CacheAware Strategy = "cache-aware"
	// BoundedLoad is consistent hashing with bounded loads (Mirrokni,
	// Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads",
	// SODA 2018): backends sit on a hash ring at several virtual points;
	// a request hashes its prefix onto the ring and walks clockwise to the
	// first backend whose load is under ceil(c x (m+1) / n), with m the
	// requests in flight and c = LoadFactor (the paper's 1+epsilon).
	BoundedLoad Strategy = "bounded-load"
	// Session is SageMaker HyperPod's "session" routing strategy
	// (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-caching-routing.html:
	// "requests from the same user session are routed to the same
	// instance"): a session id (a header or the body's user field) pins
	// the session to a backend by rendezvous hashing, so only sessions of
	// a backend that leaves move, as long as that backend is under its
	// load bound (Bounds, MinBound applied); past it, the next backend in
	// the session's rendezvous order that is. A request without a session
	// is routed as by prefix-aware.
	Session Strategy = "session"
)

// fieldStrategies are the strategies this file decides.
var fieldStrategies = []Strategy{PrefixHash, CacheAware, BoundedLoad, Session}

// Strategies lists every strategy name, warmfleet's first.
func Strategies() []Strategy {
	return append([]Strategy{SelfTuning, PrefixAware, KVAware, LeastOutstanding, Random}, fieldStrategies...)
}

// SGLang's documented defaults for cache_aware.
const (
	DefaultCacheThreshold      = 0.5
	DefaultBalanceAbsThreshold = 32
	DefaultBalanceRelThreshold = 1.0001
)

// ringPoints is how many virtual points each backend has on the bounded-load
// ring: enough that shares even out at a few backends, few enough that the
// decision stays a few microseconds at 64 (each is a hash per decision).
const ringPoints = 32

// decideField decides for the strategies of this file; ok is false for
// any other strategy.
func decideField(in Input) (Decision, bool) {
	switch in.Strategy {
	case PrefixHash:
		return decidePrefixHash(in), true
	case CacheAware:
		return decideCacheAware(in), true
	case BoundedLoad:
		return decideBoundedLoad(in), true
	case Session:
		if in.Session == 0 {
			return decidePrefix(in), true
		}
		return decideSession(in), true
	}
	return Decision{}, false
}

// prefixKey is the hash of the first RendezvousBlocks blocks (the whole
// prompt when shorter): the fixed-length prefix the naive and the ring
// strategies place by.
func (in *Input) prefixKey() uint64 { return RendezvousKey(in.Keys, 0, in.RendezvousBlocks) }

// picked fills the decision for pick (preferred: the candidate the rule
// wanted before limits), or marks it full.
func picked(in *Input, d Decision, pick, preferred int) Decision {
	if pick < 0 {
		d.Full = true
		return d
	}
	d.Pick, d.Preferred, d.Matched = pick, preferred, in.Candidates[pick].Matched
	if pick != preferred {
		d.Reason = Overflow
		if !underLimit(&in.Candidates[preferred]) {
			d.Yielded = BoundLimit
		} else {
			d.Yielded = BoundLoad
		}
	}
	return d
}

func decidePrefixHash(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1, Reason: Hit}
	n := len(in.Candidates)
	first := int(in.prefixKey() % uint64(n))
	for k := range n {
		if i := (first + k) % n; underLimit(&in.Candidates[i]) {
			return picked(&in, d, i, first)
		}
	}
	return picked(&in, d, -1, first)
}

func decideCacheAware(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1}
	minLoad, maxLoad := math.MaxInt, 0
	for i := range in.Candidates {
		minLoad, maxLoad = min(minLoad, in.Candidates[i].Inflight), max(maxLoad, in.Candidates[i].Inflight)
	}
	absT, relT := in.BalanceAbs, in.BalanceRel
	if absT <= 0 {
		absT = DefaultBalanceAbsThreshold
	}
	if !(relT >= 1) {
		relT = DefaultBalanceRelThreshold
	}
	imbalanced := maxLoad-minLoad > absT && float64(maxLoad) > relT*float64(minLoad)
	// best returns the candidate under its limit that less ranks lowest.
	best := func(less func(a, b *Candidate) bool) int {
		pick := -1
		for i := range in.Candidates {
			c := &in.Candidates[i]
			if underLimit(c) && (pick < 0 || less(c, &in.Candidates[pick])) {
				pick = i
			}
		}
		return pick
	}
	shortest := func(a, b *Candidate) bool { return a.Inflight < b.Inflight }
	if imbalanced {
		d.Reason = Least
		p := best(shortest)
		return picked(&in, d, p, max(p, 0))
	}
	top := 0
	for i := range in.Candidates {
		if in.Candidates[i].Matched > in.Candidates[top].Matched {
			top = i
		}
	}
	threshold := in.CacheThreshold
	if !(threshold > 0 && threshold <= 1) {
		threshold = DefaultCacheThreshold
	}
	if n := len(in.Keys); n > 0 && float64(in.Candidates[top].Matched)/float64(n) > threshold {
		d.Reason = Hit
		if underLimit(&in.Candidates[top]) {
			return picked(&in, d, top, top)
		}
		// At its own limit: the best match among the others.
		return picked(&in, d, best(func(a, b *Candidate) bool { return a.Matched > b.Matched }), top)
	}
	d.Reason = Cold
	p := best(func(a, b *Candidate) bool {
		if a.Held != b.Held {
			return a.Held < b.Held
		}
		return shortest(a, b)
	})
	return picked(&in, d, p, max(p, 0))
}

// ringDistance is how far clockwise from key the nearest of id's virtual
// points lies on the ring.
func ringDistance(key, id uint64) uint64 {
	best := uint64(math.MaxUint64)
	h := mix(id)
	for v := range uint64(ringPoints) {
		best = min(best, mix(h+v*0x9e3779b97f4a7c15)-key)
	}
	return best
}

func decideBoundedLoad(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1, Reason: Hit}
	var boundBuf [64]int
	var distBuf [64]uint64
	bounds := Bounds(in.Candidates, in.loadFactor(), 1, boundBuf[:0])
	dist := distBuf[:0]
	key := in.prefixKey()
	for i := range in.Candidates {
		dist = append(dist, ringDistance(key, in.Candidates[i].ID))
	}
	// The walk visits backends in the order of their nearest point.
	pick, pref := -1, -1
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if pref < 0 || dist[i] < dist[pref] {
			pref = i
		}
		if underLimit(c) && c.Inflight+1 <= bounds[i] && (pick < 0 || dist[i] < dist[pick]) {
			pick = i
		}
	}
	d = picked(&in, d, pick, pref)
	if pick >= 0 {
		d.Bound = bounds[pick]
	}
	return d
}

func decideSession(in Input) Decision {
	d := Decision{Pick: -1, Preferred: -1, Reason: Hit}
	var boundBuf [64]int
	bounds := Bounds(in.Candidates, in.loadFactor(), max(in.MinBound, 1), boundBuf[:0])
	// pref: the pinned backend; pick: the first in the session's
	// rendezvous order under its bound; spare: under its own limit only.
	pref, pick, spare := -1, -1, -1
	var prefS, pickS, spareS float64
	for i := range in.Candidates {
		c := &in.Candidates[i]
		s := Rendezvous(in.Session, c.ID, weight(c))
		if pref < 0 || s > prefS {
			pref, prefS = i, s
		}
		if !underLimit(c) {
			continue
		}
		if spare < 0 || s > spareS {
			spare, spareS = i, s
		}
		if c.Inflight+1 <= bounds[i] && (pick < 0 || s > pickS) {
			pick, pickS = i, s
		}
	}
	if pick < 0 {
		pick = spare
	}
	d = picked(&in, d, pick, pref)
	if pick >= 0 {
		d.Bound = bounds[pick]
	}
	return d
}
