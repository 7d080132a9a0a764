package blockset

import (
	"math/rand/v2"
	"testing"
)

// TestTableAgreesWithMap: the open-addressed table answers as a Go map of
// sets does through adds and removals that grow it and empty it again,
// with hashes that crowd into the same slots (small integers, and the zero
// hash that marks a free slot), so deletions move probe chains about.
func TestTableAgreesWithMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tab Table
	model := map[uint64]Set{}
	keys := make([]uint64, 5000)
	for i := range keys {
		switch {
		case i == 0:
			keys[i] = 0
		case i%2 == 0:
			keys[i] = uint64(i) // small integers, as tests use
		default:
			keys[i] = rng.Uint64()
		}
	}
	check := func(round int) {
		t.Helper()
		for _, h := range keys {
			if got, want := tab.Get(h), model[h]; got != want {
				t.Fatalf("round %d: get(%#x) = %v, want %v", round, h, got, want)
			}
		}
		if n := tab.Len(); n != len(model) {
			t.Fatalf("round %d: %d blocks held, want %d", round, n, len(model))
		}
	}
	for round := range 60 {
		// Fill up in the even rounds, drain in the odd ones.
		addShare := 0.8
		if round%2 == 1 {
			addShare = 0.2
		}
		for range 4000 {
			h, id := keys[rng.IntN(len(keys))], rng.IntN(256)
			s := model[h]
			if rng.Float64() < addShare {
				tab.Add(h, id)
				s.Add(id)
			} else {
				gone := tab.Remove(h, id)
				s.Remove(id)
				if gone != s.Empty() {
					t.Fatalf("Remove(%#x, %d) = %v, want %v", h, id, gone, s.Empty())
				}
			}
			if s.Empty() {
				delete(model, h)
			} else {
				model[h] = s
			}
		}
		check(round)
	}
	for h, s := range model { // empty it
		for id := range 256 {
			if s[id>>6]&(1<<(id&63)) != 0 {
				tab.Remove(h, id)
			}
		}
	}
	clear(model)
	check(-1)
}
