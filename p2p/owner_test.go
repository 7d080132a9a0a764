package p2p

import (
	"fmt"
	"slices"
	"testing"
)

func nodes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%02d", i)
	}
	return out
}

func TestOriginRanking(t *testing.T) {
	cases := []struct {
		name  string
		nodes []string
		want  int
	}{
		{"empty", nil, 0},
		{"one", []string{"a"}, 1},
		{"duplicates dropped", []string{"a", "b", "a", "c", "b"}, 3},
	}
	for _, c := range cases {
		got := Origin("shard", c.nodes)
		if len(got) != c.want {
			t.Fatalf("%s: Origin = %v, want %d nodes", c.name, got, c.want)
		}
	}
	// Every node computes the same ranking whatever order it lists members in.
	a := Origin("shard-7", []string{"n1", "n2", "n3", "n4"})
	b := Origin("shard-7", []string{"n4", "n3", "n1", "n2"})
	if !slices.Equal(a, b) {
		t.Fatalf("ranking depends on input order: %v vs %v", a, b)
	}
}

func TestOriginSpreadsEvenly(t *testing.T) {
	for _, n := range []int{3, 8, 24} {
		members := nodes(n)
		const shards = 12000
		count := map[string]int{}
		for s := range shards {
			count[Origin(fmt.Sprintf("model/rev/file-%d#%d", s%97, s), members)[0]]++
		}
		mean := float64(shards) / float64(n)
		for _, m := range members {
			if dev := (float64(count[m]) - mean) / mean; dev > 0.12 || dev < -0.12 {
				t.Errorf("n=%d: %s is origin of %d shards, mean %.0f (%.1f%% off)", n, m, count[m], mean, 100*dev)
			}
		}
	}
}

func TestOriginMovesLittle(t *testing.T) {
	members := nodes(8)
	const shards = 10000
	before := make([]string, shards)
	for s := range shards {
		before[s] = Origin(fmt.Sprint("s", s), members)[0]
	}
	t.Run("remove", func(t *testing.T) {
		gone := members[3]
		rest := slices.Delete(slices.Clone(members), 3, 4)
		for s := range shards {
			full := Origin(fmt.Sprint("s", s), members)
			after := Origin(fmt.Sprint("s", s), rest)[0]
			if before[s] != gone && after != before[s] {
				t.Fatalf("shard %d moved from live %s to %s", s, before[s], after)
			}
			if before[s] == gone && after != full[1] {
				t.Fatalf("shard %d went to %s, not the runner-up %s", s, after, full[1])
			}
		}
	})
	t.Run("add", func(t *testing.T) {
		more := append(slices.Clone(members), "node-new")
		moved := 0
		for s := range shards {
			after := Origin(fmt.Sprint("s", s), more)[0]
			if after != before[s] {
				if after != "node-new" {
					t.Fatalf("shard %d moved between old nodes", s)
				}
				moved++
			}
		}
		if frac, want := float64(moved)/shards, 1.0/9; frac > want*1.15 || frac < want*0.85 {
			t.Fatalf("adding a 9th node moved %.3f of shards, want about %.3f", frac, want)
		}
	})
}
