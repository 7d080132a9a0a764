package p2p

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"time"
)

// A follower asks its shard's origin for the manifest every poll until the
// origin has opened the shard, and a member that joins asks the others:
// on a fresh connection every ask costs a TLS and an identity handshake on
// both sides, which made most of a warming fleet's handshakes. So a member
// answers further asks on the connection an ask came in on, for
// askIdleServe after each answer, and FetchManifest keeps the connection
// after an answer for askIdleKeep (shorter, so it seldom reuses one the
// member is closing), at most askIdlePerAddr per address. A kept
// connection that fails its next ask (the member closed it or restarted,
// or is of a version that answers one ask per connection) is dropped and
// the ask goes out again on a new one. A waiting connection holds one of
// the member slots (Config.MaxConns), so at most askIdleConns of them wait
// at once: in a large fleet every follower of a node's shards asks it, and
// the slots are for downloads first. Beyond that a member closes the
// connection after the answer, as before.
const (
	askIdleServe   = 4 * time.Second
	askIdleKeep    = 2 * time.Second
	askIdlePerAddr = 2
	askIdleConns   = 32
)

// A follower that polls its origin learns that the shard opened up to a
// poll interval late, and every poll costs both sides a round trip and CPU
// (the manifest asks of a warming fleet were the most frequent messages on
// it). So a follower may ask a member to hold its ask until the shard opens
// there (WaitManifest): the answer then goes out as the shard opens. The
// member holds at most askWaitsMax asks at once, each at most askWaitMax
// (whatever the asker wants), and answers at once when it holds that many,
// as to a plain ask: a member that asks and never reads its answers, or a
// flood of asks, costs it a bounded number of waiting goroutines and member
// slots for a bounded time.
const (
	askWaitMax  = 5 * time.Second
	askWaitsMax = 64
)

// askConn is an authenticated connection manifest asks go out on.
type askConn struct {
	c    net.Conn
	br   *bufio.Reader
	peer peerIdentity
	addr string
	idle *time.Timer // while kept: closes it once unused for askIdleKeep
}

// askPool keeps the connections of answered asks for the next ones.
type askPool struct {
	mu   sync.Mutex
	idle map[string][]*askConn // by address
}

// take returns a kept connection to addr, or nil.
func (p *askPool) take(addr string) *askConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for list := p.idle[addr]; len(list) > 0; list = p.idle[addr] {
		ac := list[len(list)-1]
		p.remove(ac)
		if ac.idle.Stop() {
			return ac
		}
		// Its timer fired and is closing it.
	}
	return nil
}

// put keeps ac for the next ask to its address, or closes it when as many
// are kept already.
func (p *askPool) put(ac *askConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle[ac.addr]) >= askIdlePerAddr {
		ac.c.Close()
		return
	}
	p.idle[ac.addr] = append(p.idle[ac.addr], ac)
	ac.idle = time.AfterFunc(askIdleKeep, func() {
		p.mu.Lock()
		p.remove(ac)
		p.mu.Unlock()
		ac.c.Close()
	})
}

// remove forgets ac if kept; p.mu is held.
func (p *askPool) remove(ac *askConn) {
	list := p.idle[ac.addr]
	for i, k := range list {
		if k == ac {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(p.idle, ac.addr)
		return
	}
	p.idle[ac.addr] = list
}

// FetchManifest asks the member at addr for the manifest of a shard it
// holds complete (ErrInProgress if it is filling it, ErrNoManifest if it has
// not opened it). Members are authenticated, so the manifest is trusted as
// far as the cluster key is.
func (n *Node) FetchManifest(ctx context.Context, addr, shardID string) (*Manifest, error) {
	return n.askManifest(ctx, addr, shardID, 0)
}

// WaitManifest is FetchManifest where the member, if it has not opened the
// shard, answers once it opens it, or with ErrNoManifest after wait (at most
// askWaitMax; at once when it holds as many waiting asks as it allows).
func (n *Node) WaitManifest(ctx context.Context, addr, shardID string, wait time.Duration) (*Manifest, error) {
	return n.askManifest(ctx, addr, shardID, max(wait, 0))
}

func (n *Node) askManifest(ctx context.Context, addr, shardID string, wait time.Duration) (*Manifest, error) {
	if !validName(shardID) {
		return nil, fmt.Errorf("p2p: shard id %q is not valid", shardID)
	}
	for {
		ac := n.asks.take(addr)
		kept := ac != nil
		if kept && n.Banned(ac.peer.Key) {
			ac.c.Close()
			continue
		}
		if !kept {
			c, peer, err := (&fetch{n: n}).dial(ctx, addr, "")
			if err != nil {
				return nil, err
			}
			ac = &askConn{c: c, br: bufio.NewReader(c), peer: peer, addr: addr}
		}
		stop := context.AfterFunc(ctx, func() { ac.c.Close() })
		m, answered, err := n.ask(ac, shardID, wait)
		if stop() && answered {
			n.asks.put(ac)
		} else {
			ac.c.Close()
		}
		if !answered && kept && ctx.Err() == nil {
			continue // closed on the member's side meanwhile: ask on a new connection
		}
		return m, err
	}
}

// ask sends one manifest request on ac, held up to wait by the member, and
// reads the answer; answered is false when no whole answer came back (the
// connection is then unusable).
func (n *Node) ask(ac *askConn, shardID string, wait time.Duration) (m *Manifest, answered bool, err error) {
	wait = min(wait, askWaitMax)
	_ = ac.c.SetDeadline(n.cfg.Now().Add(n.cfg.StallTimeout + wait))
	typ, payload := msgGetManifest, []byte(shardID)
	if wait > 0 {
		typ, payload = msgWaitManifest, append(u32(int(wait/time.Millisecond)), shardID...)
	}
	if err := writeFrame(ac.c, typ, payload); err != nil {
		return nil, false, err
	}
	fr, err := readFrameMax(ac.br, maxManifestFrame)
	if err != nil {
		return nil, false, err
	}
	switch fr.typ {
	case msgNotFound:
		return nil, true, ErrNoManifest
	case msgInProgress:
		return nil, true, ErrInProgress
	case msgManifest:
	default:
		return nil, false, fmt.Errorf("%w: answer of type %d to a manifest request", errProtocol, fr.typ)
	}
	m, err = DecodeManifest(fr.payload)
	if err != nil {
		return nil, false, err
	}
	if m.ShardID != shardID {
		return nil, false, fmt.Errorf("%w: asked for shard %q, got %q", errProtocol, shardID, m.ShardID)
	}
	return m, true, nil
}

// serveManifests answers a member's manifest asks: the first one, then each
// further one it sends on the connection within askIdleServe of the last
// answer. Anything else ends the connection.
func (n *Node) serveManifests(ctx context.Context, c net.Conn, br *bufio.Reader, peer peerIdentity, f frame) {
	if !n.serveAsk(ctx, c, peer, f) {
		return
	}
	select {
	case n.askIdle <- struct{}{}:
		defer func() { <-n.askIdle }()
	default:
		return // enough connections wait for asks already
	}
	for {
		_ = c.SetReadDeadline(n.cfg.Now().Add(askIdleServe))
		f, err := readFrame(br)
		if err != nil || n.Banned(peer.Key) || !n.serveAsk(ctx, c, peer, f) {
			return
		}
	}
}

// serveAsk answers one manifest ask frame, and reports whether the
// connection may carry another.
func (n *Node) serveAsk(ctx context.Context, c net.Conn, peer peerIdentity, f frame) bool {
	switch f.typ {
	case msgGetManifest:
		return n.serveManifest(ctx, c, peer.ID, string(f.payload), 0)
	case msgWaitManifest:
		if len(f.payload) < 4 {
			n.log.Info("p2p: bad manifest ask", "peer", peer.ID, "err", fmt.Errorf("%w: short frame type %d", errProtocol, f.typ))
			return false
		}
		wait := time.Duration(binary.BigEndian.Uint32(f.payload)) * time.Millisecond
		return n.serveManifest(ctx, c, peer.ID, string(f.payload[4:]), min(wait, askWaitMax))
	}
	return false
}

// awaitShard returns the shard served under id, waiting up to wait for it
// to open when it is not, unless askWaitsMax asks wait already (nil: not
// open here). The end of ctx (Serve's) ends the wait.
func (n *Node) awaitShard(ctx context.Context, id string, wait time.Duration) *Shard {
	n.mu.Lock()
	s, opened := n.shards[id], n.opened
	n.mu.Unlock()
	if s != nil || wait <= 0 {
		return s
	}
	select {
	case n.askWaits <- struct{}{}:
		defer func() { <-n.askWaits }()
	default:
		return nil // enough asks wait: answer this one at once
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-opened:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		}
		n.mu.Lock()
		s, opened = n.shards[id], n.opened
		n.mu.Unlock()
		if s != nil {
			return s
		}
	}
}
