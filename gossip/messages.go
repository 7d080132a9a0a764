package gossip

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/warmfleet/warmfleet/desired"
)

// nextVersionLocked returns a version above every earlier one: wall
// milliseconds shifted left 16 bits, so versions stay ordered across restarts
// (a restarted node must not restart at 1 while others hold its old record)
// and the version lag metric can be read in time.
func (n *Node) nextVersionLocked() uint64 {
	v := uint64(n.now().UnixMilli()) << 16
	if v <= n.lastVersion {
		v = n.lastVersion + 1
	}
	n.lastVersion = v
	return v
}

// SetLocalInventory publishes this node's inventory. Changes in what is held
// or its state are broadcast at once; changes in byte counts and free space
// only wait for the next progress flush (Tuning.ProgressInterval).
func (n *Node) SetLocalInventory(inv Inventory) error {
	if err := inv.Validate(); err != nil {
		return fmt.Errorf("gossip: inventory: %w", err)
	}
	inv = inv.Clone()
	if inv.Labels == nil {
		inv.Labels = maps.Clone(n.cfg.Labels)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	rec := invRecord{Node: n.cfg.NodeName, Version: n.nextVersionLocked(), Updated: n.now().UnixMilli(), Inv: &inv}
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode %s: %w", msgInventory, err)
	}
	// The daemon publishes its progress every second and on every
	// reconcile, and most calls only wait for the next flush: compressing
	// (a fresh DEFLATE writer's tables each time) only to learn the size
	// would be wasted, since the framed message is never longer than its
	// JSON and header. Compress to check a record that large, or to send.
	var full []byte
	if headerLen+len(body) > maxInventoryBytes {
		if full = frameMsg(msgInventory, body); len(full) > maxInventoryBytes {
			return fmt.Errorf("gossip: inventory encodes to %d bytes, at most %d", len(full), maxInventoryBytes)
		}
	}
	prev := n.self.Inv
	n.self = rec
	if prev != nil && progressOnly(*prev, inv) && n.now().Sub(n.sentAt) < n.tun.ProgressInterval {
		return nil
	}
	if full == nil {
		full = frameMsg(msgInventory, body)
	}
	n.broadcastSelfLocked(full)
	return nil
}

// broadcastSelfLocked queues this node's current record, or only its
// version when the record does not fit a packet.
func (n *Node) broadcastSelfLocked(full []byte) {
	msg := full
	if msg == nil || len(msg) > n.tun.MaxBroadcastBytes {
		var err error
		if msg == nil {
			msg, err = encodeMsg(msgInventory, n.self)
		}
		if err == nil && len(msg) > n.tun.MaxBroadcastBytes {
			msg, err = encodeMsg(msgInventory, invRecord{Node: n.self.Node, Version: n.self.Version, Updated: n.self.Updated})
		}
		if err != nil {
			n.log.Error("gossip: encode own inventory", "err", err)
			return
		}
	}
	n.queue.QueueBroadcast(&broadcast{name: "i/" + n.self.Node, msg: msg})
	n.sentVersion, n.sentAt = n.self.Version, n.now()
	n.noteRecentLocked(n.self.Node, n.self.Version)
}

// queueSpec broadcasts a desired-state record (called under the
// desired.State lock, in write order).
func (n *Node) queueSpec(r desired.Record) {
	msg, err := encodeMsg(msgSpecs, specsMsg{Records: []desired.Record{r}})
	if err != nil {
		n.log.Error("gossip: encode spec record", "key", r.Key, "err", err)
		return
	}
	if len(msg) > n.tun.MaxBroadcastBytes {
		// Push/pull carries it; specs are bounded well below this in practice.
		n.log.Warn("gossip: spec record too large to broadcast; it spreads by anti-entropy", "key", r.Key, "bytes", len(msg))
		return
	}
	n.queue.QueueBroadcast(&broadcast{name: "s/" + r.Key, msg: msg})
}

// handleMessage processes one message from NotifyMsg. raw may be reused by
// memberlist after return; nothing keeps it without copying.
func (n *Node) handleMessage(raw []byte) {
	t, p, err := decodeFrame(raw, maxStreamPayload)
	if err != nil {
		n.dropped(err)
		return
	}
	if (t == msgSpecs || t == msgInventory || t == msgBye || t == msgDigest) && len(p) > maxPacketPayload {
		n.met.drop(dropOversize)
		return
	}
	n.met.received.WithLabelValues(t.String()).Inc()
	switch t {
	case msgSpecs:
		m, err := decodeSpecs(p)
		if err != nil {
			n.dropped(err)
			return
		}
		if n.desired == nil {
			return
		}
		applied, bad, err := n.desired.Merge(context.Background(), m.Records)
		n.met.dropped.WithLabelValues(dropInvalid).Add(float64(bad))
		if err != nil {
			n.log.Error("gossip: save desired state", "err", err)
			return
		}
		for _, r := range applied {
			n.queueSpec(r) // pass it on: broadcasts spread epidemically
		}
	case msgInventory:
		rec, err := decodeInventory(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.applyInventory(rec, bytes.Clone(raw))
	case msgBye:
		b, err := decodeBye(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.applyBye(b.Node, bytes.Clone(raw))
	case msgWant:
		w, err := decodeWant(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.enqueue(job{to: w.From, give: w.Nodes, packet: w.Packet})
	case msgDigest:
		m, err := decodeDigest(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.applyDigest(m)
	case msgInventories:
		m, err := decodeInventories(p)
		if err != nil {
			n.dropped(err)
			return
		}
		for _, r := range m.Records {
			if err := r.validate(); err != nil || r.Inv == nil {
				n.met.drop(dropInvalid)
				continue
			}
			n.applyInventory(r, nil)
		}
	case msgKeyOp:
		m, err := decodeKeyOp(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.handleKeyOp(m)
	case msgKeyAck:
		a, err := decodeKeyAck(p)
		if err != nil {
			n.dropped(err)
			return
		}
		n.handleKeyAck(a)
	default:
		n.met.drop(dropUnexpected)
	}
}

func (n *Node) dropped(err error) {
	reason := dropDecode
	switch {
	case errors.Is(err, errOversize):
		reason = dropOversize
	case errors.Is(err, errInvalid):
		reason = dropInvalid
	}
	n.met.drop(reason)
	n.log.Debug("gossip: dropped message", "reason", reason, "err", err)
}

// applyInventory merges a peer's record. forward, when not nil, is the
// broadcast as received, passed on if the record was news.
func (n *Node) applyInventory(rec invRecord, forward []byte) {
	if rec.Node == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	p := n.peers[rec.Node]
	if p == nil || p.state != MemberAlive {
		// Unknown or departed: its records must not come back through stale
		// gossip. Anti-entropy brings it once memberlist admits the node.
		n.mu.Unlock()
		return
	}
	if n.onRumor != nil && forward != nil {
		n.onRumor(rec.Node, rec.Version)
	}
	p.announced = max(p.announced, rec.Version)
	if p.rec != nil && rec.Version <= p.rec.Version {
		n.mu.Unlock()
		return
	}
	if rec.Inv == nil {
		want := n.markWantLocked(rec.Node, rec.Version)
		n.mu.Unlock()
		if forward != nil {
			n.queue.QueueBroadcast(&broadcast{name: "i/" + rec.Node, msg: forward})
		}
		if want {
			n.enqueue(job{to: rec.Node, want: []string{rec.Node}})
		}
		return
	}
	stored := rec
	p.rec = &stored
	if forward != nil {
		// Only what spread as a rumor is advertised in digests: records
		// fetched or merged by anti-entropy are already that path's job,
		// and a mass join would otherwise turn every push/pull into
		// digests and pulls.
		n.noteRecentLocked(rec.Node, rec.Version)
	}
	hook := n.onInventory
	n.mu.Unlock()
	if forward != nil {
		n.queue.QueueBroadcast(&broadcast{name: "i/" + rec.Node, msg: forward})
	}
	n.notifyChange()
	if hook != nil {
		hook(rec.Node, rec.Version)
	}
}

// applyBye marks a member as leaving (or, if its departure was already
// seen, as left) and passes the news on once.
func (n *Node) applyBye(name string, forward []byte) {
	if name == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	p := n.peers[name]
	news := p != nil && !p.leaving
	if news {
		p.leaving = true
		if p.state == MemberDead {
			p.state = MemberLeft
		}
	}
	n.mu.Unlock()
	if news {
		n.queue.QueueBroadcast(&broadcast{name: "b/" + name, msg: forward})
		n.notifyChange()
	}
}
