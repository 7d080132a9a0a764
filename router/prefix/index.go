package prefix

import (
	"math/bits"

	"github.com/warmfleet/warmfleet/router/internal/blockset"
)

// MaxSlots is how many backends one Index can track (bitset width).
const MaxSlots = 256

// Set is a set of backend slots (MaxSlots bits).
type Set blockset.Set

func (s *Set) add(i int)      { (*blockset.Set)(s).Add(i) }
func (s *Set) remove(i int)   { (*blockset.Set)(s).Remove(i) }
func (s *Set) Has(i int) bool { return s[i>>6]&(1<<(i&63)) != 0 }
func (s *Set) and(o *Set)     { s[0] &= o[0]; s[1] &= o[1]; s[2] &= o[2]; s[3] &= o[3] }
func (s *Set) andNot(o *Set)  { s[0] &^= o[0]; s[1] &^= o[1]; s[2] &^= o[2]; s[3] &^= o[3] }
func (s *Set) empty() bool    { return (*blockset.Set)(s).Empty() }

// single reports whether the set has exactly one member.
func (s *Set) single() bool { return s.Count() == 1 }

// first returns the lowest member of a non-empty set.
func (s *Set) first() int {
	for w, word := range s {
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
	}
	return -1
}
func (s *Set) Count() int {
	return bits.OnesCount64(s[0]) + bits.OnesCount64(s[1]) + bits.OnesCount64(s[2]) + bits.OnesCount64(s[3])
}
func (s *Set) each(f func(i int)) {
	for w, word := range s {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			f(w*64 + b)
			word &= word - 1
		}
	}
}

// Index approximates which backend (slot) holds which block hashes: one LRU
// per slot with a capacity mirroring that backend's KV cache (exact but for
// the order of blocks within the most recent quarter), and a shared
// table from hash to the set of slots holding it (a blockset.Table: one
// read from memory per lookup), so a match costs one lookup per leading
// block no matter how many backends there are.
// It is not safe for concurrent use.
type Index struct {
	holders blockset.Table // slots holding each block
	lrus    [MaxSlots]*lru
	tracked Set // slots with an LRU

	// Heat: how many recent requests carried a block, counted at Insert
	// and halved every heatHalfLife requests, so Hot can tell a prefix
	// that much of the traffic shares (a chat app's system prompt) from
	// one group's history.
	heatHalfLife uint64
	heats        map[uint64]heat // nil while not counting
	requests     uint64
	total        heat // requests, decayed the same way
}

// heat is a count halved once per elapsed epoch of heatHalfLife requests.
type heat struct {
	n     uint32
	epoch uint32
}

// at returns h's count in epoch e.
func (h heat) at(e uint32) uint32 {
	if d := e - h.epoch; d < 32 {
		return h.n >> d
	}
	return 0
}

// NewIndex returns an empty index; it counts no heat until SetHeat.
func NewIndex() *Index { return &Index{} }

// SetHeat starts counting heat, halved every halfLife requests, or stops
// (halfLife <= 0) and forgets it: counting costs a map write per block of
// every request, which only Hot needs.
func (x *Index) SetHeat(halfLife int) {
	if uint64(max(halfLife, 0)) == x.heatHalfLife {
		return
	}
	x.heatHalfLife = uint64(max(halfLife, 0))
	x.requests, x.total, x.heats = 0, heat{}, nil
	if halfLife > 0 {
		x.heats = map[uint64]heat{}
	}
}

func (x *Index) counting() bool { return x.heatHalfLife > 0 }

func (x *Index) epoch() uint32 {
	if !x.counting() {
		return 0
	}
	return uint32(x.requests / x.heatHalfLife)
}

// Hot returns how many leading blocks are each carried by at least share/n
// of recent requests (n: the backends that could serve them). A prefix that
// busy cannot stay on one backend without pushing it past its fair share,
// so callers treat it as common: every backend should come to hold it, and
// where the request goes is decided by what follows it. 0 while the recent
// traffic (decayed like the heat) is under n requests, when share <= 0, or
// when heat is not counted.
func (x *Index) Hot(blocks []uint64, n int, share float64) int {
	e := x.epoch()
	total := float64(x.total.at(e))
	if !x.counting() || share <= 0 || n <= 0 || total < float64(n) {
		return 0
	}
	need := share * total / float64(n)
	for i, h := range blocks {
		if float64(x.heats[h].at(e)) < need {
			return i
		}
	}
	return len(blocks)
}

type node struct {
	hash       uint64
	prev, next int32
	moved      uint64 // the LRU's pushes when this node last went to the front
}

// lru is an intrusive doubly linked list over a slab; head is most recent.
type lru struct {
	capacity   int
	pushes     uint64 // nodes sent to the front so far
	pos        map[uint64]int32
	nodes      []node
	free       []int32
	head, tail int32
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, pos: map[uint64]int32{}, head: -1, tail: -1}
}

func (l *lru) unlink(i int32) {
	n := &l.nodes[i]
	if n.prev >= 0 {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
}

func (l *lru) pushFront(i int32) {
	l.pushes++
	n := &l.nodes[i]
	n.moved = l.pushes
	n.prev, n.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// SetSlot starts tracking slot with the given capacity in blocks (or changes
// its capacity, evicting as needed).
func (x *Index) SetSlot(slot, capacity int) {
	capacity = max(capacity, 1)
	l := x.lrus[slot]
	if l == nil {
		x.lrus[slot] = newLRU(capacity)
		x.tracked.add(slot)
		return
	}
	l.capacity = capacity
	for len(l.pos) > l.capacity {
		x.evict(slot, l)
	}
}

// RemoveSlot forgets everything slot holds.
func (x *Index) RemoveSlot(slot int) {
	l := x.lrus[slot]
	if l == nil {
		return
	}
	for h := range l.pos {
		x.clear(h, slot)
	}
	x.lrus[slot] = nil
	x.tracked.remove(slot)
}

func (x *Index) clear(h uint64, slot int) {
	if x.holders.Remove(h, slot) {
		delete(x.heats, h)
	}
}

func (x *Index) evict(slot int, l *lru) {
	i := l.tail
	h := l.nodes[i].hash
	l.unlink(i)
	delete(l.pos, h)
	l.free = append(l.free, i)
	x.clear(h, slot)
}

// Insert records that slot now holds blocks (a chain, first block first)
// and counts one request carrying them. Blocks are touched last to first so
// the leading blocks are the most recently used and a prefix is evicted
// from its tail, as vLLM does. held is how many leading blocks Match found
// the slot holding (0 if not known).
func (x *Index) Insert(slot int, blocks []uint64, held int) {
	l := x.lrus[slot]
	if l == nil {
		return
	}
	count := x.counting()
	var e uint32
	if count {
		x.requests++
		e = x.epoch()
		x.total = heat{n: x.total.at(e) + 1, epoch: e}
	}
	// The blocks before one the slot holds were touched right after it, at
	// every request carrying it (its hash covers them), and each was then
	// left within a quarter of the cache from the front (see below). So if
	// the deepest held block went to the front less than a quarter of the
	// cache ago, the ones before it are within about half of it: leave them
	// all, without a lookup each. Hot prefixes are long and carried by most
	// requests, so this is most of a hit's blocks. Past that, the loop
	// below moves the deepest block, and the next request skips again.
	keep := 0 // blocks [0, keep) are left where they are
	if held > 0 && held <= len(blocks) {
		if i, ok := l.pos[blocks[held-1]]; ok && l.pushes-l.nodes[i].moved < uint64(l.capacity/4) {
			keep = held
		}
	}
	for j := len(blocks) - 1; j >= 0; j-- {
		h := blocks[j]
		if count {
			x.heats[h] = heat{n: x.heats[h].at(e) + 1, epoch: e}
		}
		if j < keep {
			if !count {
				break
			}
			continue
		}
		if i, ok := l.pos[h]; ok {
			// A block sent to the front less than a quarter of the cache
			// ago is at most that far from it, nowhere near eviction: leave
			// it. Relinking costs three scattered nodes per block, and the
			// blocks of a popular prefix are touched by every request.
			if l.pushes-l.nodes[i].moved >= uint64(l.capacity/4) {
				l.unlink(i)
				l.pushFront(i)
			}
			continue
		}
		if len(l.pos) >= l.capacity {
			x.evict(slot, l)
		}
		var i int32
		if n := len(l.free); n > 0 {
			i = l.free[n-1]
			l.free = l.free[:n-1]
		} else {
			l.nodes = append(l.nodes, node{})
			i = int32(len(l.nodes) - 1)
		}
		l.nodes[i].hash = h
		l.pos[h] = i
		l.pushFront(i)
		x.holders.Add(h, slot)
	}
}

// Match writes into depth[slot] how many leading blocks each slot holds
// (depth must have MaxSlots entries; slots not touched are left as they
// are, so callers zero it first) and returns the deepest match and the
// depth every tracked slot holds (the common prefix). The walk stops at the
// first block no slot holds; once one slot is left, it gallops.
func (x *Index) Match(blocks []uint64, depth []int) (deepest, common int) {
	var alive Set
	tracked := x.tracked
	commonOpen := !tracked.empty()
	// A slot's depth is written once, when it drops out of the walk (or at
	// the end), not at every block: the leading blocks of a shared prompt
	// are held by most slots.
	for i, h := range blocks {
		s := Set(x.holders.Get(h))
		narrowed := i == 0
		if i == 0 {
			alive = s
		} else {
			dropped := alive
			alive.and(&s)
			dropped.andNot(&alive)
			dropped.each(func(slot int) { depth[slot] = i })
			narrowed = !dropped.empty()
		}
		if alive.empty() { // also when no slot holds h
			return deepest, common
		}
		deepest = i + 1
		if commonOpen {
			t := tracked
			t.and(&alive)
			if t == tracked {
				common = i + 1
			} else {
				commonOpen = false
			}
		}
		if narrowed && alive.single() {
			slot := alive.first()
			// One slot left: find where its run ends by galloping rather
			// than looking up every block. A slot that holds a block holds
			// the ones before it: every request carrying a block carries
			// them, and Insert touches them after it. (Not quite always:
			// an earlier block Insert left in place can reach the LRU's
			// tail shortly before a later one, and the run then looks a
			// few blocks longer than it is until that one goes too.)
			deepest = i + 1 + x.run(slot, blocks[i+1:])
			depth[slot] = deepest
			if commonOpen {
				common = deepest
			}
			return deepest, common
		}
	}
	alive.each(func(slot int) { depth[slot] = deepest })
	return deepest, common
}

// run returns how many leading blocks slot holds, in O(log n) lookups.
func (x *Index) run(slot int, blocks []uint64) int {
	holds := func(k int) bool { // the first k blocks
		s := Set(x.holders.Get(blocks[k-1]))
		return s.Has(slot)
	}
	lo, step := 0, 1 // lo blocks are held
	for lo+step <= len(blocks) && holds(lo+step) {
		lo += step
		step *= 2
	}
	hi := min(lo+step, len(blocks)+1) // not held, or past the end
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if holds(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Len returns how many blocks slot holds.
func (x *Index) Len(slot int) int {
	if l := x.lrus[slot]; l != nil {
		return len(l.pos)
	}
	return 0
}
