// Package blockset maps block hashes to sets of up to 256 holders (the
// backends of the approximate prefix index, the event views of the exact
// one): a decision looks up every leading block of its prompt, and the
// table is megabytes, so each lookup is a read from far memory. Table keeps
// it to one.
package blockset

import "math/bits"

// Set is a set of holders 0..255, as a bitmap; the KV index uses it as is,
// the prefix index converts it to its own Set (the same array).
type Set [4]uint64

// Table maps a block hash to the set of its holders: an open-addressed
// table, probed linearly, whose slots hold the hash and the set side by
// side. A lookup is one read (a slot, and the one after it at worst), where
// a Go map reads a group's control word and then the slot, and calls a
// function to do so. A zero hash, which marks a free slot, is kept on its
// own. The zero Table is empty and ready; it is not safe for concurrent
// use.
type Table struct {
	slots []slot // a power of two long; nil until the first block
	shift uint   // 64 - log2(len(slots))
	n     int    // slots in use
	zero  Set    // the holders of block 0
}

type slot struct {
	hash uint64 // 0: free
	set  Set
}

// minSlots is the table's first size.
const minSlots = 1 << 10

// Add puts i in s.
func (s *Set) Add(i int) { s[i>>6] |= 1 << (i & 63) }

// Remove takes i out of s.
func (s *Set) Remove(i int) { s[i>>6] &^= 1 << (i & 63) }

// Empty reports whether s holds nothing.
func (s *Set) Empty() bool { return s[0]|s[1]|s[2]|s[3] == 0 }

// home is the slot where a probe for h starts: the top bits of a
// multiplication, as block hashes from tests may be small integers.
func (t *Table) home(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> t.shift)
}

// find is the slot holding h, or the free slot where a probe for it ends.
func (t *Table) find(h uint64) int {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].hash != h && t.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	return i
}

// Len is how many blocks some holder holds.
func (t *Table) Len() int {
	if t.zero.Empty() {
		return t.n
	}
	return t.n + 1
}

// Get is the set of h's holders (empty when none holds it).
func (t *Table) Get(h uint64) Set {
	if h == 0 {
		return t.zero
	}
	if t.slots == nil {
		return Set{}
	}
	return t.slots[t.find(h)].set
}

// Add puts holder i (0..255) among h's holders.
func (t *Table) Add(h uint64, i int) {
	if h == 0 {
		t.zero.Add(i)
		return
	}
	if (t.n+1)*4 > len(t.slots)*3 { // at most three quarters full
		t.grow()
	}
	j := t.find(h)
	if t.slots[j].hash == 0 {
		t.slots[j].hash = h
		t.n++
	}
	t.slots[j].set.Add(i)
}

// Remove takes holder i out of h's holders, and h out of the table when
// none is left; it reports whether none is (whether or not h was held).
func (t *Table) Remove(h uint64, i int) (gone bool) {
	if h == 0 {
		t.zero.Remove(i)
		return t.zero.Empty()
	}
	if t.slots == nil {
		return true
	}
	j := t.find(h)
	if t.slots[j].hash == 0 {
		return true
	}
	t.slots[j].set.Remove(i)
	if !t.slots[j].set.Empty() {
		return false
	}
	t.delete(j)
	return true
}

// delete frees slot i, moving back the slots after it whose probes pass
// through it so that every probe still finds what it looks for.
func (t *Table) delete(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].hash != 0; j = (j + 1) & mask {
		// The slot at j stays unless its home lies cyclically outside (i, j].
		if home := t.home(t.slots[j].hash); (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

func (t *Table) grow() {
	old := t.slots
	t.slots = make([]slot, max(minSlots, 2*len(old)))
	t.shift = uint(64 - bits.TrailingZeros(uint(len(t.slots))))
	for _, s := range old {
		if s.hash != 0 {
			t.slots[t.find(s.hash)] = s
		}
	}
}
