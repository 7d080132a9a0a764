package kvevents

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func stored(hs ...uint64) Event  { return Event{Kind: BlockStored, Hashes: hs} }
func removed(hs ...uint64) Event { return Event{Kind: BlockRemoved, Hashes: hs} }
func batch(evs ...Event) Batch   { return Batch{Events: evs} }

func newTestIndex(maxBlocks int) (*Index, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	lim := DefaultLimits()
	lim.MaxBlocks = maxBlocks
	return NewIndex(lim, time.Minute, clk.now), clk
}

func mustMatch(t *testing.T, x *Index, backend string, chain []uint64, want int, wantOK bool) {
	t.Helper()
	if n, ok := x.Match(backend, chain); n != want || ok != wantOK {
		t.Fatalf("Match(%s, %v) = %d, %v; want %d, %v (stats %+v)", backend, chain, n, ok, want, wantOK, x.Stats(backend))
	}
	// MatchAll says the same, whatever else it scores.
	n, ok := make([]int, 3), make([]bool, 3)
	x.MatchAll([]string{"unknown", backend, backend}, chain, n, ok)
	if n[0] != 0 || ok[0] || n[1] != want || ok[1] != wantOK || n[2] != want || ok[2] != wantOK {
		t.Fatalf("MatchAll(unknown, %s, %s, %v) = %v, %v; want %d, %v", backend, backend, chain, n, ok, want, wantOK)
	}
}

func TestIndexMatchesLeadingBlocks(t *testing.T) {
	x, _ := newTestIndex(100)
	mustMatch(t, x, "a", []uint64{1}, 0, false) // unknown backend
	x.Apply("a", 1, batch(stored(1, 2, 3), Event{Kind: BlockStored, Hashes: []uint64{8}, Medium: "CPU"}))
	x.Apply("b", 0, batch(stored(1)))
	mustMatch(t, x, "a", []uint64{1, 2, 3, 4}, 3, true)
	mustMatch(t, x, "a", []uint64{1, 8}, 1, true) // a CPU-tier block is not a GPU hit
	mustMatch(t, x, "b", []uint64{1, 2, 3}, 1, true)
	x.Apply("a", 2, batch(removed(2)))
	mustMatch(t, x, "a", []uint64{1, 2, 3}, 1, true)
	if s := x.Stats("a"); s.Stored != 1 || s.Removed != 1 || s.Ignored != 1 || s.Blocks != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestIndexGapClearsAndWaitsOutResync(t *testing.T) {
	x, clk := newTestIndex(100)
	x.Apply("a", 1, batch(stored(1, 2)))
	x.Apply("a", 5, batch(stored(7))) // batches 2..4 lost: 1 or 2 may be gone
	mustMatch(t, x, "a", []uint64{1}, 0, false)
	if x.Holds("a", 1) || !x.Holds("a", 7) || x.Stats("a").Gaps != 1 {
		t.Fatalf("after gap: stats %+v", x.Stats("a"))
	}
	clk.t = clk.t.Add(time.Minute)
	mustMatch(t, x, "a", []uint64{7}, 1, true)

	// AllBlocksCleared makes the view exact at once.
	x.Apply("a", 9, batch(stored(3)))
	mustMatch(t, x, "a", []uint64{3}, 0, false)
	x.Apply("a", 10, batch(Event{Kind: AllBlocksCleared}, stored(4)))
	mustMatch(t, x, "a", []uint64{4}, 1, true)
	mustMatch(t, x, "a", []uint64{3}, 0, true)
}

func TestIndexRestartClears(t *testing.T) {
	x, _ := newTestIndex(100)
	x.Apply("a", 1, batch(stored(1)))
	x.Apply("a", 2, batch(stored(2)))
	// The engine restarted: its sequence starts over, its cache is empty.
	x.Apply("a", 1, batch(stored(5)))
	mustMatch(t, x, "a", []uint64{1}, 0, true)
	mustMatch(t, x, "a", []uint64{5}, 1, true)
	if s := x.Stats("a"); s.Restarts != 1 {
		t.Fatalf("stats %+v", s)
	}
	// A restart seen late (its first batches missed) is not exact.
	for seq := uint64(2); seq <= 5; seq++ {
		x.Apply("a", seq, batch())
	}
	x.Apply("a", 3, batch(stored(6)))
	mustMatch(t, x, "a", []uint64{6}, 0, false)
	if x.Holds("a", 5) || !x.Holds("a", 6) {
		t.Fatal("late restart kept the old view")
	}
	// vLLM numbers its first batch 0.
	x.Apply("a", 0, batch(stored(7)))
	mustMatch(t, x, "a", []uint64{7}, 1, true)
}

func TestIndexFirstBatchMidStreamIsUntrusted(t *testing.T) {
	x, clk := newTestIndex(100)
	x.Apply("a", 77, batch(stored(1)))
	mustMatch(t, x, "a", []uint64{1}, 0, false)
	clk.t = clk.t.Add(time.Minute)
	mustMatch(t, x, "a", []uint64{1}, 1, true)
	// After a disconnect even a following sequence number starts over.
	x.Disconnected("a")
	mustMatch(t, x, "a", []uint64{1}, 0, false)
	x.Apply("a", 78, batch(stored(2)))
	mustMatch(t, x, "a", []uint64{2}, 0, false)
	if x.Holds("a", 1) || !x.Holds("a", 2) {
		t.Fatal("view kept across a disconnect")
	}
	clk.t = clk.t.Add(time.Minute)
	mustMatch(t, x, "a", []uint64{2}, 1, true)
}

func TestIndexBoundPerBackend(t *testing.T) {
	x, _ := newTestIndex(10)
	for i := range uint64(25) {
		x.Apply("a", i+1, batch(stored(i)))
		if n := x.Stats("a").Blocks; n > 10 {
			t.Fatalf("%d blocks held, bound 10", n)
		}
	}
	s := x.Stats("a")
	if s.Overflows == 0 || s.Trusted {
		t.Fatalf("stats %+v", s)
	}
	x.Forget("a")
	if s := x.Stats("a"); s.Blocks != 0 || s.Batches != 0 {
		t.Fatalf("forgotten: %+v", s)
	}
}

// BenchmarkMatch16Backends is the index's share of a routing decision: a
// 1024-block chain (16k tokens at block size 16) against 16 backends
// holding 64k blocks each, the first holding the whole chain.
func BenchmarkMatch16Backends(b *testing.B) {
	x, _ := newTestIndex(1 << 20)
	chain := make([]uint64, 1024)
	for i := range chain {
		chain[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	backends := make([]string, 16)
	for i := range backends {
		backends[i] = "http://b" + string(rune('a'+i))
		hs := make([]uint64, 1<<16)
		for j := range hs {
			hs[j] = uint64(i+1)<<40 | uint64(j)
		}
		if i == 0 {
			copy(hs, chain)
		}
		x.Apply(backends[i], 1, batch(stored(hs...)))
	}
	b.ResetTimer()
	for b.Loop() {
		for _, be := range backends {
			x.Match(be, chain)
		}
	}
}

// TestIndexMatchAllAgreesWithMatch: the one walk over every view's blocks
// gives each backend exactly what its own view gives, through stores,
// removals, clears, gaps and backends that leave and come back, with more
// backends than one walk covers (those are matched on their own).
func TestIndexMatchAllAgreesWithMatch(t *testing.T) {
	x, clk := newTestIndex(1 << 16)
	rng := rand.New(rand.NewPCG(7, 8))
	names := make([]string, MaxMatched+20)
	seqs := make([]uint64, len(names))
	for i := range names {
		names[i] = fmt.Sprint("b", i)
	}
	chains := make([][]uint64, 8)
	for i := range chains {
		for j := range 12 {
			chains[i] = append(chains[i], uint64(i*100+j+1))
		}
	}
	n, ok := make([]int, len(names)), make([]bool, len(names))
	for round := range 3000 {
		i := rng.IntN(len(names))
		c := chains[rng.IntN(len(chains))]
		seqs[i]++
		switch r := rng.IntN(20); {
		case r < 12:
			x.Apply(names[i], seqs[i], batch(stored(c[:1+rng.IntN(len(c))]...)))
		case r < 16:
			x.Apply(names[i], seqs[i], batch(removed(c[rng.IntN(len(c))])))
		case r < 17:
			x.Apply(names[i], seqs[i], batch(Event{Kind: AllBlocksCleared}))
		case r < 18:
			seqs[i] += 3 // a gap: untrusted until the resync window passes
			x.Apply(names[i], seqs[i], batch(stored(c[0])))
		case r < 19:
			x.Forget(names[i])
			seqs[i] = 0
		default:
			clk.t = clk.t.Add(time.Minute)
		}
		if round%10 != 0 {
			continue
		}
		probe := chains[rng.IntN(len(chains))]
		x.MatchAll(names, probe, n, ok)
		for j, name := range names {
			wn, wok := x.Match(name, probe)
			if n[j] != wn || ok[j] != wok {
				t.Fatalf("round %d, %s: MatchAll %d, %v; Match %d, %v", round, name, n[j], ok[j], wn, wok)
			}
		}
	}
}
