package kvevents

import (
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// The Publisher's messages, in both encodings, decode into the batches it
// was given, and its sequence numbers follow on so the Index trusts them.
func TestPublisherRoundTrip(t *testing.T) {
	for _, mapEvents := range []bool{false, true} {
		x := NewIndex(DefaultLimits(), time.Hour, nil)
		sub := &Subscriber{Backend: "b", Endpoint: "tcp://127.0.0.1:0", Listen: true, Topic: "kv@t@m", Index: x, MinBackoff: 10 * time.Millisecond}
		startSubscriber(t, sub)
		wait.For(t, "subscriber bound", func() bool { return sub.Addr() != "" })
		pub := &Publisher{Endpoint: "tcp://" + sub.Addr(), Topic: "kv@t@m", MapEvents: mapEvents}
		if err := pub.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		// The PUB drops what it sends before the subscriber's connection is
		// up: an AllBlocksCleared, harmless to repeat, until one arrives.
		wait.For(t, "connected", func() bool {
			if err := pub.Publish([]Event{{Kind: AllBlocksCleared}}); err != nil {
				t.Fatal(err)
			}
			return x.Stats("b").Cleared > 0
		})
		if err := pub.Publish([]Event{{Kind: BlockStored, Hashes: []uint64{1, 2, 3}, BlockSize: 16}}); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish([]Event{{Kind: BlockRemoved, Hashes: []uint64{3}}}); err != nil {
			t.Fatal(err)
		}
		wait.For(t, "stored and removed", func() bool { return x.Holds("b", 2) && !x.Holds("b", 3) })
		if n, ok := x.Match("b", []uint64{1, 2, 3}); !ok || n != 2 {
			t.Fatalf("map=%v: Match = %d, %v; want 2, trusted (%+v)", mapEvents, n, ok, x.Stats("b"))
		}
		if s := x.Stats("b"); s.Gaps != 0 || s.Peak != 3 {
			t.Fatalf("map=%v: stats %+v, want no gap and a peak of 3", mapEvents, s)
		}
	}
}
