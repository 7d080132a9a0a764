package p2p

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"time"
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
		mc, kept, err := n.connect(ctx, addr, "", askBufSize)
		if err != nil {
			return nil, err
		}
		stop := context.AfterFunc(ctx, func() { mc.c.Close() })
		m, answered, err := n.ask(mc, shardID, wait)
		if stop() && answered {
			n.idle.put(mc)
		} else {
			mc.c.Close()
		}
		if !answered && kept && ctx.Err() == nil {
			continue // closed on the member's side meanwhile: ask on a new connection
		}
		return m, err
	}
}

// askBufSize is the reader size of a connection dialed for a manifest ask.
const askBufSize = 4096

// ask sends one manifest request on ac, held up to wait by the member, and
// reads the answer; answered is false when no whole answer came back (the
// connection is then unusable).
func (n *Node) ask(ac *memberConn, shardID string, wait time.Duration) (m *Manifest, answered bool, err error) {
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
