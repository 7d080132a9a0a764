package gossip

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func TestPickDigest(t *testing.T) {
	now := testclock.New().Now()
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	const delay, window = 200 * time.Millisecond, 2 * time.Second
	for _, tc := range []struct {
		name   string
		recent map[string]recentChange
		limit  int
		want   map[string]uint64
		keep   []string // left in recent after pruning
	}{
		{name: "nothing", recent: map[string]recentChange{}, limit: 10},
		{name: "too fresh: the rumor is still spreading",
			recent: map[string]recentChange{"a": {5, at(100 * time.Millisecond)}}, limit: 10, keep: []string{"a"}},
		{name: "eligible",
			recent: map[string]recentChange{"a": {5, at(delay)}, "b": {7, at(time.Second)}}, limit: 10,
			want: map[string]uint64{"a": 5, "b": 7}, keep: []string{"a", "b"}},
		{name: "expired entries are pruned",
			recent: map[string]recentChange{"a": {5, at(window + time.Millisecond)}, "b": {7, at(time.Second)}}, limit: 10,
			want: map[string]uint64{"b": 7}, keep: []string{"b"}},
		{name: "limit keeps the newest",
			recent: map[string]recentChange{"a": {5, at(1500 * time.Millisecond)}, "b": {7, at(time.Second)}, "c": {1, at(300 * time.Millisecond)}}, limit: 2,
			want: map[string]uint64{"b": 7, "c": 1}, keep: []string{"a", "b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pickDigest(tc.recent, now, delay, window, tc.limit)
			if !maps.Equal(got, tc.want) {
				t.Errorf("digest %v, want %v", got, tc.want)
			}
			if kept := slices.Sorted(maps.Keys(tc.recent)); !slices.Equal(kept, tc.keep) {
				t.Errorf("kept %v, want %v", kept, tc.keep)
			}
		})
	}
}

func TestTrimOldest(t *testing.T) {
	got := trimOldest(map[string]uint64{"a": 1, "b": 9, "c": 5, "d": 9}, 3)
	if want := map[string]uint64{"b": 9, "d": 9, "c": 5}; !maps.Equal(got, want) {
		t.Fatalf("trimOldest = %v, want %v", got, want)
	}
}

// TestMissedRumorCaughtUpByDigest makes one member miss an inventory rumor
// entirely, then checks that it gets the record from a digest, with
// push/pull anti-entropy out of the picture.
func TestMissedRumorCaughtUpByDigest(t *testing.T) {
	names := []string{"n0", "n1", "n2", "n3", "n4"}
	c := newMockCluster(t, names...)
	c.tun.PushPullInterval = 24 * time.Hour // only joins push/pull
	c.tun.DigestInterval = 50 * time.Millisecond
	c.tun.DigestWindow = time.Minute
	regs := map[string]*promRegistry{}
	nodes := startCluster(t, c, names, func(name string, cfg *Config) {
		regs[name] = newRegistry()
		cfg.Registerer = regs[name]
		// Each joins every member before it: with push/pull only at joins,
		// a member that joined the first alone learned of later ones only
		// from their alive rumors, which could miss it (1 start in ~20).
		cfg.Join = nil
		for _, before := range names[:slices.Index(names, name)] {
			cfg.Join = append(cfg.Join, c.addr(before))
		}
	})
	origin, lagger := nodes[1], nodes[4]
	states := func() float64 { return testutil.ToFloat64(lagger.met.received.WithLabelValues(msgState.String())) }
	has := func(n *Node, done int64) bool {
		m, _ := member(n, origin.LocalName())
		return m.Inventory != nil && m.Inventory.Models["m"].BytesDone == done
	}
	// An attempt proves the digest path only when the lagger really missed
	// every copy, no push/pull ran (a member declared dead on a loaded
	// machine rejoins with one), and a digest pull repaired it. A copy of
	// the rumor still in flight when the lagger stops dropping them, or a
	// rejoin, repairs it another way: then a new change is tried, a few
	// times at most.
	const attempts = 5
	for attempt := int64(1); ; attempt++ {
		if attempt > attempts {
			t.Fatalf("%d attempts and none showed the digest path repairing a missed rumor", attempts)
		}
		// While the rumor spreads, the lagger holds the origin as suspect and
		// so drops every copy: the same as losing them all on the network.
		lagger.mu.Lock()
		lagger.peers[origin.LocalName()].state = MemberSuspect
		lagger.mu.Unlock()
		statesBefore := states()
		inv := Inventory{Models: map[string]ModelInventory{"m": {State: StateReady, BytesDone: attempt, BytesTotal: 10}}}
		if err := origin.SetLocalInventory(inv); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes[:4] {
			wait.For(t, n.LocalName()+" has the change and stopped retransmitting", func() bool {
				return n == origin || has(n, attempt) && n.queue.NumQueued() == 0
			})
		}
		wait.For(t, "origin stopped retransmitting", func() bool { return origin.queue.NumQueued() == 0 })
		pullsBefore := testutil.ToFloat64(lagger.met.digestPulls)
		lagger.mu.Lock()
		rec := lagger.peers[origin.LocalName()].rec
		missed := rec == nil || rec.Inv.Models["m"].BytesDone != attempt
		lagger.peers[origin.LocalName()].state = MemberAlive
		lagger.mu.Unlock()
		wait.For(t, "lagger caught up", func() bool { return has(lagger, attempt) })
		switch {
		case !missed:
			t.Logf("attempt %d: the lagger got the rumor (memberlist changed the origin's state back)", attempt)
		case states() != statesBefore:
			t.Logf("attempt %d: a push/pull ran (%v states, %v before)", attempt, states(), statesBefore)
		case testutil.ToFloat64(lagger.met.digestPulls) == pullsBefore:
			t.Logf("attempt %d: a late rumor copy repaired the lagger", attempt)
		default:
			return
		}
	}
}
