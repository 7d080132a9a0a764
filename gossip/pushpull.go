package gossip

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/warmfleet/warmfleet/desired"
)

type wantMark struct {
	version uint64
	retry   time.Time
}

// job is work for the stream workers, off memberlist's receive paths.
type job struct {
	to   string   // member to send to
	want []string // ask `to` for these members' inventories
	give []string // send `to` our copies of these members' inventories
	// packet: ask and answer in packets (the answer falls back to a stream
	// when it does not fit one). Digest pulls use it: they fetch records
	// that were broadcast whole, so they fit.
	packet bool
	send   []byte // a message to send `to` reliably
}

// markWantLocked records that we fetch node's inventory at version, unless
// a fetch of it is already under way.
func (n *Node) markWantLocked(node string, version uint64) bool {
	return n.markWantForLocked(node, version, n.tun.TCPTimeout)
}

// markWantForLocked is markWantLocked with the time after which a fetch
// that brought nothing may be retried: short for packets, which get lost.
func (n *Node) markWantForLocked(node string, version uint64, retry time.Duration) bool {
	now := n.now()
	if w, ok := n.wants[node]; ok && w.version >= version && now.Before(w.retry) {
		return false
	}
	n.wants[node] = wantMark{version: version, retry: now.Add(retry)}
	return true
}

func (n *Node) enqueue(j job) {
	select {
	case n.jobs <- j:
	default:
		n.met.drop(dropQueueFull)
	}
}

// worker runs stream sends, which block, off memberlist's receive paths.
func (n *Node) worker() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case j := <-n.jobs:
			n.runJob(j)
		}
	}
}

func (n *Node) runJob(j job) {
	if j.to == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	p := n.peers[j.to]
	var to *memberlist.Node
	if p != nil && p.state.member() {
		to = &memberlist.Node{Name: j.to, Addr: p.ip, Port: p.port}
	}
	n.mu.Unlock()
	if to == nil {
		return
	}
	if len(j.want) > 0 {
		msg, err := encodeMsg(msgWant, wantMsg{From: n.cfg.NodeName, Nodes: j.want, Packet: j.packet})
		switch {
		case err == nil && j.packet:
			err = n.ml.SendBestEffort(to, msg)
		case err == nil:
			err = n.ml.SendReliable(to, msg)
		}
		if err != nil {
			n.log.Debug("gossip: ask for inventories", "to", j.to, "err", err)
		}
	}
	if len(j.give) > 0 {
		n.sendInventories(to, j.give, j.packet)
	}
	if len(j.send) > 0 {
		if err := n.ml.SendReliable(to, j.send); err != nil {
			n.log.Debug("gossip: send", "to", j.to, "err", err)
		}
	}
}

// sendInventories sends our copies of the named members' records, in
// messages of bounded size.
func (n *Node) sendInventories(to *memberlist.Node, names []string, packet bool) {
	n.mu.Lock()
	var recs []invRecord
	for _, name := range names {
		if name == n.cfg.NodeName {
			recs = append(recs, n.self)
		} else if p := n.peers[name]; p != nil && p.state == MemberAlive && p.rec != nil {
			recs = append(recs, *p.rec)
		}
	}
	n.mu.Unlock()
	if packet && len(recs) > 0 {
		msg, err := encodeMsg(msgInventories, inventoriesMsg{Records: recs})
		if err == nil && len(msg) <= n.tun.MaxBroadcastBytes {
			if err := n.ml.SendBestEffort(to, msg); err != nil {
				n.log.Debug("gossip: send inventories", "to", to.Name, "err", err)
			}
			return
		}
	}
	const batch = 64
	for len(recs) > 0 {
		k := min(batch, len(recs))
		msg, err := encodeMsg(msgInventories, inventoriesMsg{Records: recs[:k]})
		recs = recs[k:]
		if err == nil {
			err = n.ml.SendReliable(to, msg)
		}
		if err != nil {
			n.log.Debug("gossip: send inventories", "to", to.Name, "err", err)
			return
		}
	}
}

// localState builds this node's push/pull state.
func (n *Node) localState() []byte {
	st := stateMsg{From: n.cfg.NodeName}
	if n.desired != nil {
		fs, err := n.desired.Snapshot(context.Background())
		if err != nil {
			n.log.Error("gossip: desired state snapshot", "err", err)
		} else {
			st.Desired, st.Records, st.Stale, st.Synced = true, fs.Records, fs.Stale, fs.Synced
		}
	}
	n.mu.Lock()
	self := n.self
	st.Self = &self
	st.Digest = make(map[string]uint64, len(n.peers)+1)
	st.Digest[n.cfg.NodeName] = self.Version
	for name, p := range n.peers {
		if p.state == MemberAlive && p.rec != nil {
			st.Digest[name] = p.rec.Version
		}
	}
	n.mu.Unlock()
	b, err := encodeMsg(msgState, st)
	if err != nil {
		n.log.Error("gossip: encode state", "err", err)
		return nil
	}
	return b
}

// mergeState merges a peer's push/pull state and asks it for what we lack.
func (n *Node) mergeState(buf []byte) {
	t, p, err := decodeFrame(buf, maxStreamPayload)
	if err == nil && t != msgState {
		err = fmt.Errorf("%w: push/pull carried a %s message", errInvalid, t)
	}
	var st stateMsg
	if err == nil {
		st, err = decodeState(p)
	}
	if err != nil {
		n.dropped(err)
		return
	}
	n.met.received.WithLabelValues(msgState.String()).Inc()
	// The sender's inventory first: a spec learned here must land with at
	// least one holder known, or a late node ranks itself first for every
	// shard and reads the origin.
	if st.Self != nil {
		n.applyInventory(*st.Self, nil)
	}
	if n.desired != nil && st.Desired {
		_, bad, err := n.desired.MergeFull(context.Background(), desired.FullState{Records: st.Records, Stale: st.Stale, Synced: st.Synced})
		n.met.dropped.WithLabelValues(dropInvalid).Add(float64(bad))
		if err != nil {
			n.log.Error("gossip: save desired state", "err", err)
		}
	}
	var want []string
	n.mu.Lock()
	for name, v := range st.Digest {
		p := n.peers[name]
		if name == n.cfg.NodeName || name == st.From || p == nil || p.state != MemberAlive {
			continue
		}
		p.announced = max(p.announced, v)
		if (p.rec == nil || v > p.rec.Version) && n.markWantLocked(name, v) {
			want = append(want, name)
		}
	}
	n.mu.Unlock()
	if len(want) > 0 {
		slices.Sort(want)
		n.enqueue(job{to: st.From, want: want})
	}
}
