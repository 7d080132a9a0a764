package kvevents

import "math/bits"

// holders maps a block hash to the set of views holding it: an
// open-addressed table, probed linearly, whose slots hold the hash and the
// set side by side. Matching a prompt looks up every one of its blocks, and
// the table is megabytes, so each lookup is a read from far memory: here it
// is one read (a slot, and the one after it at worst), where a Go map reads
// a group's control word and then the slot, and calls a function to do so.
// A zero hash, which marks a free slot, is kept on its own.
type holders struct {
	slots []holderSlot // a power of two long; nil until the first block
	shift uint         // 64 - log2(len(slots))
	n     int          // slots in use
	zero  idSet        // the views holding block 0
}

type holderSlot struct {
	hash uint64 // 0: free
	set  idSet
}

// holdersMinSlots is the table's first size.
const holdersMinSlots = 1 << 10

// home is the slot where a probe for h starts: the top bits of a
// multiplication, as block hashes from tests may be small integers.
func (t *holders) home(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> t.shift)
}

// find is the slot holding h, or the free slot where a probe for it ends.
func (t *holders) find(h uint64) int {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].hash != h && t.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	return i
}

// len is how many blocks some view holds.
func (t *holders) len() int {
	if t.zero.empty() {
		return t.n
	}
	return t.n + 1
}

// get is the set of views holding h (empty when none does).
func (t *holders) get(h uint64) idSet {
	if h == 0 {
		return t.zero
	}
	if t.slots == nil {
		return idSet{}
	}
	return t.slots[t.find(h)].set
}

// add puts view id among h's holders.
func (t *holders) add(h uint64, id int) {
	if h == 0 {
		t.zero.add(id)
		return
	}
	if (t.n+1)*4 > len(t.slots)*3 { // at most three quarters full
		t.grow()
	}
	i := t.find(h)
	if t.slots[i].hash == 0 {
		t.slots[i].hash = h
		t.n++
	}
	t.slots[i].set.add(id)
}

// remove takes view id out of h's holders, and h out of the table when
// none is left.
func (t *holders) remove(h uint64, id int) {
	if h == 0 {
		t.zero.remove(id)
		return
	}
	if t.slots == nil {
		return
	}
	i := t.find(h)
	if t.slots[i].hash == 0 {
		return
	}
	t.slots[i].set.remove(id)
	if t.slots[i].set.empty() {
		t.delete(i)
	}
}

// delete frees slot i, moving back the slots after it whose probes pass
// through it so that every probe still finds what it looks for.
func (t *holders) delete(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].hash != 0; j = (j + 1) & mask {
		// The slot at j stays unless its home lies cyclically outside (i, j].
		if home := t.home(t.slots[j].hash); (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = holderSlot{}
	t.n--
}

func (t *holders) grow() {
	old := t.slots
	t.slots = make([]holderSlot, max(holdersMinSlots, 2*len(old)))
	t.shift = uint(64 - bits.TrailingZeros(uint(len(t.slots))))
	for _, s := range old {
		if s.hash != 0 {
			t.slots[t.find(s.hash)] = s
		}
	}
}
