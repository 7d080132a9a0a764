package prefix

import (
	"encoding/binary"
	"strings"
	"testing"

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

func TestIndex(t *testing.T) {
	x := NewIndex()
	x.SetSlot(0, 4)
	x.SetSlot(1, 100)
	depth := make([]int, MaxSlots)
	a := []uint64{1, 2, 3}
	b := []uint64{1, 2, 9, 10}
	x.Insert(0, a)
	x.Insert(1, b)
	deepest, common := x.Match([]uint64{1, 2, 3, 4}, depth)
	if depth[0] != 3 || depth[1] != 2 || deepest != 3 || common != 2 {
		t.Fatalf("depth %v deepest %d common %d", depth[:2], deepest, common)
	}
	// Capacity 4: inserting a 3-block chain evicts the old chain's tail first.
	x.Insert(0, []uint64{1, 7, 8})
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
	if len(x.holders) != 0 {
		t.Fatalf("holders left: %d", len(x.holders))
	}
}
