package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func mustPack(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// arrayBatch builds a batch as vLLM's msgspec array_like encoding does.
func arrayBatch(tb testing.TB, events ...any) []byte {
	return mustPack(tb, []any{1.5, events, 0})
}

func storedArr(hashes []uint64, parent any) []any {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return []any{"BlockStored", hs, parent, []int{1, 2, 3, 4}, 4, nil, "GPU"}
}

func removedArr(hashes ...uint64) []any {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return []any{"BlockRemoved", hs, "GPU"}
}

func TestDecodeArrayEncoding(t *testing.T) {
	// A later vLLM's extra trailing fields (lora_name, extra_keys,
	// group_idx) must be skipped, not refused.
	stored := append(storedArr([]uint64{1 << 63, 7}, nil), "lora-x", []any{[]any{"mm", 1}}, 0)
	payload := arrayBatch(t, stored, removedArr(7), []any{"AllBlocksCleared"}, []any{"FutureEvent", 1, 2})
	b, err := DecodeBatch(payload, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 1.5 || len(b.Events) != 3 || b.Skipped != 1 {
		t.Fatalf("batch %+v", b)
	}
	st := b.Events[0]
	if st.Kind != BlockStored || !slices.Equal(st.Hashes, []uint64{1 << 63, 7}) || st.HasParent || st.BlockSize != 4 || st.Medium != "GPU" {
		t.Fatalf("stored %+v", st)
	}
	if rm := b.Events[1]; rm.Kind != BlockRemoved || !slices.Equal(rm.Hashes, []uint64{7}) {
		t.Fatalf("removed %+v", rm)
	}
	if b.Events[2].Kind != AllBlocksCleared {
		t.Fatalf("cleared %+v", b.Events[2])
	}
}

func TestDecodeMapEncodingAndByteHashes(t *testing.T) {
	full := bytes.Repeat([]byte{0xee}, 24)
	binary.BigEndian.PutUint64(full[16:], 0x1122334455667788)
	// Keys in any order, the tag last, and a negative int hash (vLLM's
	// builtin-hash era) kept as its two's complement.
	stored := map[string]any{
		"block_hashes":      []any{full, int64(-2)},
		"parent_block_hash": uint64(99),
		"token_ids":         []int{5, 6},
		"block_size":        2,
		"medium":            nil,
		"group_idx":         1,
		"type":              "BlockStored",
	}
	removed := map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte{0x01, 0x02}}}
	payload := mustPack(t, []any{2.0, []any{stored, removed, map[string]any{"type": "AllBlocksCleared"}}})
	b, err := DecodeBatch(payload, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	neg := int64(-2)
	if len(b.Events) != 3 {
		t.Fatalf("batch %+v", b)
	}
	if st := b.Events[0]; !slices.Equal(st.Hashes, []uint64{0x1122334455667788, uint64(neg)}) || !st.HasParent || st.Parent != 99 || st.Medium != "" {
		t.Fatalf("stored %+v", st)
	}
	if rm := b.Events[1]; !slices.Equal(rm.Hashes, []uint64{0x0102}) {
		t.Fatalf("removed %+v", rm)
	}
	// The batch itself as a map.
	if b, err := DecodeBatch(mustPack(t, map[string]any{"ts": 1.0, "events": []any{removed}}), DefaultLimits()); err != nil || len(b.Events) != 1 {
		t.Fatalf("map batch: %+v %v", b, err)
	}
}

func TestDecodeRefusesGarbage(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxHashes = 4
	valid := arrayBatch(t, storedArr([]uint64{1, 2, 3}, uint64(9)), removedArr(1))
	cases := map[string][]byte{
		"empty":             {},
		"not msgpack":       []byte("hello, world"),
		"scalar":            mustPack(t, 5),
		"trailing bytes":    append(slices.Clone(valid), 0xc0),
		"too many hashes":   arrayBatch(t, storedArr([]uint64{1, 2, 3, 4, 5}, nil)),
		"string hash":       arrayBatch(t, []any{"BlockRemoved", []any{"abc"}}),
		"no tag":            arrayBatch(t, []any{}),
		"short stored":      arrayBatch(t, []any{"BlockStored", []any{1}}),
		"map without type":  arrayBatch(t, map[string]any{"block_hashes": []any{1}}),
		"removed no hashes": arrayBatch(t, map[string]any{"type": "BlockRemoved"}),
		"nil events":        mustPack(t, []any{1.0, nil}),
		// array32 claiming 2^31 events in a few bytes: refused before any
		// allocation.
		"forged length": append(mustPack(t, 1.0)[:0], 0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x80, 0, 0, 0),
		"deep nesting":  arrayBatch(t, []any{"FutureEvent", nest(40)}),
		"oversized":     make([]byte, lim.MaxFrame+1),
	}
	for name, p := range cases {
		if _, err := DecodeBatch(p, lim); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
	// Every strict prefix of a valid payload is truncated, never a panic.
	for i := range valid {
		if _, err := DecodeBatch(valid[:i], lim); err == nil {
			t.Errorf("prefix of %d bytes decoded", i)
		}
	}
	if _, err := DecodeBatch(valid, lim); err != nil {
		t.Fatalf("valid: %v", err)
	}
}

func nest(n int) any {
	var v any = 1
	for range n {
		v = []any{v}
	}
	return v
}

func TestParseMessageFraming(t *testing.T) {
	lim := DefaultLimits()
	payload := arrayBatch(t, removedArr(1))
	seq := binary.BigEndian.AppendUint64(nil, 42)
	if s, _, err := ParseMessage([][]byte{[]byte("kv@pod@m"), seq, payload}, lim); err != nil || s != 42 {
		t.Fatalf("seq %d err %v", s, err)
	}
	for name, frames := range map[string][][]byte{
		"two frames":  {seq, payload},
		"short seq":   {nil, seq[:7], payload},
		"huge topic":  {make([]byte, lim.MaxTopicBytes+1), seq, payload},
		"bad payload": {nil, seq, []byte{0xc1}},
	} {
		if _, _, err := ParseMessage(frames, lim); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(arrayBatch(f, storedArr([]uint64{1, 2}, nil), removedArr(2), []any{"AllBlocksCleared"}))
	f.Add(mustPack(f, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte{1}}, "token_ids": []int{1}, "block_size": 1}}}))
	f.Add(mustPack(f, map[string]any{"ts": 1.0, "events": []any{[]any{"X", nest(5)}}}))
	lim := DefaultLimits()
	lim.MaxEvents, lim.MaxHashes, lim.MaxTokens = 64, 64, 64
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p, lim)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not wrapped: %v", err)
			}
			return
		}
		if len(b.Events)+b.Skipped > lim.MaxEvents {
			t.Fatalf("%d events", len(b.Events))
		}
		for _, ev := range b.Events {
			if len(ev.Hashes) > lim.MaxHashes {
				t.Fatalf("%d hashes", len(ev.Hashes))
			}
		}
	})
}
