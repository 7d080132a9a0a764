package p2p

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/anacrolix/torrent/bencode"
	"github.com/anacrolix/torrent/metainfo"
)

func testManifest(algo HashAlgo, fileSize, off, length, piece int64) *Manifest {
	m := &Manifest{ShardID: "bucket/model.safetensors@etag#0", Name: "model.safetensors",
		FileSize: fileSize, Offset: off, Length: length, PieceLength: piece, Algo: algo}
	m.Hashes = bytes.Repeat([]byte{0xab}, m.NumPieces()*algo.Size())
	for i := range m.Hashes {
		m.Hashes[i] ^= byte(i)
	}
	return m
}

func TestManifestRoundTrip(t *testing.T) {
	for _, m := range []*Manifest{
		testManifest(SHA256, 100<<20, 0, 100<<20, 8<<20),
		testManifest(SHA1, 100<<20, 16<<20, 5<<20+1, 1<<20),
		testManifest(SHA256, 0, 0, 0, MinPieceLength),
		testManifest(BLAKE3, 1<<30, 1<<29, 1<<29, 8<<20),
		testManifest(SHA1, MaxFileSize, MaxFileSize-MaxPieceLength*3, MaxPieceLength*3, MaxPieceLength),
	} {
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("marshal %+v: %v", m, err)
		}
		got, err := DecodeManifest(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got.ShardID != m.ShardID || got.Name != m.Name || got.FileSize != m.FileSize || got.Offset != m.Offset ||
			got.Length != m.Length || got.PieceLength != m.PieceLength || got.Algo != m.Algo || !bytes.Equal(got.Hashes, m.Hashes) {
			t.Fatalf("round trip changed manifest:\n got %+v\nwant %+v", got, m)
		}
		if got.ID() != m.ID() {
			t.Fatalf("ID changed across round trip")
		}
	}
}

func TestManifestRejectsHostileValues(t *testing.T) {
	base := func() *Manifest { return testManifest(SHA256, 64<<20, 0, 64<<20, 8<<20) }
	cases := map[string]func(m *Manifest){
		"zero piece length":   func(m *Manifest) { m.PieceLength = 0 },
		"tiny piece length":   func(m *Manifest) { m.PieceLength = 1 },
		"huge piece length":   func(m *Manifest) { m.PieceLength = MaxPieceLength + 1 },
		"absurd file size":    func(m *Manifest) { m.FileSize = MaxFileSize + 1 },
		"range past file end": func(m *Manifest) { m.Offset = 1 },
		"negative length":     func(m *Manifest) { m.Length = -1 },
		"too few hashes":      func(m *Manifest) { m.Hashes = m.Hashes[:len(m.Hashes)-1] },
		"too many hashes":     func(m *Manifest) { m.Hashes = append(m.Hashes, make([]byte, 32)...) },
		"unknown algorithm":   func(m *Manifest) { m.Algo = 9 },
		"empty shard id":      func(m *Manifest) { m.ShardID = "" },
		"NUL in name":         func(m *Manifest) { m.Name = "a\x00b" },
		"long name":           func(m *Manifest) { m.Name = strings.Repeat("x", maxNameLen+1) },
		"too many pieces": func(m *Manifest) {
			m.FileSize, m.Length, m.PieceLength = MaxPieces*MinPieceLength, MaxPieces*MinPieceLength, MinPieceLength
			m.Hashes = make([]byte, MaxPieces*32)
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			m := base()
			mutate(m)
			if _, err := m.MarshalBinary(); err == nil {
				t.Fatalf("MarshalBinary accepted %+v", m)
			}
		})
	}
}

func TestDecodeManifestRejectsMalformedBytes(t *testing.T) {
	good, err := testManifest(SHA1, 10<<20, 0, 10<<20, 1<<20).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":          nil,
		"bad magic":      append([]byte("XXXX"), good[4:]...),
		"future version": append(append([]byte("WFMF"), 2), good[5:]...),
		"truncated":      good[:len(good)-1],
		"trailing byte":  append(append([]byte{}, good...), 0),
		"header only":    good[:6],
	}
	// Piece count claims 2^40 pieces.
	huge := append([]byte{}, good[:len(good)-10*20-1]...)
	huge = append(huge, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20)
	cases["piece count absurd"] = huge
	for name, b := range cases {
		if _, err := DecodeManifest(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func FuzzDecodeManifest(f *testing.F) {
	for _, m := range []*Manifest{
		testManifest(SHA1, 10<<20, 0, 10<<20, 1<<20),
		testManifest(SHA256, 100<<20, 3<<20, 50<<20+7, 8<<20),
		testManifest(SHA256, 0, 0, 0, MinPieceLength),
	} {
		b, err := m.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("WFMF\x01\x02"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded manifest fails validation: %v", err)
		}
		again, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		m2, err := DecodeManifest(again)
		if err != nil || m2.ID() != m.ID() {
			t.Fatalf("canonical form does not round trip: %v", err)
		}
		for i := range m.NumPieces() {
			off, n := m.PieceRange(i)
			if n <= 0 || off < m.Offset || off+n > m.Offset+m.Length {
				t.Fatalf("piece %d range [%d,+%d) outside shard", i, off, n)
			}
		}
	})
}

func TestInfoDictIsBitTorrentCompatible(t *testing.T) {
	m := testManifest(SHA1, 40<<20, 8<<20, 5<<20+3, 1<<20)
	d, err := m.InfoDict()
	if err != nil {
		t.Fatal(err)
	}
	var info metainfo.Info
	if err := bencode.Unmarshal(d, &info); err != nil {
		t.Fatalf("anacrolix cannot decode info dict: %v", err)
	}
	if info.Name != m.Name || info.Length != m.Length || info.PieceLength != m.PieceLength || info.NumPieces() != m.NumPieces() {
		t.Fatalf("info = %+v, manifest = %+v", info, m)
	}
	if !bytes.Equal(info.Pieces, m.Hashes) {
		t.Fatal("piece hashes differ")
	}
	ih, err := m.InfoHash()
	if err != nil {
		t.Fatal(err)
	}
	if ih != sha1.Sum(d) || metainfo.HashBytes(d) != metainfo.Hash(ih) {
		t.Fatal("info hash mismatch")
	}
	if _, err := testManifest(SHA256, 1<<20, 0, 1<<20, 1<<20).InfoDict(); err == nil {
		t.Fatal("sha256 manifest produced a v1 info dict")
	}
}

func TestSplitFile(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		size, maxShard, piece int64
		want                  []ShardRange
		wantErr               bool
	}{
		{size: 0, maxShard: 64 * mib, piece: 8 * mib, want: []ShardRange{{}}},
		{size: 10 * mib, maxShard: 64 * mib, piece: 8 * mib, want: []ShardRange{{0, 0, 10 * mib}}},
		{size: 130 * mib, maxShard: 64 * mib, piece: 8 * mib, want: []ShardRange{{0, 0, 64 * mib}, {1, 64 * mib, 64 * mib}, {2, 128 * mib, 2 * mib}}},
		// Shard size rounds down to whole pieces.
		{size: 20 * mib, maxShard: 12 * mib, piece: 8 * mib, want: []ShardRange{{0, 0, 8 * mib}, {1, 8 * mib, 8 * mib}, {2, 16 * mib, 4 * mib}}},
		{size: 10, maxShard: 1, piece: 8 * mib, wantErr: true},
		{size: -1, maxShard: 64 * mib, piece: 8 * mib, wantErr: true},
		{size: 10, maxShard: 64 * mib, piece: 0, wantErr: true},
	}
	for _, c := range cases {
		got, err := SplitFile(c.size, c.maxShard, c.piece)
		if (err != nil) != c.wantErr {
			t.Fatalf("SplitFile(%d,%d,%d) err = %v", c.size, c.maxShard, c.piece, err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("SplitFile(%d,%d,%d) = %v, want %v", c.size, c.maxShard, c.piece, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("SplitFile(%d,%d,%d) = %v, want %v", c.size, c.maxShard, c.piece, got, c.want)
			}
		}
	}
}

func TestHashAlgos(t *testing.T) {
	// Published digests of the empty input.
	want := map[HashAlgo]string{
		SHA1:   "da39a3ee5e6b4b0d3255bfef95601890afd80709",
		SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		BLAKE3: "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
	}
	for a, w := range want {
		if got := hex.EncodeToString(a.new().Sum(nil)); got != w {
			t.Errorf("%s(\"\") = %s, want %s", a, got, w)
		}
		if a.Size()*2 != len(w) {
			t.Errorf("%s size %d", a, a.Size())
		}
		if p, err := ParseHashAlgo(a.String()); err != nil || p != a {
			t.Errorf("ParseHashAlgo(%s) = %v, %v", a, p, err)
		}
	}
	if _, err := ParseHashAlgo("md5"); err == nil {
		t.Error("md5 accepted")
	}
}
