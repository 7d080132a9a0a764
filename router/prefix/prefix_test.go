package prefix

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/warmfleet/warmfleet/router/oai"
)

func TestSipHashVectors(t *testing.T) {
	var kb [16]byte
	for i := range kb {
		kb[i] = byte(i)
	}
	k := Key{binary.LittleEndian.Uint64(kb[:8]), binary.LittleEndian.Uint64(kb[8:])}
	msg := make([]byte, 15)
	for i := range msg {
		msg[i] = byte(i)
	}
	// Reference vectors from the SipHash paper / reference implementation.
	if got := k.Sum(nil); got != 0x726fdb47dd0e0e31 {
		t.Fatalf("empty: %#x", got)
	}
	if got := k.Sum(msg); got != 0xa129ca6149be45e5 {
		t.Fatalf("15 bytes: %#x", got)
	}
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], 0x0123456789abcdef)
	binary.LittleEndian.PutUint64(buf[8:], 0xfedcba9876543210)
	if k.Sum2(0x0123456789abcdef, 0xfedcba9876543210) != k.Sum(buf[:]) {
		t.Fatal("Sum2 differs from Sum of the same 16 bytes")
	}
}

func chat(msgs ...string) *oai.Request {
	r := &oai.Request{HasMessages: true}
	for i := 0; i+1 < len(msgs); i += 2 {
		r.Messages = append(r.Messages, oai.Message{Role: msgs[i], Content: []byte(msgs[i+1])})
	}
	return r
}

func sharedLeading(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestBlocks(t *testing.T) {
	h := Hasher{Key: KeyFromBytes([]byte("fleet secret")), BlockChars: 16}
	doc := strings.Repeat("0123456789abcdef", 4) // 64 bytes
	a, fullA := h.Blocks(nil, "m", chat("system", doc, "user", "question one"), "")
	b, _ := h.Blocks(nil, "m", chat("system", doc, "user", "another question"), "")
	if fullA == 0 || sharedLeading(a, b) < 4 || sharedLeading(a, b) == len(a) {
		t.Fatalf("shared prefix: %d of %d/%d", sharedLeading(a, b), len(a), len(b))
	}
	tests := []struct {
		name string
		req  *oai.Request
		mdl  string
		sess string
		key  Key
	}{
		{"role matters", chat("user", doc, "user", "question one"), "m", "", h.Key},
		{"salt separates tenants", func() *oai.Request { r := chat("system", doc, "user", "question one"); r.CacheSalt = "t2"; return r }(), "m", "", h.Key},
		{"session separates", chat("system", doc, "user", "question one"), "m", "s1", h.Key},
		{"model separates", chat("system", doc, "user", "question one"), "m2", "", h.Key},
		{"fleet key separates", chat("system", doc, "user", "question one"), "m", "", KeyFromBytes([]byte("other"))},
	}
	for _, tc := range tests {
		h2 := h
		h2.Key = tc.key
		got, _ := h2.Blocks(nil, tc.mdl, tc.req, tc.sess)
		if sharedLeading(a, got) != 0 {
			t.Errorf("%s: still shares %d blocks", tc.name, sharedLeading(a, got))
		}
	}
	// Message boundaries are hashed: splitting text differently changes it.
	c, _ := h.Blocks(nil, "m", chat("system", doc[:10], "system", doc[10:]), "")
	d, _ := h.Blocks(nil, "m", chat("system", doc), "")
	if sharedLeading(c, d) == len(d) {
		t.Error("message boundary not hashed")
	}
	// Completions prompt: partial tail gets its own key, and max blocks caps.
	p, full := h.Blocks(nil, "m", &oai.Request{HasPrompt: true, Prompt: []byte(doc + "xyz")}, "")
	if full != 4 || len(p) != 5 {
		t.Fatalf("full %d len %d, want 4 and 5", full, len(p))
	}
	h.MaxBlocks = 2
	if p, _ := h.Blocks(nil, "m", &oai.Request{HasPrompt: true, Prompt: []byte(doc)}, ""); len(p) != 2 {
		t.Fatalf("max blocks: %d", len(p))
	}
}

// TestBlocksSplitAnywhere: a block's hash is that of its bytes, whether
// they come in one piece (hashed in one call) or across message boundaries
// (through the streaming digest).
func TestBlocksSplitAnywhere(t *testing.T) {
	h := Hasher{Key: KeyFromBytes([]byte("k")), BlockChars: 64}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		req := &oai.Request{HasMessages: true}
		var stream []byte
		for range 1 + rng.IntN(5) {
			content := make([]byte, rng.IntN(300))
			for i := range content {
				content[i] = byte('a' + rng.IntN(26))
			}
			req.Messages = append(req.Messages, oai.Message{Role: "user", Content: content})
			stream = append(append(stream, "\x1euser\x1f"...), content...)
		}
		got, full := h.Blocks(nil, "m", req, "")
		prev := h.Key.Sum2(0x5eed, xxhash.Sum64String("m\x00salt:\x00session:"))
		var want []uint64
		for i := 0; i < len(stream); i += 64 {
			prev = h.Key.Sum2(prev, xxhash.Sum64(stream[i:min(i+64, len(stream))]))
			want = append(want, prev)
		}
		if full != len(stream)/64 || len(got) != len(want) || sharedLeading(got, want) != len(want) {
			t.Fatalf("%d-byte stream: %d blocks (%d full), %d agree with the reference's %d", len(stream), len(got), full, sharedLeading(got, want), len(want))
		}
	}
}

// TestMatchAgainstHolders: each slot's depth is the run of leading blocks it
// holds, deepest the longest run and common the shortest over tracked slots,
// on random chains across slots with small capacities (so some are evicted).
func TestMatchAgainstHolders(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		x := NewIndex()
		slots := 1 + rng.IntN(70)
		for s := range slots {
			x.SetSlot(s, 4+rng.IntN(40))
		}
		// Chained like real block hashes (each covers all before it), with
		// few variants per position so that runs share.
		chain := func() []uint64 {
			c := make([]uint64, 1+rng.IntN(12))
			var prev uint64
			for i := range c {
				var link [16]byte
				binary.LittleEndian.PutUint64(link[:], prev)
				binary.LittleEndian.PutUint64(link[8:], uint64(rng.IntN(3)))
				prev = xxhash.Sum64(link[:])
				c[i] = prev
			}
			return c
		}
		for range 20 {
			x.Insert(rng.IntN(slots), chain(), 0)
		}
		q := chain()
		depth := make([]int, MaxSlots)
		deepest, common := x.Match(q, depth)
		wantDeepest, wantCommon := 0, len(q)
		for s := range slots {
			run := 0
			for run < len(q) {
				if h := Set(x.holders.Get(q[run])); !h.Has(s) {
					break
				}
				run++
			}
			if depth[s] != run {
				t.Fatalf("slot %d: depth %d, holds a run of %d", s, depth[s], run)
			}
			wantDeepest, wantCommon = max(wantDeepest, run), min(wantCommon, run)
		}
		if deepest != wantDeepest || common != wantCommon {
			t.Fatalf("deepest %d common %d, want %d and %d", deepest, common, wantDeepest, wantCommon)
		}
	}
}

// TestIndexKeepsHotPrefix: a prefix every other request carries stays held
// however many one-off prompts pass through, though a touch only moves a
// block that has drifted a quarter of the cache from the front, and leaves
// a held prefix alone while its deepest block is recent; the one-offs go
// oldest first. Inserts pass what Match found held, as the router does, or
// nothing.
func TestIndexKeepsHotPrefix(t *testing.T) {
	for _, hint := range []bool{false, true} {
		x := NewIndex()
		x.SetSlot(0, 64)
		depth := make([]int, MaxSlots)
		held := func(c []uint64) int {
			clear(depth)
			x.Match(c, depth)
			return depth[0]
		}
		insert := func(c []uint64) {
			h := 0
			if hint {
				h = held(c)
			}
			x.Insert(0, c, h)
		}
		hot := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
		var last, before []uint64
		for round := range 200 {
			insert(hot)
			before, last = last, nil
			for i := range 8 {
				last = append(last, uint64(1000+round*8+i))
			}
			insert(last)
			if got := held(hot); got != len(hot) {
				t.Fatalf("hint %v, round %d: hot prefix down to %d blocks", hint, round, got)
			}
			if x.Len(0) > 64 || held(last) != len(last) || (before != nil && held(before) != len(before)) {
				t.Fatalf("hint %v, round %d: %d held; the last two one-offs keep %d and %d blocks", hint, round, x.Len(0), held(last), held(before))
			}
		}
		if held([]uint64{1000}) != 0 {
			t.Fatalf("hint %v: the oldest one-off is still held", hint)
		}
	}
}

// TestInsertWrongHint: a held count that overstates what the slot holds
// (Match's gallop can, briefly) or runs past the chain costs the shortcut,
// never a block.
func TestInsertWrongHint(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first []uint64 // inserted before
		chain []uint64
		held  int
	}{
		{name: "past the end", first: []uint64{1, 2}, chain: []uint64{1, 2, 3}, held: 9},
		{name: "deepest not held", first: []uint64{1, 2}, chain: []uint64{1, 2, 3, 4}, held: 3},
		{name: "nothing held", chain: []uint64{5, 6}, held: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex()
			x.SetSlot(0, 64)
			x.Insert(0, tc.first, 0)
			x.Insert(0, tc.chain, tc.held)
			depth := make([]int, MaxSlots)
			x.Match(tc.chain, depth)
			if depth[0] != len(tc.chain) {
				t.Fatalf("holds %d of %d blocks", depth[0], len(tc.chain))
			}
		})
	}
}

func TestIndex(t *testing.T) {
	x := NewIndex()
	x.SetSlot(0, 4)
	x.SetSlot(1, 100)
	depth := make([]int, MaxSlots)
	a := []uint64{1, 2, 3}
	b := []uint64{1, 2, 9, 10}
	x.Insert(0, a, 0)
	x.Insert(1, b, 0)
	deepest, common := x.Match([]uint64{1, 2, 3, 4}, depth)
	if depth[0] != 3 || depth[1] != 2 || deepest != 3 || common != 2 {
		t.Fatalf("depth %v deepest %d common %d", depth[:2], deepest, common)
	}
	// Capacity 4: inserting a 3-block chain evicts the old chain's tail first.
	x.Insert(0, []uint64{1, 7, 8}, 0)
	clear(depth)
	x.Match(a, depth)
	if depth[0] != 2 || x.Len(0) != 4 { // block 3 (the tail) went first
		t.Fatalf("after eviction depth %d len %d", depth[0], x.Len(0))
	}
	clear(depth)
	x.Match([]uint64{1, 7, 8}, depth)
	if depth[0] != 3 {
		t.Fatalf("new chain depth %d", depth[0])
	}
	x.SetSlot(0, 1)
	if x.Len(0) != 1 {
		t.Fatalf("shrunk len %d", x.Len(0))
	}
	x.RemoveSlot(1)
	clear(depth)
	if deepest, _ := x.Match(b, depth); deepest != 1 || depth[1] != 0 {
		t.Fatalf("after removal deepest %d depth %v", deepest, depth[:2])
	}
	x.RemoveSlot(0)
	if n := x.holders.Len(); n != 0 {
		t.Fatalf("holders left: %d", n)
	}
}

// TestIndexHot: a prefix is hot while it is in more than share/n of recent
// requests, and cools as other traffic takes over.
func TestIndexHot(t *testing.T) {
	sys := []uint64{1, 2}                                                       // a system prompt every request carries
	conv := func(i uint64) []uint64 { return []uint64{1, 2, 100 + i, 200 + i} } // then its own history
	tests := []struct {
		name     string
		requests int // distinct conversations inserted, round robin over 8 slots
		n        int
		share    float64
		blocks   []uint64
		want     int
	}{
		{name: "off", requests: 64, n: 8, share: 0, blocks: conv(0), want: 0},
		{name: "too few requests yet", requests: 7, n: 8, share: 1, blocks: conv(0), want: 0},
		{name: "shared prompt is hot, history is not", requests: 64, n: 8, share: 1, blocks: conv(0), want: 2},
		{name: "prompt alone", requests: 64, n: 8, share: 1, blocks: sys, want: 2},
		{name: "nothing known", requests: 64, n: 8, share: 1, blocks: []uint64{9}, want: 0},
		{name: "one backend: every prefix is its share", requests: 64, n: 1, share: 1, blocks: conv(63), want: 2},
		{name: "old history has cooled", requests: 64, n: 4, share: 1, blocks: conv(5), want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex()
			x.SetHeat(16)
			for s := range 8 {
				x.SetSlot(s, 1<<10)
			}
			for i := range tc.requests {
				x.Insert(i%8, conv(uint64(i)), 0)
			}
			if got := x.Hot(tc.blocks, tc.n, tc.share); got != tc.want {
				t.Fatalf("Hot = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestIndexHotSession: one conversation that is most of the recent traffic
// is hot through its history: it cannot stay on one backend either.
func TestIndexHotSession(t *testing.T) {
	x := NewIndex()
	x.SetHeat(16)
	x.SetSlot(0, 1<<10)
	for i := range 32 {
		x.Insert(0, []uint64{1, 2, 300, 301, uint64(400 + i)}, 0)
	}
	if got := x.Hot([]uint64{1, 2, 300, 301, 999}, 8, 1); got != 4 {
		t.Fatalf("Hot = %d, want 4", got)
	}
}

// TestIndexHeatCools: a prompt that stops being sent stops being hot.
func TestIndexHeatCools(t *testing.T) {
	x := NewIndex()
	x.SetHeat(8)
	x.SetSlot(0, 1<<12)
	for range 32 {
		x.Insert(0, []uint64{1, 2}, 0)
	}
	if got := x.Hot([]uint64{1, 2}, 4, 1); got != 2 {
		t.Fatalf("while sent: Hot = %d, want 2", got)
	}
	for i := range 64 {
		x.Insert(0, []uint64{uint64(1000 + i)}, 0)
	}
	if got := x.Hot([]uint64{1, 2}, 4, 1); got != 0 {
		t.Fatalf("after 8 half-lives of other traffic: Hot = %d, want 0", got)
	}
}

// TestIndexHeatOff: without SetHeat nothing is counted, and turning it off
// forgets what was.
func TestIndexHeatOff(t *testing.T) {
	x := NewIndex()
	x.SetSlot(0, 1<<10)
	for range 32 {
		x.Insert(0, []uint64{1, 2}, 0)
	}
	if got := x.Hot([]uint64{1, 2}, 4, 1); got != 0 {
		t.Fatalf("never counted: Hot = %d, want 0", got)
	}
	x.SetHeat(8)
	for range 32 {
		x.Insert(0, []uint64{1, 2}, 0)
	}
	if got := x.Hot([]uint64{1, 2}, 4, 1); got != 2 {
		t.Fatalf("counting: Hot = %d, want 2", got)
	}
	x.SetHeat(0)
	x.SetHeat(8)
	if got := x.Hot([]uint64{1, 2}, 4, 1); got != 0 {
		t.Fatalf("after off and on again: Hot = %d, want 0", got)
	}
}

// BenchmarkMatchShared: 64 backends all hold a 64-block prompt (a system
// prompt every backend has seen), the worst case for the walk.
func BenchmarkMatchShared(b *testing.B) {
	x := NewIndex()
	chain := make([]uint64, 64)
	for i := range chain {
		chain[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	for s := range 64 {
		x.SetSlot(s, 4096)
		x.Insert(s, chain, 0)
	}
	depth := make([]int, MaxSlots)
	for b.Loop() {
		x.Match(chain, depth)
	}
}

// BenchmarkInsertHot: a backend's cache holds 64 prompts of 64 blocks and
// requests repeat them, so each Insert only touches blocks it holds; with
// the held count from Match (as the router passes it) or without.
func BenchmarkInsertHot(b *testing.B) {
	for _, hint := range []bool{false, true} {
		b.Run(map[bool]string{false: "unknown", true: "held"}[hint], func(b *testing.B) {
			x := NewIndex()
			x.SetSlot(0, 4096)
			chains := make([][]uint64, 64)
			for c := range chains {
				for i := range 64 {
					chains[c] = append(chains[c], uint64(c)<<32|uint64(i)*0x9e3779b97f4a7c15)
				}
				x.Insert(0, chains[c], 0)
			}
			held := 0
			if hint {
				held = 64
			}
			i := 0
			for b.Loop() {
				x.Insert(0, chains[i%len(chains)], held)
				i++
			}
		})
	}
}

// BenchmarkMatchOne: 64 backends hold 8 prompts of 64 blocks each, and the
// prompt matched is held by one of them, as a document or a session is.
func BenchmarkMatchOne(b *testing.B) {
	x := NewIndex()
	var chains [][]uint64
	for s := range 64 {
		x.SetSlot(s, 4096)
		for c := range 8 {
			chain := make([]uint64, 64)
			for i := range chain {
				chain[i] = uint64(s*8+c)<<32 | uint64(i)*0x9e3779b97f4a7c15
			}
			x.Insert(s, chain, 0)
			chains = append(chains, chain)
		}
	}
	depth := make([]int, MaxSlots)
	i := 0
	for b.Loop() {
		x.Match(chains[i%len(chains)], depth)
		i++
	}
}
