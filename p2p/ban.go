package p2p

import (
	"crypto/ed25519"
	"errors"
	"fmt"
)

// Who a peer is: every member holds the cluster key, so the cluster key
// proves membership but not which member. The handshake has each side sign
// with its identity key, and the node ID it gives counts only if that key
// is the one the ID is pinned to: by the fleet (KeyDirectory, from gossip)
// or, without one, by this node on first sight. Bans and the one-
// connection-per-peer rule then hold the proven identity key, never a name
// or an address a peer can claim: a member that names another cannot get
// it banned or take its place, and honest nodes sharing an address (a NAT,
// one host) are told apart.

// KeyDirectory says which identity key the fleet knows each node by.
type KeyDirectory interface {
	// PeerKey returns the identity key pinned to nodeID, or nil when none
	// is (not a member, or not heard of yet).
	PeerKey(nodeID string) []byte
}

// trustPeer decides whether a peer that proved identity key p.Key may go
// by node ID p.ID.
func (n *Node) trustPeer(p peerIdentity) error {
	if p.ID == n.cfg.NodeID {
		if !p.Key.Equal(n.PublicKey()) {
			return fmt.Errorf("%w: %s uses this node's own ID", ErrIdentity, p)
		}
		return nil // ourselves, through our own address
	}
	var want []byte
	if n.cfg.PeerKeys != nil {
		if want = n.cfg.PeerKeys.PeerKey(p.ID); want == nil {
			return fmt.Errorf("%w: the fleet knows no node %q with a key (not a member, or not heard of yet)", ErrUnauthenticated, p.ID)
		}
	} else {
		n.mu.Lock()
		pinned, ok := n.pins[p.ID]
		if !ok {
			n.pins[p.ID] = p.Key
		}
		n.mu.Unlock()
		if !ok {
			return nil
		}
		want = pinned
	}
	if !p.Key.Equal(ed25519.PublicKey(want)) {
		return fmt.Errorf("%w: %s, but %q is known by %s", ErrIdentity, p, p.ID, keyString(want))
	}
	return nil
}

// countRefusal counts a failed handshake under its cause.
func (n *Node) countRefusal(err error) {
	switch {
	case errors.Is(err, ErrIdentity):
		n.c.identity.Add(1)
	case errors.Is(err, ErrUnauthenticated):
		n.c.authFail.Add(1)
	}
}

// banPeer bans a peer for bad data, by the identity key it proved.
func (n *Node) banPeer(p peerIdentity) {
	n.Ban(p.Key)
}
