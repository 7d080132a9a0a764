package p2p

import (
	"bufio"
	"context"
	"net"
	"sync"
	"time"
)

// Every member connection costs both ends a TLS and an identity handshake,
// the most CPU a warming fleet spends on anything but the bytes. So a
// connection outlives the exchange it was dialed for, and carries the next
// one to the same member: a manifest ask, a subscription the member
// answered "not open here" (the fetch asks again a PeerRefresh later), or
// a subscription the downloader left once its shard was complete
// (msgUnsubscribe, which the member acknowledges once nothing more of that
// shard can follow). The member waits idleServe for the next exchange, and
// the dialer keeps the connection idleKeep (shorter, so it seldom reuses
// one the member is closing), at most idlePerAddr per address. A kept
// connection that fails its next exchange (the member closed it or
// restarted, or is of a version that serves one exchange per connection)
// is dropped and the exchange goes out on a new one. A waiting connection
// holds one of the member slots (Config.MaxConns), so at most idleConns of
// them wait at once: in a large fleet every follower of a node's shards
// talks to it, and the slots are for downloads first. Beyond that a member
// closes the connection after the exchange, as before. A kept connection
// is the one the handshake authenticated, and is reused only for the node
// it proved to be, while that node is not banned.
const (
	idleServe = 4 * time.Second
	idleKeep  = 2 * time.Second
	// idlePerAddr covers a daemon's shards fetched at once, each of which
	// may be told "not open here" by the same member.
	idlePerAddr = 8
	idleConns   = 64
)

// memberConn is an authenticated connection to a member.
type memberConn struct {
	c    net.Conn
	br   *bufio.Reader
	peer peerIdentity
	addr string
	idle *time.Timer // while kept: closes it once unused for idleKeep
}

// idlePool keeps the member connections of finished exchanges for the
// next ones.
type idlePool struct {
	mu   sync.Mutex
	idle map[string][]*memberConn // by address
}

// take returns a kept connection to addr, or nil.
func (p *idlePool) take(addr string) *memberConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for list := p.idle[addr]; len(list) > 0; list = p.idle[addr] {
		mc := list[len(list)-1]
		p.remove(mc)
		if mc.idle.Stop() {
			return mc
		}
		// Its timer fired and is closing it.
	}
	return nil
}

// put keeps mc for the next exchange with its address, or closes it when
// as many are kept already.
func (p *idlePool) put(mc *memberConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle[mc.addr]) >= idlePerAddr {
		mc.c.Close()
		return
	}
	p.idle[mc.addr] = append(p.idle[mc.addr], mc)
	mc.idle = time.AfterFunc(idleKeep, func() {
		p.mu.Lock()
		p.remove(mc)
		p.mu.Unlock()
		mc.c.Close()
	})
}

// remove forgets mc if kept; p.mu is held.
func (p *idlePool) remove(mc *memberConn) {
	list := p.idle[mc.addr]
	for i, k := range list {
		if k == mc {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(p.idle, mc.addr)
		return
	}
	p.idle[mc.addr] = list
}

// connect returns a connection to the member at addr, expected to be node
// want ("": any): a kept one if there is one, else a new one (kept false),
// which bufSize sizes the reader of.
func (n *Node) connect(ctx context.Context, addr, want string, bufSize int) (mc *memberConn, kept bool, err error) {
	for {
		mc := n.idle.take(addr)
		if mc == nil {
			break
		}
		if n.Banned(mc.peer.Key) || want != "" && mc.peer.ID != want {
			mc.c.Close()
			continue
		}
		return mc, true, nil
	}
	c, peer, err := (&fetch{n: n}).dial(ctx, addr, want)
	if err != nil {
		return nil, false, err
	}
	return &memberConn{c: c, br: bufio.NewReaderSize(c, bufSize), peer: peer, addr: addr}, false, nil
}

// serveMember answers a member's exchanges on an authenticated connection,
// one after another: manifest asks and shard subscriptions, each further
// one within idleServe of the last, while fewer than idleConns connections
// wait so. Anything else ends the connection.
func (n *Node) serveMember(ctx context.Context, c net.Conn, br *bufio.Reader, peer peerIdentity) {
	for first := true; ; first = false {
		if !first && !n.awaitExchange(c, br) {
			return
		}
		f, err := readFrame(br)
		_ = c.SetReadDeadline(time.Time{})
		if err != nil {
			if first {
				n.log.Info("p2p: bad subscribe", "peer", peer.ID, "err", err)
			}
			return
		}
		if !first && n.Banned(peer.Key) {
			return
		}
		var again bool
		switch f.typ {
		case msgGetManifest, msgWaitManifest:
			again = n.serveAsk(ctx, c, peer, f)
		case msgSubscribe:
			again = n.serveShard(ctx, c, br, peer, f)
		default:
			n.log.Info("p2p: unexpected frame from member", "peer", peer.ID, "type", f.typ)
		}
		if !again {
			return
		}
	}
}

// awaitExchange waits up to idleServe for the member's next exchange to
// begin, holding one of the idleConns slots meanwhile; false when none is
// free or nothing came. The read deadline stays set for the frame.
func (n *Node) awaitExchange(c net.Conn, br *bufio.Reader) bool {
	select {
	case n.idleWait <- struct{}{}:
	default:
		return false // enough connections wait already
	}
	defer func() { <-n.idleWait }()
	_ = c.SetReadDeadline(n.cfg.Now().Add(idleServe))
	_, err := br.Peek(1)
	return err == nil
}
