package balance

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func cands(n int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = Candidate{ID: uint64(1000 + i), Weight: 1}
	}
	return out
}

func keys(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = mix(base*7919 + uint64(i))
	}
	return out
}

// saturatedSlots has every engine's 4 slots taken and prefill queued on
// each, and backend 3, holding 10 of the prompt's blocks, with 3 more
// requests waiting for its slots: its slot wait is held, the others' each.
func saturatedSlots(held, each int) func(c []Candidate) {
	return func(c []Candidate) {
		for i := range c {
			c[i].Slots, c[i].Inflight, c[i].Prefilling, c[i].Pending, c[i].SlotWait = 4, 4, 2, 4, each
		}
		c[3].Matched, c[3].Inflight, c[3].Prefilling, c[3].SlotWait = 10, 7, 3, held
	}
}

func TestBounds(t *testing.T) {
	c := cands(8)
	for i := range c {
		c[i].Inflight = 2
	}
	got := Bounds(c, 1.25, 1, nil)
	// ceil(1.25 * 17 / 8) = 3
	for i, b := range got {
		if b != 3 {
			t.Fatalf("bound[%d] = %d, want 3", i, b)
		}
	}
	c[0].Weight = 0.25 // ramping up: a quarter share
	got = Bounds(c, 1.25, 1, nil)
	if want := int(math.Ceil(1.25 * 17 * 0.25 / 7.25)); got[0] != want || got[1] <= got[0] {
		t.Fatalf("ramping bound %d (settled %d), want %d", got[0], got[1], want)
	}
}

func TestDecidePrefix(t *testing.T) {
	k := keys(1, 20)
	tests := []struct {
		name     string
		setup    func(c []Candidate)
		common   int
		retry    bool
		want     int // -1: compare with the cold rendezvous winner
		reason   Reason
		full     bool
		notPick  int // a backend that must not be picked, -1 none
		prefered int // expected preferred, -2 skip
		minBound int
		yielded  Bound   // the rule the preferred failed, for overflows
		balance  float64 // BalanceSlack
	}{
		{name: "longest prefix wins", setup: func(c []Candidate) { c[3].Matched = 10; c[5].Matched = 4 }, want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "preferred at bound overflows to next best by score", setup: func(c []Candidate) {
			c[3].Matched, c[3].Inflight = 10, 3 // bound ceil(1.25*4/8)=1
			c[5].Matched = 4
		}, want: 5, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundLoad},
		{name: "preferred at own limit overflows", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 4
			}
			c[3].Matched, c[3].Limit = 10, 4
			c[6].Matched = 2
		}, want: 6, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundLimit},
		{name: "ties on match go to warm node", setup: func(c []Candidate) {
			c[2].Matched, c[6].Matched, c[6].Warm = 5, 5, true
		}, want: 6, reason: Hit, notPick: -1, prefered: 6},
		{name: "common prefix alone is cold", setup: func(c []Candidate) {
			for i := range c {
				c[i].Matched = 8
			}
		}, common: 8, want: -1, reason: Cold, notPick: -1, prefered: -2},
		{name: "cold", setup: func(c []Candidate) {}, want: -1, reason: Cold, notPick: -1, prefered: -2},
		{name: "all at limit is full", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight, c[i].Limit = 2, 2
			}
		}, want: -1, full: true, notPick: -1, prefered: -2},
		{name: "over bound but under limit beats refusing", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight, c[i].Limit = 2, 2
			}
			c[7].Inflight, c[7].Limit = 30, 0
		}, want: 7, reason: Overflow, notPick: -1, prefered: -2, yielded: BoundLimit},
		{name: "a holder with every slot busy yields to a free slot", setup: func(c []Candidate) {
			for i := range c {
				c[i].Slots, c[i].Inflight = 4, 2
			}
			c[3].Matched, c[3].Inflight = 10, 4 // under its load bound (min bound 5)
			c[5].Matched = 4
		}, minBound: 5, want: 5, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundSlots},
		{name: "slots busy everywhere: the holder keeps it", setup: func(c []Candidate) {
			for i := range c {
				c[i].Slots, c[i].Inflight = 4, 4
			}
			c[3].Matched = 10
		}, minBound: 5, want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "one free slot in the fleet: the holder yields to it", setup: func(c []Candidate) {
			for i := range c {
				c[i].Slots, c[i].Inflight = 4, 4
			}
			c[3].Matched = 10
			c[5].Inflight = 3
		}, minBound: 5, want: 5, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundSlots},
		{name: "the only free slot is behind two prefills: the holder keeps it", setup: func(c []Candidate) {
			for i := range c {
				c[i].Slots, c[i].Inflight = 4, 4
			}
			c[3].Matched = 10
			c[5].Inflight, c[5].Prefilling = 3, 2
		}, minBound: 5, want: 3, reason: Hit, notPick: -1, prefered: 3},
		// Every slot taken everywhere, prefill queued everywhere
		// (saturated): the holder has three requests waiting for its
		// slots, the others none. Its slot wait is 300 blocks longer
		// than theirs; the move recomputes 10.
		{name: "a saturated holder with a longer slot wait yields", setup: saturatedSlots(400, 100), minBound: 5,
			want: -1, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundLoad},
		{name: "a saturated holder keeps it while slot waits are unknown", setup: saturatedSlots(0, 0), minBound: 5,
			want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "a saturated holder keeps it when its slot wait is longer by less than the recompute", setup: saturatedSlots(104, 100), minBound: 5,
			want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "a free slot at its own limit is no free slot", setup: func(c []Candidate) {
			for i := range c {
				c[i].Slots, c[i].Inflight, c[i].Limit = 4, 2, 2
			}
			c[3].Matched, c[3].Inflight, c[3].Limit = 10, 4, 0
		}, minBound: 5, want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "unknown slots change nothing", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 2
			}
			c[3].Matched, c[3].Inflight = 10, 4
			c[5].Matched = 4
		}, minBound: 5, want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "min bound keeps affinity at low load", setup: func(c []Candidate) { c[3].Matched, c[3].Inflight = 10, 1 }, minBound: 2, want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "queued prefill spills a short match", setup: func(c []Candidate) { c[2].Matched, c[2].Pending = 3, 30 },
			want: -1, reason: Overflow, notPick: 2, prefered: 2, yielded: BoundWait},
		{name: "a backend above its traffic share yields", setup: func(c []Candidate) {
			for i := range c {
				c[i].Recent = 1
			}
			c[4].Matched, c[4].Recent = 10, 3 // 3 / 10 * 8 = 2.4 x fair share
			c[1].Matched = 2
		}, want: 1, reason: Overflow, notPick: 4, prefered: 4, yielded: BoundShare},
		{name: "a long match is worth a moderate queue", setup: func(c []Candidate) { c[2].Matched, c[2].Pending = 18, 12 },
			want: 2, reason: Hit, notPick: -1, prefered: 2},
		{name: "a queue on a backend twice as fast waits half as long", setup: func(c []Candidate) {
			c[2].Matched, c[2].Pending, c[2].Speed = 3, 20, 2 // 20 queued + 17 uncached blocks take 19 at speed 2, 37 at 1
		}, want: 2, reason: Hit, notPick: -1, prefered: 2},
		{name: "a queue on a backend half as fast spills a longer match", setup: func(c []Candidate) {
			c[2].Matched, c[2].Pending, c[2].Speed = 18, 12, 0.5 // 12 queued blocks take 24 at speed 1/2
		}, want: -1, reason: Overflow, notPick: 2, prefered: 2, yielded: BoundWait},
		{name: "a long match holds a little past its load bound", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 2 // bound ceil(1.25*17/8) = 3
			}
			c[3].Matched, c[3].Inflight = 10, 3 // moving recomputes 10 of 20 blocks
		}, want: 3, reason: Hit, notPick: -1, prefered: 3},
		{name: "a long match does not hold past its bound while prefill queues there", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 2
			}
			c[3].Matched, c[3].Inflight, c[3].Prefilling = 10, 3, 2
			c[5].Matched = 4
		}, want: 5, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundLoad},
		{name: "past HoldLoad x its bound a long match overflows", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 2
			}
			c[3].Matched, c[3].Inflight = 10, 6 // bound ceil(1.25*21/8) = 4: 7 > 1.5 x 4
			c[5].Matched = 4
		}, want: 5, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundLoad},
		{name: "a short match over its load bound does not hold", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 2
			}
			c[3].Matched, c[3].Inflight = 1, 3 // moving costs 1 block: within slack
		}, want: -1, reason: Overflow, notPick: 3, prefered: 3, yielded: BoundLoad},
		// 15 of 20 blocks held, 40 queued: 45 to wait there, 30 anywhere
		// else. With every backend prefilling the move's recompute is
		// charged 8 times (busy/(N-busy+1)); with only the holder, 1/8.
		{name: "a busy fleet charges a move its recompute", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight, c[i].Prefilling, c[i].Pending = 1, 1, 10
			}
			c[2].Matched, c[2].Pending = 15, 40
		}, want: 2, reason: Hit, notPick: -1, prefered: 2},
		{name: "an idle fleet moves a long match off a queue", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight = 1 // decoding
			}
			c[2].Matched, c[2].Prefilling, c[2].Pending = 15, 1, 40
		}, want: -1, reason: Overflow, notPick: 2, prefered: 2, yielded: BoundWait},
		{name: "a busy fleet holds a long match past its load bound", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight, c[i].Prefilling, c[i].Pending = 2, 1, 10 // bound ceil(1.25*18/8) = 3
			}
			c[3].Matched, c[3].Inflight, c[3].Pending = 10, 3, 30 // 40 to wait there, 30 elsewhere
		}, want: 3, reason: Hit, notPick: -1, prefered: 3},
		// A cold prompt: backend 3 (share 1.27) and backend 5 (share
		// 0.88, one past its load bound of 3) both wait far less than
		// the rest (120 and 320 blocks against 520). Past the bounds it
		// goes to the one under its fair share, not to the shortest queue
		// over it: unchecked, cold prompts piled in requests onto the
		// backend whose queue the short ones kept short.
		{name: "a cold prompt goes past the bounds to a backend over its share only if none under it would", setup: func(c []Candidate) {
			for i := range c {
				c[i].Inflight, c[i].Prefilling, c[i].Recent, c[i].Pending = 2, 1, 1, 500
			}
			c[3].Recent, c[3].Pending = 1.3, 100
			c[5].Inflight, c[5].Recent, c[5].Pending = 3, 0.9, 300
		}, balance: 0.1, want: 5, reason: Cold, notPick: 3, prefered: -2},
		{name: "retry is labelled", setup: func(c []Candidate) { c[1].Matched = 3 }, retry: true, want: 1, reason: Retry, notPick: -1, prefered: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cands(8)
			tc.setup(c)
			d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k, Common: tc.common, Retry: tc.retry, MinBound: tc.minBound, BalanceSlack: tc.balance})
			if tc.full {
				if !d.Full || d.Pick != -1 {
					t.Fatalf("got %+v, want full", d)
				}
				return
			}
			want := tc.want
			if want == -1 {
				others := append([]Candidate(nil), c...)
				if tc.notPick >= 0 {
					others[tc.notPick].Weight = 1e-9 // cannot win
				}
				want = rendezvousWinner(others, RendezvousKey(k, tc.common, 0))
			}
			if d.Pick != want || d.Reason != tc.reason {
				t.Fatalf("got pick %d reason %s, want %d %s (%+v)", d.Pick, d.Reason, want, tc.reason, d)
			}
			if d.Yielded != tc.yielded {
				t.Fatalf("yielded %q, want %q", d.Yielded, tc.yielded)
			}
			if tc.prefered > -2 && d.Preferred != tc.prefered {
				t.Fatalf("preferred %d, want %d", d.Preferred, tc.prefered)
			}
			if d.Pick == tc.notPick {
				t.Fatalf("picked %d", d.Pick)
			}
		})
	}
}

func rendezvousWinner(c []Candidate, key uint64) int {
	best, bestScore := -1, 0.0
	for i := range c {
		if s := Rendezvous(key, c[i].ID, c[i].Weight); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// TestLongSharedPrefixSpreads: every request starts with the same long
// block run (a system prompt, Mooncake's block 0); once every backend holds
// it, cold requests must spread, not pin to one backend.
func TestLongSharedPrefixSpreads(t *testing.T) {
	const n, reqs = 8, 4000
	counts := make([]int, n)
	for r := range reqs {
		c := cands(n)
		k := keys(uint64(r), 24)
		copy(k[:8], keys(0, 8)) // shared first 8 blocks
		for i := range c {
			c[i].Matched = 8
		}
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k, Common: 8})
		counts[d.Pick]++
	}
	for i, got := range counts {
		if share := float64(got) / reqs; share < 0.09 || share > 0.16 {
			t.Fatalf("backend %d got %.3f of cold traffic (counts %v)", i, share, counts)
		}
	}
}

// TestBoundedLoadHolds replays a stream of requests that all match one
// backend best and checks no backend ever exceeds its bound.
func TestBoundedLoadHolds(t *testing.T) {
	c := cands(8)
	k := keys(3, 10)
	for step := range 200 {
		for i := range c {
			c[i].Matched = 0
		}
		c[0].Matched = 10
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k, LoadFactor: 1.25})
		if d.Pick < 0 {
			t.Fatalf("step %d: no pick", step)
		}
		// A backend holding the whole prompt may keep it up to HoldLoad x
		// its bound (moving would recompute all of it), no further.
		if float64(c[d.Pick].Inflight+1) > HoldLoad*float64(d.Bound) {
			t.Fatalf("step %d: pick %d at %d in flight exceeds %g x bound %d", step, d.Pick, c[d.Pick].Inflight, HoldLoad, d.Bound)
		}
		c[d.Pick].Inflight++
		total := 0
		for i := range c {
			total += c[i].Inflight
		}
		if limit := HoldLoad * math.Ceil(1.25*float64(total)/8); float64(c[0].Inflight) > limit {
			t.Fatalf("step %d: hot backend at %d > HoldLoad x ceil(1.25 x mean) = %g", step, c[0].Inflight, limit)
		}
	}
}

// TestRendezvousStability: adding a ninth backend moves about 1/9 of cold
// prefix groups, all of them to the new backend; removing one moves only its own.
func TestRendezvousStability(t *testing.T) {
	const groups = 20000
	eight, nine := cands(8), cands(9)
	moved := 0
	for g := range groups {
		key := mix(uint64(g) + 17)
		a, b := rendezvousWinner(eight, key), rendezvousWinner(nine, key)
		if a != b {
			moved++
			if b != 8 {
				t.Fatalf("group %d moved between old backends %d -> %d", g, a, b)
			}
		}
	}
	if frac := float64(moved) / groups; math.Abs(frac-1.0/9) > 0.015 {
		t.Fatalf("adding a backend moved %.3f of groups, want about %.3f", frac, 1.0/9)
	}
	seven := append([]Candidate(nil), eight[:3]...)
	seven = append(seven, eight[4:]...)
	for g := range groups {
		key := mix(uint64(g) + 17)
		a := eight[rendezvousWinner(eight, key)].ID
		b := seven[rendezvousWinner(seven, key)].ID
		if a != b && a != eight[3].ID {
			t.Fatalf("removing backend 3 moved group %d from %d", g, a)
		}
	}
}

func TestWeightedShares(t *testing.T) {
	c := cands(4)
	c[0].Weight = 0.25
	counts := make([]int, 4)
	const n = 40000
	for g := range n {
		counts[rendezvousWinner(c, mix(uint64(g)))]++
	}
	want := 0.25 / 3.25
	if got := float64(counts[0]) / n; math.Abs(got-want) > 0.01 {
		t.Fatalf("ramping backend share %.3f, want %.3f", got, want)
	}
}

func TestLeastOutstanding(t *testing.T) {
	c := cands(4)
	c[0].Inflight, c[1].Inflight, c[2].Inflight, c[3].Inflight = 3, 1, 2, 1
	picks := map[int]bool{}
	for r := range uint64(64) {
		d := Decide(Input{Strategy: LeastOutstanding, Candidates: c, Rand: mix(r)})
		if d.Pick != 1 && d.Pick != 3 {
			t.Fatalf("picked %d with %d in flight", d.Pick, c[d.Pick].Inflight)
		}
		picks[d.Pick] = true
	}
	if len(picks) != 2 {
		t.Fatalf("ties always broken the same way: %v", picks)
	}
	for i := range c {
		c[i].Limit = c[i].Inflight
	}
	if d := Decide(Input{Strategy: LeastOutstanding, Candidates: c}); !d.Full {
		t.Fatalf("want full, got %+v", d)
	}
}

func TestRandom(t *testing.T) {
	c := cands(4)
	c[2].Limit, c[2].Inflight = 1, 1
	counts := make([]int, 4)
	for r := range uint64(4000) {
		d := Decide(Input{Strategy: Random, Candidates: c, Rand: mix(r)})
		counts[d.Pick]++
	}
	if counts[2] != 0 {
		t.Fatalf("random sent %d to a backend at its limit", counts[2])
	}
	for _, i := range []int{0, 1, 3} {
		if counts[i] < 1100 || counts[i] > 1560 {
			t.Fatalf("uneven random spread %v", counts)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	for _, s := range []string{"random", "least-outstanding", "prefix-aware"} {
		if _, err := ParseStrategy(s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ParseStrategy("round-robin"); err == nil {
		t.Fatal("accepted unknown strategy")
	}
}

func TestDecideEmpty(t *testing.T) {
	if d := Decide(Input{Strategy: PrefixAware}); d.Pick != -1 || d.Full {
		t.Fatalf("got %+v", d)
	}
}

func TestShares(t *testing.T) {
	c := cands(4)
	if got := Shares(c, nil); got[0] != 0 || got[3] != 0 {
		t.Fatalf("no history: %v, want zeros", got)
	}
	c[0].Recent, c[1].Recent, c[2].Recent, c[3].Recent = 4, 2, 2, 0
	got := Shares(c, nil)
	for i, want := range []float64{2, 1, 1, 0} {
		if math.Abs(got[i]-want) > 1e-9 {
			t.Fatalf("shares %v, want [2 1 1 0]", got)
		}
	}
	c[3].Weight, c[3].Recent = 0.5, 1 // ramping: half a share is its fair part
	got = Shares(c, nil)
	if want := 1.0 / 9 * 3.5 / 0.5; math.Abs(got[3]-want) > 1e-9 {
		t.Fatalf("ramping share %v, want %v", got[3], want)
	}
}

func TestLoadBoundsDecodeWeight(t *testing.T) {
	c := cands(4)
	c[0].Inflight, c[0].Prefilling = 10, 1 // nine decoding
	c[1].Inflight, c[1].Prefilling = 2, 2
	plain := Bounds(c, 1.25, 1, nil)
	weighted := LoadBounds(c, 1.25, 0.1, 1, nil)
	// plain: ceil(1.25*13/4)=5; weighted total 1+0.9+2=3.9: ceil(1.25*4.9/4)=2
	if plain[0] != 5 || weighted[0] != 2 {
		t.Fatalf("bounds plain %v weighted %v", plain, weighted)
	}
	// Slack -1 turns off the hold past the bound (see HoldLoad): this is
	// about the bound's arithmetic.
	in := Input{Strategy: PrefixAware, Candidates: c, Keys: keys(1, 10), LoadFactor: 1.25, DecodeWeight: 0.1, MinBound: 1, Slack: -1}
	c[0].Matched = 10
	// Backend 0 carries 1.9 weighted load: 1.9+1 > 2, over; with decode
	// counted in full it is over too; a decode-light weight and a higher
	// factor keep it.
	if d := Decide(in); d.Pick == 0 {
		t.Fatalf("picked backend 0 over its weighted bound: %+v", d)
	}
	in.LoadFactor = 2
	if d := Decide(in); d.Pick != 0 || d.Reason != Hit {
		t.Fatalf("decode-weighted bound should keep the hit: %+v", d)
	}
	in.DecodeWeight = 1
	if d := Decide(in); d.Pick == 0 {
		t.Fatalf("plain in-flight bound should push it off: %+v", d)
	}
}

// TestDecidePrefixShares covers the traffic-share bound and where new
// groups start.
func TestDecidePrefixShares(t *testing.T) {
	k := keys(9, 20)
	cold := RendezvousKey(k, 0, 0)
	tests := []struct {
		name         string
		setup        func(c []Candidate)
		want         func(c []Candidate) int
		reason       Reason
		balanceSlack float64
	}{
		{name: "a backend twice as fast is fair at twice the traffic", setup: func(c []Candidate) {
			even(c)
			c[2].Recent, c[2].Matched, c[2].Speed = 2, 12, 2 // 2 / 9 x 9 / 2 = 1: at its fair share
		}, want: fixed(2), reason: Hit},
		{name: "a backend half as fast yields at its plain share", setup: func(c []Candidate) {
			even(c)
			c[2].Recent, c[2].Matched, c[2].Speed = 1.5, 12, 0.5 // 1.5 / 8.5 x 7.5 / 0.5 = 2.6 > HoldShare x 1.1
			c[5].Matched = 6
		}, want: fixed(5), reason: Overflow},
		{name: "hit within its share factor keeps affinity", setup: func(c []Candidate) {
			even(c)
			c[2].Recent, c[2].Matched = 1.08, 12
		}, want: fixed(2), reason: Hit},
		{name: "hit far above its share factor overflows to the next longest match", setup: func(c []Candidate) {
			even(c)
			c[2].Recent, c[2].Matched = 3, 12 // 3 / 10 x 8 = 2.4 > HoldShare x 1.1
			c[5].Matched = 6
		}, want: fixed(5), reason: Overflow},
		{name: "a long match a little above its share factor holds", setup: func(c []Candidate) {
			even(c)
			c[2].Recent, c[2].Matched = 1.5, 12 // 1.5 / 8.5 x 8 = 1.41: moving would recompute 12 of 20 blocks
			c[5].Matched = 6
		}, want: fixed(2), reason: Hit},
		{name: "a short match a little above its share factor yields", setup: func(c []Candidate) {
			even(c)
			c[2].Recent, c[2].Matched = 1.5, 2 // moving costs 2 blocks, within slack
			c[5].Matched = 1
		}, want: fixed(5), reason: Overflow},
		{name: "cold avoids backends above their fair share", setup: func(c []Candidate) {
			even(c)
			top := rendezvousWinner(c, cold)
			c[top].Recent = 1.05 // the rendezvous choice has had more than its share
		}, want: func(c []Candidate) int {
			others := append([]Candidate(nil), c...)
			for i := range others {
				if others[i].Recent > 1 {
					others[i].Weight = 1e-9
				}
			}
			return rendezvousWinner(others, cold)
		}, reason: Cold},
		{name: "cold goes above fair share only when the others are at their limits", setup: func(c []Candidate) {
			even(c)
			for i := range c {
				c[i].Inflight, c[i].Limit = 3, 3
			}
			c[4].Recent, c[4].Limit = 1.05, 0
		}, want: fixed(4), reason: Overflow},
		{name: "a fair backend with a long queue loses to a fair idle one", setup: func(c []Candidate) {
			even(c)
			for i := range c {
				c[i].Recent = 2 // over fair share: not eligible to start groups
			}
			c[1].Recent, c[1].Pending = 0.5, 100
			c[6].Recent = 0.5
		}, want: fixed(6), reason: Cold},
		{name: "no history: plain rendezvous", setup: func(c []Candidate) {}, want: func(c []Candidate) int { return rendezvousWinner(c, cold) }, reason: Cold},
		{name: "without a balance slack a new group waits for the backend short of traffic", setup: func(c []Candidate) {
			for i := range c {
				c[i].Recent, c[i].Pending = 1.05, 5 // all a little over their share, short queues
			}
			c[3].Recent, c[3].Pending = 0.5, 60 // short of traffic, long queue
		}, want: fixed(3), reason: Cold},
		{name: "a balance slack caps that wait", setup: func(c []Candidate) {
			for i := range c {
				c[i].Recent, c[i].Pending = 1.05, 5
			}
			c[3].Recent, c[3].Pending = 0.5, 60
		}, balanceSlack: 0.5, want: func(c []Candidate) int {
			others := append([]Candidate(nil), c...)
			others[3].Weight = 1e-9
			return rendezvousWinner(others, cold)
		}, reason: Cold},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cands(8)
			tc.setup(c)
			d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k, ShareFactor: 1.1, BalanceSlack: tc.balanceSlack})
			if want := tc.want(c); d.Pick != want || d.Reason != tc.reason {
				t.Fatalf("got pick %d reason %s, want %d %s (%+v)", d.Pick, d.Reason, want, tc.reason, d)
			}
		})
	}
}

func even(c []Candidate) {
	for i := range c {
		c[i].Recent = 1
	}
}

func fixed(i int) func([]Candidate) int { return func([]Candidate) int { return i } }

// TestShareBoundBalancesGroups replays Zipf-popular prefix groups through
// the decision with the caller's bookkeeping (decayed traffic, the index
// remembering where each group went) and checks both halves of the bargain:
// traffic stays near even and most requests still find their group.
func TestShareBoundBalancesGroups(t *testing.T) {
	const n, groups, reqs = 8, 200, 20000
	c := cands(n)
	where := map[int]int{} // group -> backend holding it
	counts := make([]int, n)
	hits, repeats := 0, 0
	decay := math.Exp2(-1.0 / 256)
	rng := mix(42)
	for r := range reqs {
		rng = mix(rng + uint64(r))
		// Zipf-ish: group g with weight 1/(g+1).
		g := int(math.Floor(math.Pow(float64(groups+1), float64(rng>>11)/(1<<53)))) - 1
		k := keys(uint64(g)+100, 16)
		held, seen := where[g]
		for i := range c {
			c[i].Matched = 0
		}
		if seen {
			c[held].Matched = 16
			repeats++
		}
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k, ShareFactor: 1.1})
		if d.Pick < 0 {
			t.Fatalf("request %d: no pick", r)
		}
		if seen && d.Pick == held {
			hits++
		}
		where[g] = d.Pick
		for i := range c {
			c[i].Recent *= decay
		}
		c[d.Pick].Recent++
		counts[d.Pick]++
	}
	top := 0
	for _, x := range counts {
		top = max(top, x)
	}
	// Every repeat here is fully cached and nothing queues, so a holder
	// keeps its groups up to HoldShare x ShareFactor whenever moving would
	// cost a whole match: this stream is the worst case for that, and
	// still well under the cap.
	if busiest := float64(top) / (reqs / n); busiest > 1.35 {
		t.Fatalf("busiest backend %.3f x mean (counts %v)", busiest, counts)
	}
	if frac := float64(hits) / float64(repeats); frac < 0.8 {
		t.Fatalf("only %.2f of repeated groups kept their backend", frac)
	}
}

// TestFallbackPicksShortestWait: once no backend passes every rule that
// would keep a group or start a new one where traffic is short, the request
// goes where the expected wait is shortest, whatever the rendezvous order.
func TestFallbackPicksShortestWait(t *testing.T) {
	k := keys(1, 20)
	for _, tc := range []struct{ pend1, pend3, want int }{{2, 0, 3}, {0, 2, 1}} {
		c := cands(8)
		for i := range c {
			c[i].Recent = 1.05 // above a fair share, within ShareFactor 1.1
			if i >= 4 {
				c[i].Recent, c[i].Pending = 0.95, 1000 // short of traffic, but a long queue
			}
		}
		c[0].Pending, c[2].Pending = 6, 4 // beyond Slack of the best
		c[1].Pending, c[3].Pending = tc.pend1, tc.pend3
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k, BalanceSlack: 0.1})
		if d.Pick != tc.want {
			t.Errorf("pending 1=%d 3=%d: picked %d, want %d (%+v)", tc.pend1, tc.pend3, d.Pick, tc.want, d)
		}
	}
}

// TestColdGoesToLeastRecentTraffic: among backends under their fair share
// with queues within Slack of the shortest, a request that no backend
// holds goes to the one sent the fewest requests lately (its queued
// prefill likely started first), not to the rendezvous choice.
func TestColdGoesToLeastRecentTraffic(t *testing.T) {
	k := keys(5, 20)
	c := cands(8)
	win := rendezvousWinner(c, RendezvousKey(k, 0, 0))
	other := (win + 1) % len(c)
	for i := range c {
		c[i].Recent, c[i].Pending = 1.05, 10
	}
	c[win].Recent, c[other].Recent = 0.9, 0.8 // both under their fair share
	c[other].Pending = 11                     // within Slack (2 blocks)
	d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: k})
	if d.Pick != other || d.Reason != Cold {
		t.Fatalf("picked %d (%s), want the least recent %d over the rendezvous choice %d", d.Pick, d.Reason, other, win)
	}
}

// TestColdGoesPastBoundsForShorterWait: a request no backend holds goes
// past the share factor or the load bound (up to the hold caps) to a
// backend whose queued prefill is shorter than the best one's within the
// bounds by more than Slack; within Slack, or past the caps, the bounds
// decide as before. A backend holding part of the prompt is not moved by
// it.
func TestColdGoesPastBoundsForShorterWait(t *testing.T) {
	tests := []struct {
		name   string
		blocks int
		setup  func(c []Candidate)
		want   int // -1: any but avoid
		avoid  int
	}{
		{name: "past the share factor", blocks: 14, setup: func(c []Candidate) {
			c[3].Recent, c[3].Pending = 1.3, 400 // share 1.25: over 1.1, under 1.65
		}, want: 3},
		{name: "past the load bound", blocks: 14, setup: func(c []Candidate) {
			c[5].Inflight, c[5].Pending = 3, 100 // bound 3: 4 > 3, <= 4.5
		}, want: 5},
		{name: "within slack the bounds hold", blocks: 100, setup: func(c []Candidate) {
			c[3].Recent, c[3].Pending = 1.3, 495 // 5 blocks shorter, slack 10
		}, want: -1, avoid: 3},
		{name: "past the share cap", blocks: 14, setup: func(c []Candidate) {
			c[3].Recent, c[3].Pending = 3, 0 // share 2.4
		}, want: -1, avoid: 3},
		{name: "past the load cap", blocks: 14, setup: func(c []Candidate) {
			c[5].Inflight, c[5].Pending = 7, 0 // bound 4: 8 > 6
		}, want: -1, avoid: 5},
		{name: "a holder keeps its request", blocks: 14, setup: func(c []Candidate) {
			c[2].Matched, c[2].Pending = 10, 500
			c[3].Recent, c[3].Pending = 1.3, 480
		}, want: 2},
	}
	for _, tc := range tests {
		c := cands(8)
		for i := range c {
			c[i].Inflight, c[i].Prefilling, c[i].Recent, c[i].Pending = 2, 1, 1, 500
		}
		tc.setup(c)
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: keys(9, tc.blocks), MinBound: 2, BalanceSlack: 0.1})
		if (tc.want >= 0 && d.Pick != tc.want) || (tc.want < 0 && (d.Pick < 0 || d.Pick == tc.avoid)) {
			t.Errorf("%s: picked %d (%s), want %d (not %d)", tc.name, d.Pick, d.Reason, tc.want, tc.avoid)
		}
	}
}

// TestEmptyBackendPricesTheCommonPrefixAsHeld replays decisions logged on
// the multi-turn workload (load 0.7, seed 1) where backend 5 held nothing
// while the others held the 6-block system prompt, here passed as common as
// the router now does. Each line is the candidates as the decision saw
// them: m matched blocks, i in flight, p waiting for their first token, q
// queued prefill blocks, s traffic over fair share. Priced at the recompute
// of the common prefix it lost every comparison and sat idle; priced as
// holding it, the backend with the least traffic takes what the holder
// cannot keep. A backend that holds the common prefix is priced as before.
func TestEmptyBackendPricesTheCommonPrefixAsHeld(t *testing.T) {
	tests := []struct {
		name   string
		blocks int
		cands  string
		want   int
	}{
		{"holder over its load bound", 33, "m6,i9,p1,q5,s1.10 m6,i10,p0,q0,s1.21 m27,i12,p2,q12,s1.48 m6,i10,p0,q0,s1.22 m6,i6,p0,q0,s0.71 m0,i0,p0,q0,s0.00 m6,i11,p0,q0,s1.33 m6,i8,p0,q0,s0.95", 5},
		{"holder over its share", 38, "m6,i13,p0,q0,s1.06 m6,i23,p0,q0,s1.29 m6,i20,p0,q0,s1.28 m6,i15,p0,q0,s1.13 m6,i9,p0,q0,s1.08 m0,i0,p0,q0,s0.00 m32,i16,p2,q12,s1.20 m6,i9,p0,q0,s0.97", 5},
		{"the least traffic holds the prefix", 33, "m6,i9,p1,q5,s1.10 m6,i10,p0,q0,s1.21 m27,i12,p2,q12,s1.48 m6,i10,p0,q0,s1.22 m6,i6,p0,q0,s0.71 m6,i0,p0,q0,s0.00 m6,i11,p0,q0,s1.33 m6,i8,p0,q0,s0.95", 5},
	}
	for _, tc := range tests {
		var c []Candidate
		for i, f := range strings.Fields(tc.cands) {
			x := Candidate{ID: uint64(1000 + i), Weight: 1}
			if _, err := fmt.Sscanf(f, "m%d,i%d,p%d,q%d,s%g", &x.Matched, &x.Inflight, &x.Prefilling, &x.Pending, &x.Recent); err != nil {
				t.Fatalf("%s: candidate %q: %v", tc.name, f, err)
			}
			c = append(c, x)
		}
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: keys(11, tc.blocks), Common: 6,
			MinBound: 2, ShareFactor: 1.1, BalanceSlack: 0.1})
		if d.Pick != tc.want {
			t.Errorf("%s: picked %d (%s/%s), want %d", tc.name, d.Pick, d.Reason, d.Yielded, tc.want)
		}
	}
}

// TestSaturatedHolderKeepsItsRequest: when every backend queues prefill
// behind prefill (a closed loop of clients, every sequence slot taken), the
// backend holding most of the prompt keeps it although its queue is longer
// than the others' by more than the recompute: each backend stays busy
// wherever the request goes, so moving it only spends the recompute out of
// the fleet's capacity. With the others not prefilling, another holding
// nearly as much, or the holder past a hold cap, the wait rule and the
// bounds hold as before.
func TestSaturatedHolderKeepsItsRequest(t *testing.T) {
	tests := []struct {
		name  string
		setup func(c []Candidate)
		held  bool
	}{
		{"saturated", func(c []Candidate) {}, true},
		// Every backend still prefills: the move's recompute is charged
		// 8 times (see TestDecidePrefix).
		{"one backend not queueing", func(c []Candidate) { c[6].Prefilling = 1 }, true},
		{"the others not prefilling", func(c []Candidate) {
			for i := range c {
				if i != 2 {
					c[i].Prefilling, c[i].Pending = 0, 0
				}
			}
		}, false},
		// Moving saves no recompute worth a longer queue.
		{"another holds nearly as much", func(c []Candidate) { c[5].Matched = 118 }, false},
		{"holder past the share cap", func(c []Candidate) { c[2].Recent = 3 }, false},    // share 2.4 > 1.5 x 1.1
		{"holder past the load cap", func(c []Candidate) { c[2].Inflight = 200 }, false}, // bound 102: 201 > 1.5 x 102
	}
	for _, tc := range tests {
		c := cands(8)
		for i := range c {
			c[i].Inflight, c[i].Prefilling, c[i].Recent, c[i].Pending = 64, 10, 1, 300
		}
		// 125 blocks, 120 held: 505 blocks to wait there, 425 anywhere else.
		c[2].Matched, c[2].Pending = 120, 500
		tc.setup(c)
		d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: keys(5, 125), MinBound: 2, BalanceSlack: 0.1})
		if got := d.Pick == 2; got != tc.held || d.Pick < 0 {
			t.Errorf("%s: picked %d (%s/%s), holder kept it: %v, want %v", tc.name, d.Pick, d.Reason, d.Yielded, got, tc.held)
		}
	}
}

// BenchmarkDecidePrefix64 is the prefix-aware decision alone over 64
// backends and a 64-block prompt (BenchmarkRoute64x16k's shape): idle, as
// that benchmark leaves the backends, and busy, with requests in flight,
// prefill queued and uneven recent traffic.
func BenchmarkDecidePrefix64(b *testing.B) {
	for _, busy := range []bool{false, true} {
		b.Run(fmt.Sprintf("busy=%v", busy), func(b *testing.B) {
			c := cands(64)
			for i := range c {
				c[i].Warm = true
				c[i].Recent = float64(i%7) + 0.5
				if i%5 == 0 {
					c[i].Matched = 10 + i%40
				}
				if busy {
					c[i].Inflight, c[i].Prefilling, c[i].Pending = 1+i%4, i%2, (i%3)*40
				}
			}
			in := Input{Strategy: PrefixAware, Candidates: c, Keys: keys(3, 64), Common: 2}
			for b.Loop() {
				if d := Decide(in); d.Pick < 0 {
					b.Fatal("no pick")
				}
			}
		})
	}
}

// TestWildSlotWaitIsBounded: a slot wait as large as an int can hold
// neither overflows the expected wait nor keeps the request on the holder.
func TestWildSlotWaitIsBounded(t *testing.T) {
	c := cands(8)
	c[3].Matched, c[3].SlotWait = 10, math.MaxInt
	c[5].Matched = 4
	d := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: keys(1, 20), MinBound: 2})
	if d.Pick != 5 || d.Reason != Overflow || d.Yielded != BoundWait {
		t.Fatalf("decision %+v, want an overflow to backend 5 on the wait rule", d)
	}
}

// TestPrefixAwareOverlap: on engines that prefill prompts side by side
// (Input.Overlap), a prompt nobody holds goes where the fewest requests
// run, whatever they have left to prefill; on a queue (the default) where
// the least prefill is queued. And the slot rule holds on such engines
// while every backend with a free slot has prompts in prefill: a short
// prompt is not sent to wait for a sequence slot.
func TestPrefixAwareOverlap(t *testing.T) {
	for _, tc := range []struct {
		name              string
		overlap, slowdown float64
		cands             []Candidate
		want              int
		minBound          int
	}{
		{"queue: least pending", 0, 0, []Candidate{
			{ID: 1, Inflight: 3, Pending: 0, Slots: 4}, {ID: 2, Inflight: 1, Pending: 40, Prefilling: 1, Slots: 4}}, 0, 0},
		{"side by side: fewest running", 0.95, 0.33, []Candidate{
			{ID: 1, Inflight: 3, Pending: 0, Slots: 4}, {ID: 2, Inflight: 1, Pending: 40, Prefilling: 1, Slots: 4}}, 1, 0},
		{"side by side, no slowdown: prefill queued ahead is not waited for", 0.95, 0, []Candidate{
			{ID: 1, Inflight: 2, Pending: 30, Prefilling: 2, Slots: 4, Recent: 1}, {ID: 2, Inflight: 1, Pending: 0, Slots: 4, Recent: 2}}, 0, 0},
		{"queue: slots full everywhere free has prefill queued, rule off", 0, 0, []Candidate{
			{ID: 1, Inflight: 4, Pending: 0, Slots: 4, SlotWait: 500}, {ID: 2, Inflight: 3, Pending: 900, Prefilling: 2, Slots: 4}}, 0, 0},
		{"side by side: the free slot wins", 0.95, 0.33, []Candidate{
			{ID: 1, Inflight: 4, Pending: 0, Slots: 4, SlotWait: 500}, {ID: 2, Inflight: 3, Pending: 900, Prefilling: 2, Slots: 4}}, 1, 0},
		// Read as a queue that slows down (what the fit often learns of
		// side-by-side engines): nothing queued, both under a load bound.
		{"queue, no slowdown: the rendezvous pick, busy or not", 0, 0, []Candidate{
			{ID: 1, Inflight: 0, Slots: 4}, {ID: 2, Inflight: 3, Slots: 4}}, 1, 4},
		{"queue, slowdown under SlowdownAt: as none", 0, SlowdownAt - 0.01, []Candidate{
			{ID: 1, Inflight: 0, Slots: 4}, {ID: 2, Inflight: 3, Slots: 4}}, 1, 4},
		{"queue that slows down: fewest running", 0.2, 0.3, []Candidate{
			{ID: 1, Inflight: 0, Slots: 4}, {ID: 2, Inflight: 3, Slots: 4}}, 0, 4},
		{"queue that slows down: the queue still counts", 0.2, 0.3, []Candidate{
			{ID: 1, Inflight: 1, Pending: 40, Prefilling: 1, Slots: 4}, {ID: 2, Inflight: 3, Slots: 4}}, 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.cands {
				tc.cands[i].Weight = 1
			}
			d := Decide(Input{Strategy: PrefixAware, Candidates: tc.cands, Keys: keys(1, 10), Overlap: tc.overlap, Slowdown: tc.slowdown, MinBound: tc.minBound})
			if d.Pick != tc.want {
				t.Fatalf("picked %d (%s), want %d", d.Pick, d.Reason, tc.want)
			}
		})
	}
}
