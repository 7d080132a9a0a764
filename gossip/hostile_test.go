package gossip

import (
	"bytes"
	"errors"
	"runtime"
	"strconv"
	"testing"
)

// A stream message may inflate to maxStreamPayload. Lists past their limit
// must be refused while decoding: checked afterwards, a payload of "{},"
// repeated to that size decodes into millions of records, over a gigabyte
// of allocations from one message that compresses to a few KiB on the wire.
// Decoding four times the limit must cost about what the limit costs.
func TestDecodeHugeCountsAllocatesLittle(t *testing.T) {
	build := repeated
	allocated := func(decode func([]byte) error, p []byte) (uint64, error) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := decode(p)
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, err
	}
	for _, tc := range []struct {
		name   string
		pre    string
		elem   func(i int) string
		post   string
		decode func([]byte) error
	}{
		{"state records", `{"f":"a","r":[`, func(int) string { return `{"s":{}}` }, `]}`, func(p []byte) error { _, err := decodeState(p); return err }},
		{"state digest", `{"f":"a","d":{`, func(i int) string { return `"` + strconv.Itoa(i) + `":1` }, `}}`, func(p []byte) error { _, err := decodeState(p); return err }},
		{"inventories", `{"r":[`, func(int) string { return `{}` }, `]}`, func(p []byte) error { _, err := decodeInventories(p); return err }},
		{"want", `{"f":"a","n":[`, func(int) string { return `""` }, `]}`, func(p []byte) error { _, err := decodeWant(p); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit, _ := allocated(tc.decode, build(tc.pre, tc.elem, tc.post, maxListLen))
			got, err := allocated(tc.decode, build(tc.pre, tc.elem, tc.post, 4*maxListLen))
			if !errors.Is(err, errOversize) {
				t.Fatalf("err = %v, want errOversize", err)
			}
			if got > 2*limit {
				t.Fatalf("decoding %d elements allocated %d bytes; %d elements take %d", 4*maxListLen, got, maxListLen, limit)
			}
		})
	}
}

// One inventory may hold maxInventoryItems entries, which Validate checks
// only after decoding: a record whose maps fill a whole stream message
// (some 200 MB as Go maps) must be refused while its maps are decoded.
// Decoding four times the limit then costs the limit's entries plus
// buffers of the input (about twice the limit's cost, measured), where
// decoding them all costs four times.
func TestDecodeHugeInventoryAllocatesLittle(t *testing.T) {
	build := repeated
	decodeInv := func(p []byte) error { _, err := decodeInventories(p); return err }
	decodeSt := func(p []byte) error { _, err := decodeState(p); return err }
	model := func(i int) string { return `"m` + strconv.Itoa(i) + `":{"s":"ready","r":"rev","p":"/x"}` }
	for _, tc := range []struct {
		name      string
		pre, post string
		elem      func(i int) string
		decode    func([]byte) error
	}{
		{"inventory models", `{"r":[{"n":"b","v":1,"i":{"m":{`, `}}}]}`, model, decodeInv},
		{"inventory labels", `{"r":[{"n":"b","v":1,"i":{"l":{`, `}}}]}`, func(i int) string { return `"k` + strconv.Itoa(i) + `":"v"` }, decodeInv},
		{"inventory endpoints", `{"r":[{"n":"b","v":1,"i":{"e":[`, `]}}]}`, func(i int) string { return `{"m":"x","u":"http://h:1"}` }, decodeInv},
		{"state's own inventory", `{"f":"a","i":{"n":"a","v":1,"i":{"m":{`, `}}}}`, model, decodeSt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			measure := func(n int) (uint64, error) {
				runtime.GC()
				runtime.ReadMemStats(&before)
				err := tc.decode(build(tc.pre, tc.elem, tc.post, n))
				runtime.ReadMemStats(&after)
				return after.TotalAlloc - before.TotalAlloc, err
			}
			limit, err := measure(maxInventoryItems)
			if errors.Is(err, errOversize) {
				t.Fatalf("%d entries, the limit, refused: %v", maxInventoryItems, err)
			}
			got, err := measure(4 * maxInventoryItems)
			if !errors.Is(err, errOversize) {
				t.Fatalf("err = %v, want errOversize", err)
			}
			if got > 3*limit {
				t.Fatalf("decoding %d entries allocated %d bytes; %d entries take %d", 4*maxInventoryItems, got, maxInventoryItems, limit)
			}
		})
	}
}

// repeated is pre, then elem(0..n-1) separated by commas, then post.
func repeated(pre string, elem func(i int) string, post string, n int) []byte {
	var b bytes.Buffer
	b.WriteString(pre)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem(i))
	}
	b.WriteString(post)
	return b.Bytes()
}
