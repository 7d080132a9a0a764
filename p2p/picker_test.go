package p2p

import "testing"

func bitsOf(n int, set ...int) Bitfield {
	b := NewBitfield(n)
	for _, i := range set {
		b.Set(i)
	}
	return b
}

func TestPickRarest(t *testing.T) {
	first := func(int) int { return 1 } // never replace: keep the first tie
	last := func(int) int { return 0 }  // always replace: keep the last tie
	cases := []struct {
		name     string
		have     []int
		inflight []int
		avail    []int32
		peer     []int
		intn     func(int) int
		want     int
	}{
		{name: "peer has nothing", avail: []int32{1, 1, 1, 1}, intn: first, want: -1},
		{name: "rarest wins", avail: []int32{3, 1, 2, 1}, peer: []int{0, 1, 2}, intn: first, want: 1},
		{name: "skips have and inflight", have: []int{1}, inflight: []int{2}, avail: []int32{3, 1, 1, 2}, peer: []int{0, 1, 2, 3}, intn: first, want: 3},
		{name: "ties first", avail: []int32{2, 1, 1, 1}, peer: []int{0, 1, 2, 3}, intn: first, want: 1},
		{name: "ties last", avail: []int32{2, 1, 1, 1}, peer: []int{0, 1, 2, 3}, intn: last, want: 3},
		{name: "all done", have: []int{0, 1, 2, 3}, avail: []int32{1, 1, 1, 1}, peer: []int{0, 1, 2, 3}, intn: first, want: -1},
	}
	for _, c := range cases {
		st := &pickState{have: bitsOf(4, c.have...), inflight: make([]bool, 4), avail: c.avail}
		for _, i := range c.inflight {
			st.inflight[i] = true
		}
		if got := pickRarest(st, bitsOf(4, c.peer...), c.intn); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPickRarestSpreadsTies(t *testing.T) {
	st := &pickState{have: NewBitfield(8), inflight: make([]bool, 8), avail: make([]int32, 8)}
	seen := map[int]bool{}
	for k := range 64 {
		// A deterministic stand-in for rand.IntN that varies per call.
		calls := 0
		intn := func(n int) int { calls++; return (k + calls) % n }
		seen[pickRarest(st, bitsOf(8, 0, 1, 2, 3, 4, 5, 6, 7), intn)] = true
	}
	if len(seen) < 4 {
		t.Fatalf("equally rare pieces picked from only %v", seen)
	}
}

func TestPickForOrigin(t *testing.T) {
	cases := []struct {
		name     string
		have     []int
		inflight []int
		avail    []int32
		want     int
	}{
		{name: "first unavailable", avail: []int32{1, 0, 0, 2}, want: 1},
		{name: "skips inflight", inflight: []int{1}, avail: []int32{1, 0, 0, 2}, want: 2},
		{name: "peers have the rest", have: []int{1, 2}, avail: []int32{1, 0, 0, 2}, want: -1},
	}
	for _, c := range cases {
		st := &pickState{have: bitsOf(4, c.have...), inflight: make([]bool, 4), avail: c.avail}
		for _, i := range c.inflight {
			st.inflight[i] = true
		}
		if got := pickForOrigin(st); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPickForHelper(t *testing.T) {
	cases := []struct {
		name            string
		have, inflight  []int
		avail           []int32
		stripe, stripes int
		want            int
	}{
		{name: "nothing anywhere: the last piece", stripe: 0, stripes: 3, want: 9},
		{name: "second stripe: one before the last", stripe: 1, stripes: 3, want: 8},
		{name: "own stripe only", have: []int{9}, stripe: 0, stripes: 3, want: 6},
		{name: "past the origin's run", avail: []int32{1, 1, 1, 1}, stripe: 0, stripes: 1, want: 9},
		{name: "the run counts own pieces", have: []int{0, 1, 2, 3, 4}, stripe: 0, stripes: 1, want: 9},
		{name: "not near the origin", have: []int{0, 1, 2, 3, 4, 5, 9}, stripe: 0, stripes: 1, want: -1},
		{name: "helpGap past the run", have: []int{0, 1, 2, 3, 9}, stripe: 0, stripes: 1, want: 4 + helpGap},
		{name: "skips what a peer has", avail: []int32{0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, stripe: 0, stripes: 1, want: 8},
		{name: "skips its own request", inflight: []int{9}, stripe: 0, stripes: 1, want: 8},
		{name: "bad stripe", stripe: 3, stripes: 3, want: -1},
		{name: "no stripes", stripe: 0, stripes: 0, want: -1},
	}
	for _, c := range cases {
		avail := make([]int32, 10)
		copy(avail, c.avail)
		st := &pickState{have: bitsOf(10, c.have...), inflight: make([]bool, 10), avail: avail}
		for _, i := range c.inflight {
			st.inflight[i] = true
		}
		if got := pickForHelper(st, c.stripe, c.stripes); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}
