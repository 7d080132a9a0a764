package desired

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testbolt"
	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
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
			clk := testclock.New()
			d := newDesired(t, testbolt.OpenTemp(t), "a", clk.Now)
			s := modelSpec("m")
			hostile := Record{Key: s.Key(), TS: tc.ts(clk.Now()), Spec: &s}
			if _, _, err := d.Merge(ctx, []Record{hostile}); err != nil {
				t.Fatal(err)
			}
			if _, live := d.Get(s.Key()); live {
				if err := d.Delete(ctx, s.Key()); err != nil {
					t.Fatal(err)
				}
			}
			// Anti-entropy delivers the peer's copy again.
			if _, _, err := d.Merge(ctx, []Record{hostile}); err != nil {
				t.Fatal(err)
			}
			if _, live := d.Get(s.Key()); live {
				t.Fatalf("record stamped %+v came back after a local delete", hostile.TS)
			}
		})
	}
}
