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

// A peer whose clock is far ahead (a day, the year 9999) must not get its
// records merged: a local edit of such a key would have to stamp a later
// time, so this node's clock would jump there and stamp every later write
// of every key with it, and each node editing those keys would follow.
// The record is refused and counted; this node's clock stays its own.
func TestDesiredRefusesFarFutureRecord(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	d := newDesired(t, testbolt.OpenTemp(t), "a", clk.Now)
	s := modelSpec("m")
	if err := d.Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	mine := d.Records()[0]
	far := modelSpec("m")
	far.Revision = "from-the-future"
	other := modelSpec("other")
	in := []Record{
		{Key: far.Key(), TS: Timestamp{Wall: clk.Now().Add(24 * time.Hour).UnixMilli(), Node: "broken"}, Spec: &far},
		{Key: other.Key(), TS: Timestamp{Wall: maxWall, Node: "broken"}, Spec: &other},
	}
	applied, bad, err := d.Merge(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 || bad != 0 {
		t.Fatalf("merge applied %d records (%d bad), want the far-future ones refused, none invalid", len(applied), bad)
	}
	if got := d.RefusedFuture(); got != 2 {
		t.Fatalf("RefusedFuture = %d, want 2", got)
	}
	if got, _ := d.Get(s.Key()); got.Revision != "" {
		t.Fatalf("the far-future record replaced ours: revision %q", got.Revision)
	}
	// The full state of a push/pull is held to the same bound.
	if _, _, err := d.MergeFull(ctx, FullState{Records: in, Synced: true}); err != nil {
		t.Fatal(err)
	}
	if got := d.RefusedFuture(); got != 4 {
		t.Fatalf("RefusedFuture after a push/pull = %d, want 4", got)
	}
	// Our next write follows our own clock, not the refused stamps.
	s.Revision = "edited"
	if err := d.Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	ts := d.Records()[0].TS
	if ts.Compare(mine.TS) <= 0 || ts.Time().After(clk.Now().Add(time.Minute)) {
		t.Fatalf("local write stamped %v after %v at %v: want later than ours, near our clock", ts.Time(), mine.TS.Time(), clk.Now())
	}
	// Once our clock is within the bound, anti-entropy merges the record.
	clk.Advance(24 * time.Hour)
	if applied, _, err := d.Merge(ctx, in[:1]); err != nil || len(applied) != 1 {
		t.Fatalf("a day later the record merged: %d, %v; want 1", len(applied), err)
	}
}
