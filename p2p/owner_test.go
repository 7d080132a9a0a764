package p2p

import (
	"fmt"
	"maps"
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

func TestAssignOriginsIsBalancedAndAgreed(t *testing.T) {
	nodes := []string{"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"}
	var shards []ShardSize
	for f := range 4 {
		for i := range 8 {
			shards = append(shards, ShardSize{fmt.Sprintf("rev/file-%d#%d", f, i), 32})
		}
	}
	a := AssignOrigins(shards, nodes)
	load := map[string]int{}
	for _, s := range shards {
		load[a[s.ID]]++
	}
	for _, n := range nodes {
		if load[n] != 4 {
			t.Fatalf("%s is origin of %d shards, want 4 (%v)", n, load[n], load)
		}
	}
	// Unequal shards (files with a short tail) balance by bytes: no node
	// more than one shard above the fair share.
	uneven := []ShardSize{{"r/a#0", 32}, {"r/a#1", 8}, {"r/b#0", 32}, {"r/b#1", 8}}
	bytes := map[string]int64{}
	for id, n := range AssignOrigins(uneven, nodes[:3]) {
		for _, s := range uneven {
			if s.ID == id {
				bytes[n] += s.Size
			}
		}
	}
	for n, b := range bytes {
		if b > 80/3+32 {
			t.Fatalf("%s reads %d of 80 bytes (%v)", n, b, bytes)
		}
	}
	// Another node, with the members listed in another order, agrees.
	shuffled := slices.Clone(nodes)
	slices.Reverse(shuffled)
	if b := AssignOrigins(shards, append(shuffled, "h3")); !maps.Equal(a, b) {
		t.Fatal("assignment depends on member order")
	}
	// A node leaving moves its own shards and few others.
	c := AssignOrigins(shards, nodes[1:])
	moved := 0
	for _, s := range shards {
		id := s.ID
		if a[id] != "h0" && c[id] != a[id] {
			moved++
		}
		if c[id] == "h0" {
			t.Fatal("departed node still an origin")
		}
	}
	if moved > len(shards)/4 {
		t.Fatalf("%d shards not owned by the departed node moved", moved)
	}
}

func TestOriginRank(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	plain := Origin("s", nodes)
	for _, assigned := range append(slices.Clone(nodes), "gone") {
		rank := OriginRank("s", assigned, nodes)
		if len(rank) != len(nodes) {
			t.Fatalf("rank %v", rank)
		}
		want := plain
		if slices.Contains(nodes, assigned) {
			want = append([]string{assigned}, slices.DeleteFunc(slices.Clone(plain), func(n string) bool { return n == assigned })...)
		}
		if !slices.Equal(rank, want) {
			t.Fatalf("assigned %s: rank %v, want %v", assigned, rank, want)
		}
	}
}
