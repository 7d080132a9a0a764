package balance

import "testing"

func TestParseFieldStrategies(t *testing.T) {
	for _, s := range Strategies() {
		if got, err := ParseStrategy(string(s)); err != nil || got != s {
			t.Fatalf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
}

func TestPrefixHash(t *testing.T) {
	c := cands(8)
	k := keys(3, 20)
	in := Input{Strategy: PrefixHash, Candidates: c, Keys: k}
	d := Decide(in)
	if d.Pick < 0 || d.Pick != Decide(in).Pick || d.Reason != Hit {
		t.Fatalf("not stable: %+v", d)
	}
	// The key is the first RendezvousBlocks blocks: a different tail
	// after them lands on the same backend.
	k2 := append(append([]uint64{}, k[:16]...), keys(4, 4)...)
	if got := Decide(Input{Strategy: PrefixHash, Candidates: c, Keys: k2}).Pick; got != d.Pick {
		t.Fatalf("same prefix went to %d, want %d", got, d.Pick)
	}
	// Load does not matter, only the own limit: the next round the list.
	c[d.Pick].Inflight = 1000
	if got := Decide(in).Pick; got != d.Pick {
		t.Fatalf("naive hash moved for load: %d", got)
	}
	c[d.Pick].Limit = 1000
	got := Decide(in)
	if want := (d.Pick + 1) % 8; got.Pick != want || got.Reason != Overflow || got.Yielded != BoundLimit {
		t.Fatalf("at limit: %+v, want pick %d overflow/limit", got, want)
	}
	// Keys spread over backends.
	seen := map[int]bool{}
	for i := range 200 {
		seen[Decide(Input{Strategy: PrefixHash, Candidates: cands(8), Keys: keys(uint64(100+i), 3)}).Pick] = true
	}
	if len(seen) != 8 {
		t.Fatalf("200 prefixes reached %d of 8 backends", len(seen))
	}
}

func TestCacheAware(t *testing.T) {
	k := keys(5, 10)
	tests := []struct {
		name   string
		setup  func(c []Candidate)
		thr    float64
		want   int
		reason Reason
	}{
		{name: "match above threshold wins", setup: func(c []Candidate) { c[2].Matched, c[5].Matched = 6, 3; c[2].Inflight = 10 }, want: 2, reason: Hit},
		{name: "match at threshold is not enough: smallest tree", setup: func(c []Candidate) {
			c[2].Matched = 5
			for i := range c {
				c[i].Held = 100 - i
			}
		}, want: 7, reason: Cold},
		{name: "lower threshold takes it", setup: func(c []Candidate) { c[2].Matched = 5 }, thr: 0.3, want: 2, reason: Hit},
		{name: "imbalanced: shortest queue whatever the cache", setup: func(c []Candidate) {
			c[2].Matched = 10
			for i := range c {
				c[i].Inflight = 40
			}
			c[6].Inflight = 5 // 40-5 > 32 and 40 > 1.0001 x 5
		}, want: 6, reason: Least},
		{name: "absolute gap alone is not imbalance", setup: func(c []Candidate) {
			c[2].Matched = 10
			for i := range c {
				c[i].Inflight = 20
			}
			c[6].Inflight = 0 // 20-0 <= 32
		}, want: 2, reason: Hit},
		{name: "best match at its limit: next best match", setup: func(c []Candidate) {
			c[2].Matched, c[2].Inflight, c[2].Limit = 10, 4, 4
			c[4].Matched = 7
		}, want: 4, reason: Overflow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cands(8)
			tc.setup(c)
			d := Decide(Input{Strategy: CacheAware, Candidates: c, Keys: k, CacheThreshold: tc.thr})
			if d.Pick != tc.want || d.Reason != tc.reason {
				t.Fatalf("got pick %d reason %s, want %d %s", d.Pick, d.Reason, tc.want, tc.reason)
			}
		})
	}
}

func TestBoundedLoad(t *testing.T) {
	const n = 8
	// Consistency: removing one backend moves only the keys it had.
	moved, had := 0, 0
	for i := range 400 {
		k := keys(uint64(1000+i), 4)
		all := Decide(Input{Strategy: BoundedLoad, Candidates: cands(n), Keys: k})
		less := cands(n)[1:]
		got := Decide(Input{Strategy: BoundedLoad, Candidates: less, Keys: k})
		if all.Pick == 0 {
			had++
			continue
		}
		if less[got.Pick].ID != uint64(1000+all.Pick) {
			moved++
		}
	}
	if moved != 0 || had == 0 {
		t.Fatalf("%d keys moved that the removed backend did not hold (it held %d)", moved, had)
	}
	// The bound: at m in flight nobody goes past ceil(c(m+1)/n), so a hot
	// prefix spills clockwise instead of piling up.
	c := cands(n)
	k := keys(9, 4)
	for range 100 {
		d := Decide(Input{Strategy: BoundedLoad, Candidates: c, Keys: k, LoadFactor: 1.25})
		if d.Pick < 0 {
			t.Fatal("no pick")
		}
		total := 0
		for i := range c {
			total += c[i].Inflight
		}
		if c[d.Pick].Inflight+1 > d.Bound || d.Bound != (125*(total+1)+100*n-1)/(100*n) {
			t.Fatalf("pick at %d in flight with bound %d (total %d)", c[d.Pick].Inflight, d.Bound, total)
		}
		c[d.Pick].Inflight++
	}
	for i := range c {
		if c[i].Inflight > 16 { // ceil(1.25 x 100 / 8)
			t.Fatalf("backend %d holds %d of 100", i, c[i].Inflight)
		}
	}
}

func TestSessionStrategy(t *testing.T) {
	c := cands(8)
	in := Input{Strategy: Session, Candidates: c, Keys: keys(1, 4), Session: 42, MinBound: 2}
	d := Decide(in)
	if d.Pick < 0 || d.Reason != Hit {
		t.Fatalf("%+v", d)
	}
	// A different prompt in the same session stays.
	in.Keys = keys(2, 30)
	if got := Decide(in).Pick; got != d.Pick {
		t.Fatalf("session moved with its prompt: %d, want %d", got, d.Pick)
	}
	// Another backend leaving does not move it.
	other := (d.Pick + 1) % 8
	less := append(append([]Candidate{}, c[:other]...), c[other+1:]...)
	if got := Decide(Input{Strategy: Session, Candidates: less, Session: 42}); less[got.Pick].ID != c[d.Pick].ID {
		t.Fatalf("session moved when another backend left")
	}
	// Sessions spread.
	seen := map[int]bool{}
	for s := range 100 {
		seen[Decide(Input{Strategy: Session, Candidates: cands(8), Session: uint64(s + 1)}).Pick] = true
	}
	if len(seen) != 8 {
		t.Fatalf("100 sessions on %d of 8 backends", len(seen))
	}
	// Over its load bound, the session goes to the next in its order.
	for i := range c {
		c[i].Inflight = 1
	}
	c[d.Pick].Inflight = 10 // bound ceil(1.25 x 18 / 8) = 3
	got := Decide(in)
	if got.Pick == d.Pick || got.Reason != Overflow || got.Preferred != d.Pick {
		t.Fatalf("over its bound: %+v (pinned %d)", got, d.Pick)
	}
	// No session: prefix-aware's decision.
	in.Session = 0
	want := Decide(Input{Strategy: PrefixAware, Candidates: c, Keys: in.Keys, MinBound: 2})
	if got := Decide(in); got.Pick != want.Pick || got.Reason != want.Reason {
		t.Fatalf("without a session: %+v, want prefix-aware's %+v", got, want)
	}
}
