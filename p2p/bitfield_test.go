package p2p

import (
	"bufio"
	"bytes"
	"testing"
)

func TestParseBitfield(t *testing.T) {
	cases := []struct {
		name    string
		b       []byte
		n       int
		wantErr bool
		count   int
	}{
		{"empty", nil, 0, false, 0},
		{"exact byte", []byte{0xff}, 8, false, 8},
		{"partial byte", []byte{0xff, 0x80}, 9, false, 9},
		{"spare bit set", []byte{0xff, 0x40}, 9, true, 0},
		{"too short", []byte{0xff}, 9, true, 0},
		{"too long", []byte{0xff, 0}, 8, true, 0},
	}
	for _, c := range cases {
		bf, err := ParseBitfield(c.b, c.n)
		if (err != nil) != c.wantErr {
			t.Fatalf("%s: err = %v", c.name, err)
		}
		if err == nil && bf.Count() != c.count {
			t.Fatalf("%s: count %d, want %d", c.name, bf.Count(), c.count)
		}
	}
	bf := NewBitfield(10)
	bf.Set(0)
	bf.Set(9)
	if !bf.Has(0) || !bf.Has(9) || bf.Has(5) || bf.Has(10) || bf.Has(-1) || !bytes.Equal(bf.Bytes(), []byte{0x80, 0x40}) {
		t.Fatalf("bitfield bits wrong: %08b", bf.Bytes())
	}
	bf.Clear(0)
	if bf.Count() != 1 || bf.Full() {
		t.Fatal("clear failed")
	}
}

func FuzzParseBitfield(f *testing.F) {
	f.Add([]byte{0xff, 0x80}, 9)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > MaxPieces {
			return
		}
		bf, err := ParseBitfield(b, n)
		if err != nil {
			return
		}
		if bf.Count() > n || !bytes.Equal(bf.Bytes(), b) {
			t.Fatalf("accepted bitfield with %d of %d pieces", bf.Count(), n)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	_ = writeFrame(&b, msgPiece, append(u32(3), u32(1<<20)...))
	f.Add(b.Bytes())
	f.Add([]byte{msgHave, 0, 0, 0, 4, 0, 0, 0, 9})
	f.Add([]byte{msgBitfield, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		fr, err := readFrame(bufio.NewReader(bytes.NewReader(in)))
		if err != nil {
			return
		}
		if len(fr.payload) > maxFramePayload {
			t.Fatalf("frame of %d bytes accepted", len(fr.payload))
		}
		if i, err := fr.index(16); err == nil && (i < 0 || i >= 16) {
			t.Fatalf("index %d out of range accepted", i)
		}
	})
}
