package gossip

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/warmfleet/warmfleet/desired"
)

// Rumor + digest.
//
// An inventory change spreads as a rumor: memberlist piggybacks it on gossip
// packets and every node that learns it passes it on a bounded number of
// times (RetransmitMult*ceil(log10(N+1)), 9 at 256 nodes). Each transmission
// goes to one random member, so a node is missed by all ~9*N of them with
// probability about e^-9 per change: at 256 nodes one change in thirty
// leaves a node behind, and it only catches up at the next push/pull, which
// memberlist stretches to 8 s at that size. The rumor is also starved while
// memberlist's own broadcasts (joins, suspicions) fill the packets, since
// those go first.
//
// Tuning.DigestInterval > 0 turns on a repair for that ("rumor + digest"):
// each node also whispers, in its own small packet to one random member
// every DigestInterval (three times per change with the default window),
// the versions it learned in the last DigestWindow
// (after DigestDelay, by which time the rumor itself has mostly done its
// work). A member that is behind on one of them asks that sender for the
// record at once, in a packet, and gets it in a packet (the record was
// broadcast whole, so it fits). The digest names only (node, version)
// pairs, so it costs a few bytes per change; it is not sent at all when
// nothing changed.
//
// DigestDelay must cover most of the rumor's own spread (about half a second
// at 256 members): a digest that arrives before the rumor makes its receiver
// pull a record that was on its way anyway. Digests must also stay few: at
// one per member every 100ms for 2s (and pulls over streams), the extra
// packets swamped a 256-member in-process fleet into a suspicion storm, and
// at one per 250ms the benchmark fleet still did not recover from the
// broadcast starvation that follows its mass join (see the report of issue
// 4), so it is off by default until it is proven on a quieter machine or
// on real hosts.

// digestMsg lists recently changed inventory versions the sender holds.
type digestMsg struct {
	From    string            `json:"f"`
	Entries map[string]uint64 `json:"d"`
}

// maxDigestEntries bounds a digest: it rides one packet.
const maxDigestEntries = 512

func decodeDigest(p []byte) (digestMsg, error) {
	var m digestMsg
	if err := json.Unmarshal(p, &m); err != nil {
		return m, fmt.Errorf("digest: %w", err)
	}
	if err := desired.ValidateNodeName(m.From); err != nil {
		return m, fmt.Errorf("%w: digest: from: %w", errInvalid, err)
	}
	if len(m.Entries) == 0 || len(m.Entries) > maxDigestEntries {
		return m, fmt.Errorf("%w: digest: %d entries, want 1..%d", errInvalid, len(m.Entries), maxDigestEntries)
	}
	for n, v := range m.Entries {
		if err := desired.ValidateNodeName(n); err != nil {
			return m, fmt.Errorf("%w: digest: %w", errInvalid, err)
		}
		if v == 0 {
			return m, fmt.Errorf("%w: digest: node %q at version 0", errInvalid, n)
		}
	}
	return m, nil
}

// recentChange is an inventory version this node holds and advertises.
type recentChange struct {
	version uint64
	at      time.Time // when this node got it
}

// noteRecentLocked records that this node now holds node's record at
// version, for digests; nothing to do when they are off.
func (n *Node) noteRecentLocked(node string, version uint64) {
	if n.tun.DigestInterval <= 0 {
		return
	}
	n.recent[node] = recentChange{version: version, at: n.now()}
}

// pickDigest returns the entries to advertise now (learned between
// DigestWindow and DigestDelay ago, newest first, at most what fits a
// packet) and prunes expired ones. Pure apart from the pruning, so the
// policy is table-tested.
func pickDigest(recent map[string]recentChange, now time.Time, delay, window time.Duration, limit int) map[string]uint64 {
	type entry struct {
		node string
		recentChange
	}
	var es []entry
	for node, rc := range recent {
		age := now.Sub(rc.at)
		switch {
		case age > window:
			delete(recent, node)
		case age >= delay:
			es = append(es, entry{node, rc})
		}
	}
	if len(es) == 0 {
		return nil
	}
	slices.SortFunc(es, func(a, b entry) int { return b.at.Compare(a.at) })
	out := make(map[string]uint64, min(len(es), limit))
	for _, e := range es[:min(len(es), limit)] {
		out[e.node] = e.version
	}
	return out
}

// sendDigest whispers the recent versions to one random live member.
func (n *Node) sendDigest() {
	n.mu.Lock()
	entries := pickDigest(n.recent, n.now(), n.tun.DigestDelay, n.tun.DigestWindow, maxDigestEntries)
	var to *memberlist.Node
	if len(entries) > 0 {
		to = n.randomPeerLocked()
	}
	// The same entries go out many times in a row: encode them once.
	msg := n.digestMsg
	if to != nil && !maps.Equal(entries, n.digestFor) {
		msg = n.encodeDigestLocked(entries)
		n.digestFor, n.digestMsg = entries, msg
	}
	n.mu.Unlock()
	if to == nil || msg == nil {
		return
	}
	if err := n.ml.SendBestEffort(to, msg); err != nil {
		n.log.Debug("gossip: send digest", "to", to.Name, "err", err)
	}
}

// encodeDigestLocked encodes a digest, dropping the oldest entries until it
// fits a packet.
func (n *Node) encodeDigestLocked(entries map[string]uint64) []byte {
	for {
		msg, err := encodeMsgPlain(msgDigest, digestMsg{From: n.cfg.NodeName, Entries: entries})
		if err != nil {
			n.log.Error("gossip: encode digest", "err", err)
			return nil
		}
		if len(msg) <= n.tun.MaxBroadcastBytes || len(entries) <= 1 {
			return msg
		}
		entries = trimOldest(entries, len(entries)/2)
	}
}

// trimOldest keeps the keep highest versions (versions grow with time).
func trimOldest(entries map[string]uint64, keep int) map[string]uint64 {
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(entries[b], entries[a]), cmp.Compare(a, b))
	})
	out := make(map[string]uint64, keep)
	for _, name := range names[:keep] {
		out[name] = entries[name]
	}
	return out
}

// randomPeerLocked returns a random live member other than this node.
func (n *Node) randomPeerLocked() *memberlist.Node {
	var pick *peer
	var name string
	seen := 0
	for nm, p := range n.peers {
		if nm == n.cfg.NodeName || p.state != MemberAlive || p.ip == nil {
			continue
		}
		// Reservoir sampling: one pass, no slice.
		seen++
		if rand.IntN(seen) == 0 {
			pick, name = p, nm
		}
	}
	if pick == nil {
		return nil
	}
	return &memberlist.Node{Name: name, Addr: pick.ip, Port: pick.port}
}

// applyDigest asks the sender for every record it holds newer than ours.
func (n *Node) applyDigest(m digestMsg) {
	var want []string
	n.mu.Lock()
	if sender := n.peers[m.From]; m.From == n.cfg.NodeName || sender == nil || sender.state != MemberAlive {
		n.mu.Unlock()
		return
	}
	for name, v := range m.Entries {
		p := n.peers[name]
		if name == n.cfg.NodeName || p == nil || p.state != MemberAlive {
			continue
		}
		p.announced = max(p.announced, v)
		if (p.rec == nil || v > p.rec.Version) && n.markWantForLocked(name, v, 3*n.tun.DigestInterval) {
			want = append(want, name)
		}
	}
	n.mu.Unlock()
	if len(want) > 0 {
		slices.Sort(want)
		n.met.digestPulls.Add(float64(len(want)))
		n.enqueue(job{to: m.From, want: want, packet: true})
	}
}
