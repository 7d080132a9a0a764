package gossip

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate and events adapt Node to memberlist's callback interfaces
// without exporting the callbacks on Node.
type (
	delegate Node
	events   Node
)

func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}
func (d *delegate) NotifyMsg(b []byte) { (*Node)(d).handleMessage(b) }
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.onBroadcastRoom != nil && d.queue.NumQueued() > 0 {
		d.onBroadcastRoom(limit)
	}
	return d.queue.GetBroadcasts(overhead, limit)
}
func (d *delegate) LocalState(bool) []byte              { return (*Node)(d).localState() }
func (d *delegate) MergeRemoteState(buf []byte, _ bool) { (*Node)(d).mergeState(buf) }

// Event callbacks run under memberlist's node lock: they must not call back
// into memberlist, and they hand stream work to the workers.
func (e *events) NotifyJoin(mn *memberlist.Node) {
	n := (*Node)(e)
	n.alive.Add(1)
	n.mu.Lock()
	p := n.peers[mn.Name]
	if p == nil {
		p = &peer{}
		n.peers[mn.Name] = p
	}
	rejoined := p.state == MemberDead || p.state == MemberLeft
	p.state, p.departed, p.leaving = MemberAlive, time.Time{}, false
	p.setAddr(mn)
	n.setMetaLocked(p, mn, rejoined)
	n.mu.Unlock()
	n.log.Debug("gossip: member joined", "member", mn.Name, "rejoined", rejoined)
	if rejoined && mn.Name != n.cfg.NodeName {
		n.enqueue(job{to: mn.Name, want: []string{mn.Name}})
	}
	n.notifyChange()
}

func (e *events) NotifyLeave(mn *memberlist.Node) {
	n := (*Node)(e)
	n.alive.Add(-1)
	n.mu.Lock()
	p := n.peers[mn.Name]
	if p == nil {
		p = &peer{}
		n.peers[mn.Name] = p
	}
	// memberlist does not tell a leave from a death (Node.State is never
	// set); a leaving node says goodbye first.
	p.state = MemberDead
	if p.leaving {
		p.state = MemberLeft
	}
	p.rec, p.announced, p.departed = nil, 0, n.now()
	p.setAddr(mn)
	delete(n.wants, mn.Name)
	state := p.state
	n.mu.Unlock()
	// A member that said goodbye left on purpose (a restart, a stop of the
	// fleet) and this node's own leave is no news: only a death is worth
	// an operator's line. Neither is a death seen while this node is itself
	// closing: when a whole fleet stops, a peer's goodbye can miss a node
	// that is already leaving, and that node will not act on the news.
	level := slog.LevelInfo
	if state == MemberLeft || mn.Name == n.cfg.NodeName || n.closed.Load() {
		level = slog.LevelDebug
	}
	n.log.Log(context.Background(), level, "gossip: member gone", "member", mn.Name, "state", state)
	n.notifyChange()
}

func (e *events) NotifyUpdate(mn *memberlist.Node) {
	n := (*Node)(e)
	n.mu.Lock()
	if p := n.peers[mn.Name]; p != nil {
		p.setAddr(mn)
		n.setMetaLocked(p, mn, false)
	}
	n.mu.Unlock()
	n.notifyChange()
}

func (p *peer) setAddr(mn *memberlist.Node) {
	p.ip, p.port = slices.Clone(mn.Addr), mn.Port
	p.addr = net.JoinHostPort(p.ip.String(), strconv.Itoa(int(p.port)))
}

// setMetaLocked takes a member's metadata, keeping the peer key pinned to
// its name: the first one seen wins, and a member announcing another is
// refused (its old key stays, the change is counted) unless it comes back
// from dead or left (rejoined; a reinstalled node has a new key).
func (n *Node) setMetaLocked(p *peer, mn *memberlist.Node, rejoined bool) {
	role, meta, err := decodeMeta(mn.Meta)
	if err != nil {
		// Keep the member (memberlist admitted it) but never target it.
		n.met.drop(dropInvalid)
		n.log.Warn("gossip: member has unreadable metadata", "member", mn.Name, "err", err)
		p.role, p.meta = "", Meta{}
		return
	}
	meta.PeerKey = pinKey(p, meta.PeerKey, rejoined)
	if p.keyConflict {
		p.keyConflict = false
		n.met.drop(dropKeyChange)
		n.log.Warn("gossip: member announced another peer key; keeping the one pinned to its name (a node changes keys only after it left the fleet or was declared dead)", "member", mn.Name)
	}
	p.role, p.meta = role, meta
}

// pinKey decides the peer key a member goes by when it announces key:
// the pinned one, or key if nothing is pinned yet or the member rejoined.
// A different key is a conflict (p.keyConflict), and loses.
func pinKey(p *peer, key []byte, rejoined bool) []byte {
	switch {
	case len(key) != 0 && (p.pinned == nil || rejoined):
		p.pinned = bytes.Clone(key)
	case p.pinned != nil && !bytes.Equal(key, p.pinned):
		p.keyConflict = true
	}
	return bytes.Clone(p.pinned)
}

// broadcast is one queued message; a newer one with the same name replaces
// it in the queue.
type broadcast struct {
	name string
	msg  []byte
}

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*broadcast)
	return ok && ob.name == b.name
}
func (b *broadcast) Name() string    { return b.name }
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}

// memberlistLogger routes memberlist's log lines to slog by their prefix.
// Once the node is closing (closed) every line is debug: memberlist's own
// goroutines race its Shutdown and outlive it (a probe in flight runs to
// its timeout), and what they report then (a send on the socket just
// closed, a peer that "answered over TCP but not UDP") is part of the
// stop, not a fault.
type memberlistLogger struct {
	log    *slog.Logger
	closed *atomic.Bool
}

func newMemberlistLogger(l *slog.Logger, closed *atomic.Bool) *log.Logger {
	return log.New(memberlistLogger{l, closed}, "", 0)
}

func (w memberlistLogger) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelWarn, "[ERROR]": slog.LevelWarn} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			msg, level = strings.TrimSpace(rest), l
			break
		}
	}
	if w.closed.Load() {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, msg)
	return len(p), nil
}
