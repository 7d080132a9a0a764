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

// ShardSize names a shard and its length, for AssignOrigins.
type ShardSize struct {
	ID   string
	Size int64
}

// AssignOrigins picks one origin per shard so that the S3 reads spread as
// evenly as the sizes allow: shards are taken in the order given, and each
// goes to the first node in its Origin ranking whose assigned bytes are still
// below the fair share (total / nodes), so no node ends more than one shard
// above it. Plain rendezvous leaves some nodes with several times the mean
// (7 of 32 shards where 4 is fair, seen in the 8-host bench), and the busiest
// origin's S3 reads then set the pace of the whole fleet. Every node that
// sees the same shards and members computes the same assignment; a
// membership change moves the departed node's shards and, through the
// bound, a few others.
func AssignOrigins(shards []ShardSize, nodes []string) map[string]string {
	out := make(map[string]string, len(shards))
	nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
	if len(nodes) == 0 {
		return out
	}
	var total int64
	for _, s := range shards {
		total += max(s.Size, 1)
	}
	load := make(map[string]int64, len(nodes))
	for _, s := range shards {
		if _, dup := out[s.ID]; dup {
			continue
		}
		// Some node is always below the mean while shards remain, so
		// every shard gets an origin.
		for _, n := range Origin(s.ID, nodes) {
			if load[n]*int64(len(nodes)) < total {
				out[s.ID] = n
				load[n] += max(s.Size, 1)
				break
			}
		}
	}
	return out
}

// OriginRank is Origin with the shard's assigned origin first, when it is
// one of nodes: the order in which nodes take over a shard's S3 reads.
func OriginRank(shardID, assigned string, nodes []string) []string {
	rank := Origin(shardID, nodes)
	if i := slices.Index(rank, assigned); i > 0 {
		copy(rank[1:i+1], rank[:i])
		rank[0] = assigned
	}
	return rank
}
