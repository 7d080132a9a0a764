package kvevents

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The exact values are checked against the simulator itself
// (TestInferenceSimEvents); here, the chain's shape.
func TestLLMDChainShape(t *testing.T) {
	p := tokens(0, 40)
	a := LLMDChain("1", "m", p, 16)
	if len(a) != 2 {
		t.Fatalf("%d hashes for 2 full blocks", len(a))
	}
	q := append(slices.Clone(p[:16]), tokens(100, 16)...)
	if b := LLMDChain("1", "m", q, 16); b[0] != a[0] || b[1] == a[1] {
		t.Fatalf("shared first block: %x vs %x", a, b)
	}
	for _, c := range [][]uint64{LLMDChain("2", "m", p, 16), LLMDChain("1", "n", p, 16), LLMDChain("1", "", p, 16)} {
		if c[0] == a[0] {
			t.Fatal("seed or model does not change the chain")
		}
	}
	if LLMDChain("1", "m", p, 0) != nil || len(LLMDChain("1", "m", p[:15], 16)) != 0 {
		t.Fatal("no full block must give no hash")
	}
}

// TestLLMDChainMatchesCBOR: the chain hashed as it is encoded equals FNV
// over the CBOR built in full (llmdChainCBOR, the encoder as first
// written), for token ids, seeds and model names of every head length.
func TestLLMDChainMatchesCBOR(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var p []uint32
	for _, bound := range []uint32{24, 256, 1 << 16, 1 << 24, math.MaxUint32} {
		for range 40 {
			p = append(p, rng.Uint32N(bound))
		}
	}
	p = append(p, 0, 23, 24, 255, 256, 65535, 65536, math.MaxUint32)
	rng.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	long := strings.Repeat("m", 300)
	for _, seed := range []string{"", "1", "seed-with-more-than-24-bytes-in-it"} {
		for _, model := range []string{"", "m", "Qwen/Qwen3-32B-with-a-long-name", long} {
			for _, bs := range []int{1, 3, 16, 24, 300} {
				want := llmdChainCBOR(seed, model, p, bs)
				got := LLMDChain(seed, model, p, bs)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %q model of %d bytes, block %d: %x, want %x", seed, len(model), bs, got, want)
				}
				if got := AppendLLMDChain([]uint64{7}, seed, model, p, bs, 2); !slices.Equal(got, append([]uint64{7}, want[:min(2, len(want))]...)) {
					t.Fatalf("seed %q model of %d bytes, block %d, two blocks: %x, want %x", seed, len(model), bs, got, want[:2])
				}
			}
		}
	}
}

// FuzzLLMDChain: on the fuzzer's token ids (four bytes each, their size
// picked by a fifth so that every CBOR head length comes up), seed, model
// and block size, the chain hashed as it is encoded, alone and through a
// ChainCache, equals FNV over the CBOR built in full.
func FuzzLLMDChain(f *testing.F) {
	f.Add([]byte("\x00\x17\x00\x00\x00\x01\x18\x00\x00\x00\x02\xff\xff\x00\x00\x03\x00\x00\x01\x00\x04\xff\xff\xff\xff"), "1", "m", uint8(2))
	f.Add([]byte(strings.Repeat("\x04\x10\x27\x02\x00", 100)), "", "Qwen/Qwen3-32B", uint8(16))
	f.Fuzz(func(t *testing.T, raw []byte, seed, model string, bs uint8) {
		var p []uint32
		for ; len(raw) >= 5; raw = raw[5:] {
			v := binary.LittleEndian.Uint32(raw[1:])
			p = append(p, v>>(8*(raw[0]%4))) // 4, 3, 2 or 1 bytes of it
		}
		blockSize := 1 + int(bs)%40
		want := llmdChainCBOR(seed, model, p, blockSize)
		if got := LLMDChain(seed, model, p, blockSize); !slices.Equal(got, want) {
			t.Fatalf("ids %v, block %d: %x, want %x", p, blockSize, got, want)
		}
		c := &ChainCache{maxTokens: 256}
		for range 2 { // stored, then found
			if got := c.AppendLLMDChain(nil, seed, model, p, blockSize, 0); !slices.Equal(got, want) {
				t.Fatalf("ids %v, block %d, through the cache: %x, want %x", p, blockSize, got, want)
			}
		}
	})
}

// BenchmarkLLMDChain: a 4,000-token prompt's engine block hashes.
func BenchmarkLLMDChain(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]uint32, 4000)
	for i := range p {
		p[i] = rng.Uint32N(150000)
	}
	dst := make([]uint64, 0, 512)
	b.SetBytes(int64(4 * len(p)))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendLLMDChain(dst[:0], "s", "m", p, 16, 0)
	}
}

// llmdChainCBOR is the chain as first written: each item's canonical CBOR
// built in a buffer, then hashed.
func llmdChainCBOR(seed, model string, tokens []uint32, blockSize int) []uint64 {
	h := fnv.New64a()
	h.Write([]byte(seed))
	var e cborBuf
	e.head(4, 3)
	e.head(0, h.Sum64())
	e.b = append(e.b, cborNull)
	e.head(3, uint64(len(model)))
	e.b = append(e.b, model...)
	parent := e.fnv()
	var chain []uint64
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		e.b = e.b[:0]
		e.head(4, 3)
		e.head(0, parent)
		e.head(4, uint64(blockSize))
		for _, t := range tokens[i : i+blockSize] {
			e.head(0, uint64(t))
		}
		e.b = append(e.b, cborNull)
		parent = e.fnv()
		chain = append(chain, parent)
	}
	return chain
}

type cborBuf struct{ b []byte }

func (e *cborBuf) head(major byte, v uint64) {
	switch {
	case v < 24:
		e.b = append(e.b, major<<5|byte(v))
	case v <= 0xff:
		e.b = append(e.b, major<<5|24, byte(v))
	case v <= 0xffff:
		e.b = binary.BigEndian.AppendUint16(append(e.b, major<<5|25), uint16(v))
	case v <= 0xffffffff:
		e.b = binary.BigEndian.AppendUint32(append(e.b, major<<5|26), uint32(v))
	default:
		e.b = binary.BigEndian.AppendUint64(append(e.b, major<<5|27), v)
	}
}

func (e *cborBuf) fnv() uint64 {
	h := fnv.New64a()
	h.Write(e.b)
	return h.Sum64()
}

// TestChainCacheExact: through the cache, prompts that share documents,
// differ in one token, change seed, model or block size, and overwrite
// each other's slots in a small table get exactly AppendLLMDChain's
// hashes, however often they come back.
func TestChainCacheExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	docs := make([][]uint32, 6)
	for i := range docs {
		docs[i] = make([]uint32, 100+rng.IntN(1200))
		for j := range docs[i] {
			docs[i][j] = rng.Uint32N(200000)
		}
	}
	for _, maxTokens := range []int{0, 1024} { // 1024: a few slots, constantly overwritten
		c := &ChainCache{maxTokens: maxTokens}
		for round := range 400 {
			p := slices.Clone(docs[rng.IntN(len(docs))])
			if round%3 == 0 { // a different token deep in a known document
				p[rng.IntN(len(p))]++
			}
			for range rng.IntN(40) {
				p = append(p, rng.Uint32N(200000))
			}
			seed, model, bs, maxBlocks := "1", "m", 16, 0
			switch round % 7 {
			case 1:
				seed = "2"
			case 2:
				model = "n"
			case 3:
				bs = 5
			case 4:
				maxBlocks = 3
			}
			want := AppendLLMDChain([]uint64{9}, seed, model, p, bs, maxBlocks)
			if got := c.AppendLLMDChain([]uint64{9}, seed, model, p, bs, maxBlocks); !slices.Equal(got, want) {
				t.Fatalf("round %d (table of %d tokens): %x, want %x", round, maxTokens, got, want)
			}
		}
	}
	if got := new(ChainCache).AppendLLMDChain(nil, "1", "m", tokens(0, 40), 0, 0); got != nil {
		t.Fatalf("block size 0: %x", got)
	}
}

// BenchmarkChainCache: 4,000-token prompts, a shared 3,000-token document
// and a tail of their own each, hashed in full and through a ChainCache
// (the 64 prompts come round again, as a chat's history does).
func BenchmarkChainCache(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	doc := make([]uint32, 3000)
	for i := range doc {
		doc[i] = rng.Uint32N(150000)
	}
	prompts := make([][]uint32, 64)
	for i := range prompts {
		prompts[i] = slices.Clone(doc)
		for range 1000 {
			prompts[i] = append(prompts[i], rng.Uint32N(150000))
		}
	}
	dst := make([]uint64, 0, 300)
	b.Run("cache=false", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			dst = AppendLLMDChain(dst[:0], "1", "m", prompts[i%len(prompts)], 16, 0)
		}
	})
	b.Run("cache=true", func(b *testing.B) {
		c := new(ChainCache)
		for i := 0; b.Loop(); i++ {
			dst = c.AppendLLMDChain(dst[:0], "1", "m", prompts[i%len(prompts)], 16, 0)
		}
	})
}
