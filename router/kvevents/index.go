package kvevents

import (
	"math/bits"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/router/internal/blockset"
)

// Index is the exact view of which backend holds which KV blocks, fed by
// each backend's event stream. Each backend's view is either trusted (every
// event since a known-empty cache, or since a resync window ran out, was
// applied) or not; the router uses a backend's exact view only while it is
// trusted and falls back to its approximate index otherwise.
//
// After a gap the view is cleared rather than kept: what is left then holds
// only blocks stored (and not removed) since the gap, a subset of the
// engine's cache, so the index never claims a block the engine dropped
// while we were not listening. The resync window gives the stream time to
// rebuild the rest before the view is trusted again.
//
// Besides each view's own set of blocks, the index keeps, for every block,
// the set of views holding it (by a small id each view gets), so matching
// a prompt against every backend is one walk down its chain: a lookup per
// block, however many backends there are, instead of one walk per backend.
type Index struct {
	mu       sync.RWMutex
	backends map[string]*view
	lim      Limits
	resync   time.Duration
	now      func() time.Time

	holders blockset.Table // views (by id) holding each block
	ids     blockset.Set   // view ids in use
}

// MaxMatched is how many backends' views the index matches in one walk;
// a view past that many is matched on its own.
const MaxMatched = 256

// firstFree is the lowest view id not in s, -1 if none.
func firstFree(s *blockset.Set) int {
	for w, word := range s {
		if ^word != 0 {
			return w*64 + bits.TrailingZeros64(^word)
		}
	}
	return -1
}

type view struct {
	id        int // in Index.holders; -1: matched on its own
	blocks    map[uint64]struct{}
	seq       uint64
	haveSeq   bool
	connected bool
	// untilTrusted is when a view rebuilt after a gap becomes trusted; the
	// zero time means trusted, unless cleared by an overflow.
	untilTrusted time.Time
	stats        Stats
}

// Stats counts what happened on one backend's stream.
type Stats struct {
	Batches, Stored, Removed, Cleared uint64
	Gaps, Restarts, Overflows         uint64
	Ignored                           uint64 // events for another medium, or of an unknown kind
	// Resets counts the times the view was emptied (a clear, a restart, a
	// gap, an overflow, a reconnection): a caller that keeps its own guess
	// of the backend's cache drops it when this moves.
	Resets uint64
	Blocks int
	// Peak is the most blocks the view ever held at once; once the engine
	// has evicted (Removed > 0) it is about the engine's cache capacity in
	// blocks (a little under it: blocks pinned by running requests while
	// the view was at its peak are counted too, as they are stored).
	Peak               int
	Trusted, Connected bool
	Seq                uint64
}

// NewIndex returns an empty index. resync is how long a backend's view is
// untrusted after a gap, a restart seen late, or an overflow; now is the
// clock (time.Now when nil).
func NewIndex(lim Limits, resync time.Duration, now func() time.Time) *Index {
	if now == nil {
		now = time.Now
	}
	return &Index{backends: map[string]*view{}, lim: lim, resync: resync, now: now}
}

func (x *Index) viewLocked(backend string) *view {
	v := x.backends[backend]
	if v == nil {
		v = &view{id: firstFree(&x.ids), blocks: map[uint64]struct{}{}}
		if v.id >= 0 {
			x.ids.Add(v.id)
		}
		x.backends[backend] = v
	}
	return v
}

func (x *Index) hold(v *view, h uint64) {
	if _, held := v.blocks[h]; held {
		return
	}
	v.blocks[h] = struct{}{}
	if v.id >= 0 {
		x.holders.Add(h, v.id)
	}
}

func (x *Index) drop(v *view, h uint64) {
	if _, held := v.blocks[h]; !held {
		return
	}
	delete(v.blocks, h)
	if v.id >= 0 {
		x.unhold(v.id, h)
	}
}

// dropAll takes v's blocks out of the holders.
func (x *Index) dropAll(v *view) {
	if v.id < 0 {
		return
	}
	for h := range v.blocks {
		x.unhold(v.id, h)
	}
}

// unhold takes view id out of block h's holders.
func (x *Index) unhold(id int, h uint64) {
	x.holders.Remove(h, id)
}

// reset empties a view; trusted says whether the empty view is known to
// match the engine (it just started) or only a subset of it.
func (x *Index) reset(v *view, trusted bool) {
	v.stats.Resets++
	x.dropAll(v)
	v.blocks = map[uint64]struct{}{}
	v.untilTrusted = time.Time{}
	if !trusted {
		v.untilTrusted = x.now().Add(x.resync)
	}
}

// Disconnected records that a backend's stream is down. The view is
// untrusted from then on, and the next batch (which marks the stream up
// again) starts it over as if it were the first: a sequence number that
// follows on from the last one cannot tell a stream that merely paused
// from an engine that restarted and whose first batches were lost, and a
// kept view would then hold blocks the new engine never had.
func (x *Index) Disconnected(backend string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	v := x.viewLocked(backend)
	v.connected, v.haveSeq = false, false
}

// Forget drops a backend's view entirely (it left the configuration).
func (x *Index) Forget(backend string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if v := x.backends[backend]; v != nil {
		x.dropAll(v)
		if v.id >= 0 {
			x.ids.Remove(v.id)
		}
	}
	delete(x.backends, backend)
}

// Apply applies one batch published with sequence number seq. Sequence
// numbers count up by one per batch from 0 (vLLM) or 1 (llm-d's
// simulator) when the engine starts: a batch that skips ahead means
// batches were lost (a gap), one that goes back or repeats means the
// engine restarted with an empty cache.
func (x *Index) Apply(backend string, seq uint64, b Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	v := x.viewLocked(backend)
	v.stats.Batches++
	switch {
	case !v.haveSeq:
		// First batch seen since (re)connecting: exact only if it is the
		// engine's first.
		if v.stats.Batches > 1 && seq <= v.seq {
			v.stats.Restarts++
		}
		x.reset(v, seq <= 1)
	case seq <= v.seq:
		v.stats.Restarts++
		x.reset(v, seq <= 1)
	case seq != v.seq+1:
		v.stats.Gaps++
		x.reset(v, false)
	}
	v.seq, v.haveSeq, v.connected = seq, true, true
	v.stats.Ignored += uint64(b.Skipped)
	for _, ev := range b.Events {
		x.applyEvent(v, ev)
	}
}

func (x *Index) applyEvent(v *view, ev Event) {
	switch ev.Kind {
	case AllBlocksCleared:
		v.stats.Cleared++
		x.reset(v, true)
		return
	}
	if !isGPU(ev.Medium) {
		v.stats.Ignored++
		return
	}
	switch ev.Kind {
	case BlockStored:
		v.stats.Stored++
		for _, h := range ev.Hashes {
			if len(v.blocks) >= x.lim.MaxBlocks {
				// More blocks than any engine we serve should hold:
				// removals were missed or the engine is bigger than the
				// bound. Either way the view cannot be exact.
				v.stats.Overflows++
				x.reset(v, false)
				return
			}
			x.hold(v, h)
		}
		v.stats.Peak = max(v.stats.Peak, len(v.blocks))
	case BlockRemoved:
		v.stats.Removed++
		for _, h := range ev.Hashes {
			x.drop(v, h)
		}
	}
}

func (v *view) trusted(now time.Time) bool {
	return v.connected && v.haveSeq && !now.Before(v.untilTrusted)
}

// Match returns how many leading blocks of chain (block hashes in prompt
// order, each naming its prefix) backend holds, and whether its view is
// trusted; when it is not, the count must not be used.
func (x *Index) Match(backend string, chain []uint64) (n int, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.backends[backend].match(x.now(), chain)
}

// MatchAll is Match for each of backends, into n[i] and ok[i] (both as
// long as backends), under one read lock and one clock reading, and in one
// walk down chain for all of them: a decision scores every backend that
// publishes events.
func (x *Index) MatchAll(backends []string, chain []uint64, n []int, ok []bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	now := x.now()
	var alive blockset.Set // trusted views still matching, by id
	var depth [MaxMatched]int32
	for i, b := range backends {
		v := x.backends[b]
		switch {
		case v == nil || !v.trusted(now):
			n[i], ok[i] = 0, false
		case v.id < 0:
			// Past MaxMatched: the count, marked, until the walk is done.
			m, _ := v.match(now, chain)
			n[i], ok[i] = MaxMatched+m, true
		default:
			// n[i] holds the id until the walk is done.
			n[i], ok[i] = v.id, true
			alive.Add(v.id)
			depth[v.id] = int32(len(chain))
		}
	}
	// A view's depth is written when it drops out: at the first block it
	// does not hold.
	for i, h := range chain {
		if alive.Empty() {
			break
		}
		s := x.holders.Get(h)
		for w := range alive {
			for gone := alive[w] &^ s[w]; gone != 0; gone &= gone - 1 {
				depth[w*64+bits.TrailingZeros64(gone)] = int32(i)
			}
			alive[w] &= s[w]
		}
	}
	for i := range backends {
		switch {
		case !ok[i]:
		case n[i] >= MaxMatched:
			n[i] -= MaxMatched
		default:
			n[i] = int(depth[n[i]])
		}
	}
}

func (v *view) match(now time.Time, chain []uint64) (n int, ok bool) {
	if v == nil || !v.trusted(now) {
		return 0, false
	}
	for _, h := range chain {
		if _, held := v.blocks[h]; !held {
			break
		}
		n++
	}
	return n, true
}

// Holds reports whether backend's view (trusted or not) has block h.
func (x *Index) Holds(backend string, h uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	v := x.backends[backend]
	if v == nil {
		return false
	}
	_, ok := v.blocks[h]
	return ok
}

// Blocks returns how many blocks backend's view holds (trusted or not).
func (x *Index) Blocks(backend string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if v := x.backends[backend]; v != nil {
		return len(v.blocks)
	}
	return 0
}

// Stats returns a backend's counters and state.
func (x *Index) Stats(backend string) Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	v := x.backends[backend]
	if v == nil {
		return Stats{}
	}
	s := v.stats
	s.Blocks = len(v.blocks)
	s.Trusted = v.trusted(x.now())
	s.Connected = v.connected
	s.Seq = v.seq
	return s
}
