package prefix

import (
	"encoding/binary"
	"math/bits"
)

// Key is a 128-bit SipHash key: the per-fleet secret that keys every block
// hash, so a stored or exported hash cannot be checked against a guessed
// prompt without it.
type Key struct{ K0, K1 uint64 }

// KeyFromBytes derives a key from secret material of any length (a cluster
// key file, for instance). Short secrets are weak; 16+ random bytes are best.
func KeyFromBytes(secret []byte) Key {
	// Compress with SipHash under a fixed domain key so any length works.
	domain := Key{0x7761726d666c6565, 0x7420726f75746572} // "warmfleet router"
	return Key{K0: domain.Sum(append([]byte{0}, secret...)), K1: domain.Sum(append([]byte{1}, secret...))}
}

type sipState struct{ v0, v1, v2, v3 uint64 }

func (k Key) init() sipState {
	return sipState{k.K0 ^ 0x736f6d6570736575, k.K1 ^ 0x646f72616e646f6d, k.K0 ^ 0x6c7967656e657261, k.K1 ^ 0x7465646279746573}
}

func (s *sipState) round() {
	s.v0 += s.v1
	s.v1 = bits.RotateLeft64(s.v1, 13)
	s.v1 ^= s.v0
	s.v0 = bits.RotateLeft64(s.v0, 32)
	s.v2 += s.v3
	s.v3 = bits.RotateLeft64(s.v3, 16)
	s.v3 ^= s.v2
	s.v0 += s.v3
	s.v3 = bits.RotateLeft64(s.v3, 21)
	s.v3 ^= s.v0
	s.v2 += s.v1
	s.v1 = bits.RotateLeft64(s.v1, 17)
	s.v1 ^= s.v2
	s.v2 = bits.RotateLeft64(s.v2, 32)
}

func (s *sipState) compress(m uint64) {
	s.v3 ^= m
	s.round()
	s.round()
	s.v0 ^= m
}

func (s *sipState) finish(last uint64) uint64 {
	s.compress(last)
	s.v2 ^= 0xff
	s.round()
	s.round()
	s.round()
	s.round()
	return s.v0 ^ s.v1 ^ s.v2 ^ s.v3
}

// Sum is SipHash-2-4 of msg under k.
func (k Key) Sum(msg []byte) uint64 {
	s := k.init()
	n := len(msg)
	for len(msg) >= 8 {
		s.compress(binary.LittleEndian.Uint64(msg))
		msg = msg[8:]
	}
	last := uint64(n) << 56
	for i, c := range msg {
		last |= uint64(c) << (8 * i)
	}
	return s.finish(last)
}

// Sum2 is SipHash-2-4 of the 16-byte little-endian encoding of a, b,
// without building the byte slice. It is on the hot path (once per block),
// so the rounds are written out to stay in registers.
func (k Key) Sum2(a, b uint64) uint64 {
	v0, v1 := k.K0^0x736f6d6570736575, k.K1^0x646f72616e646f6d
	v2, v3 := k.K0^0x6c7967656e657261, k.K1^0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13) ^ v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16) ^ v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21) ^ v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17) ^ v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	for _, m := range [3]uint64{a, b, 16 << 56} {
		v3 ^= m
		round()
		round()
		v0 ^= m
	}
	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}
