package p2p

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Origin ranks nodes for a shard by rendezvous (highest random weight)
// hashing. The first node is the shard's origin, the one that reads it from
// S3; when it leaves, the next one takes over. Every node computes the same
// ranking from the same member list, origins spread evenly, and removing a
// node only moves the shards it was origin of. Duplicates are dropped.
func Origin(shardID string, nodes []string) []string {
	type scored struct {
		node  string
		score uint64
	}
	s := make([]scored, 0, len(nodes))
	seen := make(map[string]bool, len(nodes))
	d := xxhash.New()
	for _, n := range nodes {
		if seen[n] {
			continue
		}
		seen[n] = true
		d.Reset()
		_, _ = d.WriteString(shardID)
		_, _ = d.Write([]byte{0})
		_, _ = d.WriteString(n)
		s = append(s, scored{n, mix64(d.Sum64())})
	}
	slices.SortFunc(s, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.node, b.node)
	})
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.node
	}
	return out
}

// mix64 is the splitmix64 finalizer: it spreads xxhash outputs of inputs that
// differ only in a short suffix over the whole 64-bit range.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
