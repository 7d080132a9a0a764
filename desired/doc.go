// Package desired owns the fleet-wide desired state: the set of cache specs
// (models and images) every node should hold, as a last-writer-wins map keyed
// by spec key and ordered by a hybrid logical clock (Timestamp). Deletes are
// tombstones that expire after a TTL; a node out of touch for longer than the
// TTL comes back in stale mode so that it cannot resurrect a deleted spec
// (see State). The map persists through a Store; BoltStore keeps it in a
// bucket of the daemon's bbolt database.
//
// Clocks need not agree: a peer's timestamp moves this node's clock forward
// by at most MaxClockDrift, and a local write to a key always stamps a time
// later than the record it replaces, so an edit made later on a node whose
// clock is behind still wins. A record stamped more than MaxFuture ahead of
// this node's clock is refused and counted (RefusedFuture): merging it
// would carry that clock into every later write here.
//
// It works on its own: a daemon without gossip keeps its specs here. The
// gossip package carries it between nodes: it installs a hook for local
// writes (SetOnLocal) to broadcast them, merges peers' records (Merge) and
// exchanges full states in push/pull (Snapshot, MergeFull).
//
// It must not import the transport (gossip, hashicorp/memberlist), the daemon
// or anything above them: it knows specs, clocks and its store, nothing else.
package desired
