package router

import (
	"math"
	"slices"
	"time"
)

// slotClock learns how long a request holds one of its engine's sequence
// slots and what a block of prefill takes, for the wait prefix-aware
// prices on a backend whose slots are all taken
// (balance.Candidate.SlotWait, wait). Both come from requests
// that started at once (a slot free and nothing else before its first
// token on that backend when it was sent), so neither counts a wait in a
// queue: a prefill's time to first byte over its uncached blocks, and a
// whole answer's time from send to its last byte. The sums decay per
// sample, so the clock follows engines that change speed.
type slotClock struct {
	prefillSec, prefillBlocks float64
	seqSec, seqs              float64
	nPrefill, nSeq            int
	// contention says whether prefill queues or overlaps on these
	// engines (the fleet's, since a pool's engines run alike).
	contention contention
}

// slotClockDecay is each sample's share of the decayed sums: about the
// last hundred samples count.
const slotClockDecay = 1.0 / 128

// slotClockMin is how many samples of each kind the clock wants before it
// prices a slot: until then prefix-aware prices queued prefill only.
const slotClockMin = 16

func (c *slotClock) prefill(d time.Duration, blocks int) {
	if d <= 0 || blocks <= 0 {
		return
	}
	c.prefillSec = c.prefillSec*(1-slotClockDecay) + d.Seconds()
	c.prefillBlocks = c.prefillBlocks*(1-slotClockDecay) + float64(blocks)
	c.nPrefill++
}

func (c *slotClock) sequence(d time.Duration) {
	if d <= 0 {
		return
	}
	c.seqSec = c.seqSec*(1-slotClockDecay) + d.Seconds()
	c.seqs = c.seqs*(1-slotClockDecay) + 1
	c.nSeq++
}

// known reports whether the clock has enough samples to price a slot.
func (c *slotClock) known() bool {
	return c.nPrefill >= slotClockMin && c.nSeq >= slotClockMin && c.prefillSec > 0 && c.prefillBlocks > 0 && c.seqs > 0
}

// turn is a request's mean time in its slot, in seconds.
func (c *slotClock) turn() float64 { return c.seqSec / c.seqs }

// blockSec is a block of prefill's mean time, in seconds.
func (c *slotClock) blockSec() float64 { return c.prefillSec / c.prefillBlocks }

// wait estimates how long a request sent to b now would wait
// for one of its engine's sequence slots, in blocks of prefill
// (balance.Candidate.SlotWait): 0 with a slot free, the slots unknown or
// the clock not yet known. The engine runs the oldest requests sent to it
// (vLLM schedules first come, first served) and each ends about a mean
// turn after it was sent, so with q more requests in flight than slots the
// request starts when the q-th oldest ends: the q-th oldest's remaining
// turn, plus a whole turn for each time q goes round the slots. A request
// older than the mean turn has an unknown rest, taken as a small part of
// a turn, and one more such part for each older request that outlived the
// mean too: they end one after another, and priced alike, a backend whose
// running requests had all outlived the mean (long answers) looked as soon
// free with requests already queued for its slots as with none. Requests
// of peer replicas, whose ages this router does not know, wait a mean gap
// between ends each (a turn over the slots).
func (c *slotClock) wait(b *backend, now time.Time) int {
	s := int(b.slots)
	n := b.inflight + b.peers.inflight
	if s <= 0 || n < s || !c.known() {
		return 0
	}
	turn, k := c.turn(), n-s // k: ends before the one the request waits for
	var wait float64
	if i := k % s; i < len(b.starts) {
		age := func(j int) float64 { return float64(now.UnixNano()-b.starts[j]) / 1e9 }
		past := 0 // requests older than the i-th that have outlived the mean turn
		for past < i && age(past) > turn {
			past++
		}
		wait = max(turn-age(i), float64(past+1)*turn/float64(2*s)) + float64(k/s)*turn
	} else {
		wait = float64(k+1) * turn / float64(s)
	}
	return int(math.Round(min(wait/c.blockSec(), 1<<40)))
}

// startedLocked and endedLocked keep b.starts: the send times of the
// requests in flight on b, oldest first.
func (b *backend) startedLocked(now time.Time) {
	b.starts = append(b.starts, now.UnixNano())
}

func (b *backend) endedLocked(sent time.Time) {
	if i := slices.Index(b.starts, sent.UnixNano()); i >= 0 {
		b.starts = slices.Delete(b.starts, i, i+1)
	}
}

// slotClockLocked is the clock for prompts keyed by the engine's blocks
// (exact) or by the router's own: the two count blocks of different sizes.
func (rt *Router) slotClockLocked(exact bool) *slotClock {
	if exact {
		return &rt.slotClocks[1]
	}
	return &rt.slotClocks[0]
}

// contention learns whether a prompt's first token waits for the prefill
// of the prompts already on its backend, or is slowed by the requests
// running beside it: by a fit of its time to first byte, over the prompts
// sent while a sequence slot was free and expected to hold none of their
// blocks, as
//
//	c + b*(uncached+ahead) + a*ahead + g*uncached*others + h*others
//
// in seconds, where uncached is its own uncached blocks, ahead those of the
// requests there still before their first token, and others the requests
// in flight there (h: what each adds whatever the prompt, the fixed part
// of a prefill stretched as the rest, or decode steps interleaved). An engine that prefills one prompt after another
// (vLLM's scheduler: running requests, then waiting ones oldest first,
// under a token budget) makes a prompt wait for those ahead, a ~ 0; one
// that prefills them side by side, each slowed by how many run beside it
// (llm-d-inference-sim: prefill time x 1 + (time-factor-under-load - 1) x
// (running - 1) / (max-num-seqs - 1)), has a ~ -b and g > 0. The fit is
// pulled toward a = g = 0, the queue prefix-aware has always priced, so
// an engine whose first bytes do not show otherwise (no prompt ever sent
// beside another) is priced as before. Only cold prompts teach it: a
// prompt matching blocks that a request ahead of it is still prefilling
// recomputes or waits for them on either kind of engine, which the fit
// would read as a queue.
//
// The bench's llmsim has both kinds (the default and SideBySide), so
// what the fit learns is checked there in virtual time.
type contention struct {
	xx     [contentionFeatures][contentionFeatures]float64 // decayed sums of x x^T
	xy     [contentionFeatures]float64                     // and of x y
	n      int
	absErr float64 // decayed mean absolute residual, for the stall bound
	stalls float64 // decayed count of first bytes left out as stalls
	fit    [contentionFeatures]float64
	// gVar is g's variance per unit of residual variance, the diagonal
	// element of the inverse of the (ridged) sums: its standard error is
	// sqrt(gVar) times the residuals' spread.
	gVar   float64
	solved bool
	// overlap and slowdown are shares' answer, worked out once per
	// prompt learned rather than at every decision that reads it.
	overlap, slowdown float64
}

const (
	contentionFeatures = 5
	// contentionMin is how many prompts the fit wants before it is used.
	contentionMin = 32
	// contentionPrior is the weight, in prompts of 64 uncached blocks,
	// of the pull toward a = g = 0.
	contentionPrior = 4.0
	// stallOver is how many times its prediction a first byte may take
	// before the fit takes it for a stall (observe).
	stallOver = 4.0
	// maxStalls is the decayed count of stalls (about the last 32
	// prompts) past which the fit takes slow first bytes as the engine's
	// pace.
	maxStalls = 4.0
	// maxSlowdown bounds g/b: one more request running beside a prompt
	// at most doubles its prefill.
	maxSlowdown = 1.0
)

func contentionX(uncached, ahead, others int) [contentionFeatures]float64 {
	u, p := float64(uncached)/64, float64(ahead)/64
	return [contentionFeatures]float64{1, u + p, p, u * float64(others), float64(others)}
}

// observe adds one prompt: its uncached blocks, the blocks ahead of it and
// the requests in flight when it was sent, and its time to first byte.
func (c *contention) observe(uncached, ahead, others int, d time.Duration) {
	if uncached <= 0 || ahead < 0 || others < 0 || d <= 0 || d > maxObservedTTFB {
		return
	}
	x, y := contentionX(uncached, ahead, others), d.Seconds()
	if c.solved {
		// A stall is no prefill: a first byte far later than the fit
		// expects is left out once the fit has enough prompts. Bounding
		// it instead (as the self-tuning fit does) still adds the bound,
		// and a fit that counts a stall of one prompt in fifty as several
		// times its prefill prices contention that is not there.
		// Unless they come often: then the engine has slowed, and the
		// fit follows it.
		pred := c.predict(&x)
		c.stalls *= 1 - 1.0/32
		if c.n >= contentionMin && y > stallOver*pred+tuneClip*c.absErr && c.stalls < maxStalls {
			c.stalls++
			return
		}
		c.absErr += (math.Abs(y-pred) - c.absErr) / 32
	}
	for i := range x {
		for j := range x {
			c.xx[i][j] = c.xx[i][j]*(1-slotClockDecay) + x[i]*x[j]
		}
		c.xy[i] = c.xy[i]*(1-slotClockDecay) + x[i]*y
	}
	c.n++
	c.solve()
	c.overlap, c.slowdown = c.priced()
}

func (c *contention) predict(x *[contentionFeatures]float64) float64 {
	s := 0.0
	for i := range x {
		s += c.fit[i] * x[i]
	}
	return s
}

// solve fits the coefficients to the sums, with a and g pulled toward 0
// (a ridge on them alone), by Gaussian elimination with partial pivoting.
func (c *contention) solve() {
	const n = contentionFeatures
	// Two right-hand sides: the sums of x y for the fit, and the unit
	// vector of g for its variance.
	var m [n][n + 2]float64
	for i := range n {
		copy(m[i][:n], c.xx[i][:])
		m[i][n] = c.xy[i]
	}
	m[3][n+1] = 1
	m[2][2] += contentionPrior
	m[3][3] += contentionPrior
	for i := range n {
		m[i][i] += 1e-9 // keeps the constant and b solvable before they vary
	}
	for col := range n {
		p := col
		for r := col + 1; r < n; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[p][col]) {
				p = r
			}
		}
		if !(math.Abs(m[p][col]) > 1e-12) {
			c.solved = false
			return
		}
		m[col], m[p] = m[p], m[col]
		for r := col + 1; r < n; r++ {
			f := m[r][col] / m[col][col]
			for k := col; k < n+2; k++ {
				m[r][k] -= f * m[col][k]
			}
		}
	}
	var fit, inv [n]float64
	for i := n - 1; i >= 0; i-- {
		s, v := m[i][n], m[i][n+1]
		for k := i + 1; k < n; k++ {
			s -= m[i][k] * fit[k]
			v -= m[i][k] * inv[k]
		}
		fit[i], inv[i] = s/m[i][i], v/m[i][i]
	}
	for _, f := range [...]float64{fit[0], fit[1], fit[2], fit[3], fit[4], inv[3]} {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			c.solved = false
			return
		}
	}
	c.fit, c.gVar, c.solved = fit, max(inv[3], 0), true
}

// shares returns what prefix-aware prices (balance.Input.Overlap and
// Slowdown): the share of the prefill ahead a prompt does not wait for
// (0..1) and how much one more request in flight slows its own prefill
// (0..maxSlowdown), the latter only as far as the fit is sure of it: less
// two standard errors. An engine that queues prefill reads a little
// slowdown from prompts its queue held longer than the router counted,
// and a backend's slots multiply whatever is read (a hundredth with 64 in
// flight is most of a prompt's prefill again). 0 and 0, the queue, until
// the fit has enough prompts and prices an uncached block above nothing.
func (c *contention) shares() (overlap, slowdown float64) { return c.overlap, c.slowdown }

// priced works out what shares returns from the fit.
func (c *contention) priced() (overlap, slowdown float64) {
	b := c.fit[1]
	if c.n < contentionMin || !c.solved || !(b > 0) {
		return 0, 0
	}
	// absErr is a mean absolute residual; sqrt(pi/2) of it is the spread
	// of normal residuals.
	se := math.Sqrt(math.Pi/2) * c.absErr * math.Sqrt(c.gVar)
	return min(max(-c.fit[2]/b, 0), 1), min(max((c.fit[3]-2*se)/b, 0), maxSlowdown)
}
