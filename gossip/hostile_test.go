package gossip

import (
	"bytes"
	"context"
	"errors"
	"math"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// A record stamped with the largest clock values a peer can put on the wire
// must not outlive a local delete: once anti-entropy brings it back, the
// delete has to win again, or the key can never be removed fleet-wide.
func TestDesiredDeleteBeatsExtremeTimestamps(t *testing.T) {
	for _, tc := range []struct {
		name string
		ts   func(now time.Time) Timestamp
	}{
		{"logical counter full", func(now time.Time) Timestamp {
			return Timestamp{Wall: now.Add(24 * time.Hour).UnixMilli(), Logical: math.MaxUint32, Node: "broken"}
		}},
		{"largest wall", func(time.Time) Timestamp { return Timestamp{Wall: math.MaxInt64, Node: "broken"} }},
		{"largest wall and counter", func(time.Time) Timestamp {
			return Timestamp{Wall: math.MaxInt64, Logical: math.MaxUint32, Node: "~~~~"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := newTestClock()
			d := newDesired(t, openDB(t), "a", clk.Now)
			s := modelSpec("m")
			hostile := Record{Key: s.Key(), TS: tc.ts(clk.Now()), Spec: &s}
			if _, _, err := d.merge(ctx, []Record{hostile}); err != nil {
				t.Fatal(err)
			}
			if _, live := d.Get(s.Key()); live {
				if err := d.Delete(ctx, s.Key()); err != nil {
					t.Fatal(err)
				}
			}
			// Anti-entropy delivers the peer's copy again.
			if _, _, err := d.merge(ctx, []Record{hostile}); err != nil {
				t.Fatal(err)
			}
			if _, live := d.Get(s.Key()); live {
				t.Fatalf("record stamped %+v came back after a local delete", hostile.TS)
			}
		})
	}
}

// A stream message may inflate to maxStreamPayload. Lists past their limit
// must be refused while decoding: checked afterwards, a payload of "{},"
// repeated to that size decodes into millions of records, over a gigabyte
// of allocations from one message that compresses to a few KiB on the wire.
// Decoding four times the limit must cost about what the limit costs.
func TestDecodeHugeCountsAllocatesLittle(t *testing.T) {
	build := func(pre string, elem func(i int) string, post string, n int) []byte {
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
