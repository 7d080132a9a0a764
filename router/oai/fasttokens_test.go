package oai

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// fastTokensBefore and parseDigitsBefore are fastTokens and parseDigits as
// they were before the marks were cut at the end of b and the stretch read
// unrolled (commit 6a0d434): the reference the differential tests below
// hold the current reading to.
func fastTokensBefore(b []byte, i int, toks []uint32) (int, []uint32, bool) {
	start := i // of the element being read
	for base := i; base+8 <= len(b); {
		var seps uint64 // bit j: b[base+j] is not a digit
		n := 0
		for ; n < 64 && base+n+8 <= len(b); n += 8 {
			seps |= highBits(nonDigits(binary.LittleEndian.Uint64(b[base+n:]))) << n
		}
		for ; seps != 0; seps &= seps - 1 {
			end := base + bits.TrailingZeros64(seps)
			k := end - start
			if k < 1 || k > 7 || start+8 > len(b) || (k > 1 && b[start] == '0') {
				return start, toks, false
			}
			c := b[end]
			if c != ',' && c != ']' {
				return start, toks, false
			}
			toks = append(toks, parseDigitsBefore(binary.LittleEndian.Uint64(b[start:]), k))
			start = end + 1
			if c == ']' {
				return start, toks, true
			}
		}
		base += n
	}
	return start, toks, false
}

func parseDigitsBefore(x uint64, k int) uint32 {
	x = (x & (ones * 0x0f)) << (8 * (8 - k))
	x = (x * (1 + 10<<8)) >> 8 & 0x00ff00ff00ff00ff
	x = (x * (1 + 100<<16)) >> 16 & 0x0000ffff0000ffff
	return uint32((x * (1 + 10000<<32)) >> 32)
}

// checkFastTokens holds fastTokens to fastTokensBefore on b from i. Both
// may stop at any element and leave it to the byte-wise reading, so they
// need not stop at the same place; what tokenArray needs of them is that
// they agree on every id both read and that each stops at an element. The
// current one stops no later than before, and earlier only at an id that
// ends within 7 bytes of the end of b.
func checkFastTokens(t *testing.T, b []byte, i int) {
	t.Helper()
	seed := []uint32{7} // ids already read: both append after them
	po, to, do := fastTokensBefore(b, i, slices.Clone(seed))
	pn, tn, dn := fastTokens(b, i, slices.Clone(seed))
	switch {
	case len(tn) > len(to) || !slices.Equal(tn, to[:len(tn)]):
		t.Fatalf("%q from %d: ids %v, before %v", b, i, tn, to)
	case pn == po && (dn != do || len(tn) != len(to)):
		t.Fatalf("%q from %d: stopped at %d as before, but done %v (before %v), ids %v (before %v)", b, i, pn, dn, do, tn, to)
	case pn > po:
		t.Fatalf("%q from %d: stopped at %d, later than before (%d)", b, i, pn, po)
	case pn < po:
		end := pn
		for end < len(b) && isDigit(b[end]) {
			end++
		}
		if end <= len(b)-7 || dn {
			t.Fatalf("%q from %d: stopped at %d (done %v) where before read on to %d; the id there ends at %d", b, i, pn, dn, po, end)
		}
	}
	if len(tn) > len(seed) && pn != i && pn > 0 && !dn && b[pn-1] != ',' {
		t.Fatalf("%q from %d: stopped at %d, not at an element", b, i, pn)
	}
}

// tokenText is a random stretch of what an array of token ids holds, and
// of what it may hold instead: ids of 1 to 10 digits, leading zeros,
// signs, spaces, missing and doubled commas, brackets, other bytes, the
// whole cut short anywhere, after a prefix that moves it across words.
func tokenText(rng *rand.Rand) ([]byte, int) {
	b := make([]byte, rng.IntN(20))
	for j := range b {
		b[j] = `{"prompt":[`[rng.IntN(11)]
	}
	i := len(b)
	clean := rng.IntN(2) == 0
	for range rng.IntN(80) {
		id := strconv.FormatUint(rng.Uint64N(1<<(3*(1+rng.IntN(7)))), 10) // 1 to 7 digits
		switch r := rng.IntN(60); {
		case clean || r < 40:
		case r < 43:
			id = "0" + id
		case r < 46:
			id = strconv.FormatUint(rng.Uint64N(1e10), 10)
		case r < 48:
			id = ""
		case r < 50:
			id = "-" + id
		case r < 52:
			id = " " + id
		case r < 54:
			id += " "
		default:
			id = string([]byte{byte(rng.IntN(256))})
		}
		b = append(b, id...)
		sep := byte(',')
		if !clean && rng.IntN(12) == 0 {
			sep = "],,x\x00 /:"[rng.IntN(8)]
		}
		b = append(b, sep)
	}
	if len(b) > i && b[len(b)-1] == ',' && rng.IntN(4) > 0 {
		b[len(b)-1] = ']'
	}
	b = append(b, "}}}}}}}}}}"[:rng.IntN(11)]...)
	if !clean && rng.IntN(5) == 0 {
		b = b[:i+rng.IntN(len(b)-i+1)]
	}
	return b, i
}

// TestFastTokensAgreesWithBefore: the differential test of the word-wise
// reading against its previous version, on random arrays of every shape.
func TestFastTokensAgreesWithBefore(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 64))
	read := 0
	for range 50000 {
		b, i := tokenText(rng)
		checkFastTokens(t, b, i)
		if _, toks, _ := fastTokens(b, i, nil); len(toks) > 16 {
			read++
		}
	}
	if read < 5000 {
		t.Fatalf("only %d texts gave more than 16 ids: the test checks too little", read)
	}
}

// FuzzFastTokens is TestFastTokensAgreesWithBefore on the fuzzer's bytes,
// read from each position.
func FuzzFastTokens(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range 8 {
		b, _ := tokenText(rng)
		f.Add(b)
	}
	f.Add([]byte("1234567,1,12,123,1234,12345,123456,1234567,0,7,01,1,2,3,4,5,6,7,8,9,10]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := range len(b) + 1 {
			checkFastTokens(t, b, i)
		}
	})
}
