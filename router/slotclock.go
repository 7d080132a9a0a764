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
// a turn. Requests of peer replicas, whose ages this router does not
// know, wait a mean gap between ends each (a turn over the slots).
func (c *slotClock) wait(b *backend, now time.Time) int {
	s := int(b.slots)
	n := b.inflight + b.peers.inflight
	if s <= 0 || n < s || !c.known() {
		return 0
	}
	turn, k := c.turn(), n-s // k: ends before the one the request waits for
	var wait float64
	if i := k % s; i < len(b.starts) {
		age := float64(now.UnixNano()-b.starts[i]) / 1e9
		wait = max(turn-age, turn/float64(2*s)) + float64(k/s)*turn
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
