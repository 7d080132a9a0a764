package p2p

import (
	"fmt"
	"math/bits"
)

// Bitfield is a set of piece indexes in BitTorrent bit order (piece 0 is the
// high bit of byte 0).
type Bitfield struct {
	n int
	b []byte
}

// NewBitfield returns an empty set for n pieces.
func NewBitfield(n int) Bitfield { return Bitfield{n: n, b: make([]byte, (n+7)/8)} }

// ParseBitfield checks that b is a bitfield for n pieces: the right length
// and no bits set past the last piece.
func ParseBitfield(b []byte, n int) (Bitfield, error) {
	if len(b) != (n+7)/8 {
		return Bitfield{}, fmt.Errorf("bitfield: %d bytes for %d pieces", len(b), n)
	}
	if n%8 != 0 && b[len(b)-1]&(0xff>>(n%8)) != 0 {
		return Bitfield{}, fmt.Errorf("bitfield: bits set past piece %d", n-1)
	}
	return Bitfield{n: n, b: append([]byte(nil), b...)}, nil
}

// Len is the number of pieces the set is sized for.
func (f Bitfield) Len() int { return f.n }

// Has reports whether piece i is in the set.
func (f Bitfield) Has(i int) bool {
	return i >= 0 && i < f.n && f.b[i/8]&(0x80>>(i%8)) != 0
}

// Set adds piece i.
func (f Bitfield) Set(i int) { f.b[i/8] |= 0x80 >> (i % 8) }

// Clear removes piece i.
func (f Bitfield) Clear(i int) { f.b[i/8] &^= 0x80 >> (i % 8) }

// Count is the number of pieces in the set.
func (f Bitfield) Count() int {
	c := 0
	for _, x := range f.b {
		c += bits.OnesCount8(x)
	}
	return c
}

// Full reports whether every piece is in the set.
func (f Bitfield) Full() bool { return f.Count() == f.n }

// Bytes returns a copy of the wire form.
func (f Bitfield) Bytes() []byte { return append([]byte(nil), f.b...) }

// Clone returns an independent copy.
func (f Bitfield) Clone() Bitfield { return Bitfield{n: f.n, b: f.Bytes()} }
