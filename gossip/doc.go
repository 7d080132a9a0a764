// Package gossip keeps the fleet's shared view without a central server:
// membership (hashicorp/memberlist), each node's cache inventory, and it
// carries the fleet-wide desired state (cache specs).
//
// The desired state is package desired's: a last-writer-wins map keyed by
// spec key, ordered by a hybrid logical clock; deletes are tombstones that
// expire after a TTL. It works on its own (a single daemon without gossip
// keeps its specs in bbolt) and, when a Node is started with it
// (Config.Desired), travels in broadcasts and push/pull.
//
// Inventory is owned by each node and versioned by that node alone, so merges
// keep the highest version per node. Small records ride memberlist broadcasts;
// a record too big for one packet is announced by a version bump and fetched
// over a reliable stream. Push/pull anti-entropy carries the desired state,
// the sender's own inventory and a digest of every inventory version it holds,
// and the receiver fetches what it lacks.
//
// A member's metadata (Meta) also carries its swarm identity key. The first
// key seen for a name is pinned to it: metadata announcing another is
// refused and counted (dropped, reason key_change) unless the member comes
// back after it left or was declared dead, and Node.PeerKey gives the swarm
// the pinned key, so a member cannot pass itself off as another there.
package gossip
