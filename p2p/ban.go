package p2p

import (
	"net"
	"net/netip"
)

// Bans are kept under an identity the peer cannot change at will. Every
// member holds the cluster key, so the node ID a peer gives in the
// handshake is its own claim: a banned member could come back under another
// name (and port) and be trusted again, and a member claiming an honest
// member's ID would get that one banned in its place. The address a TCP
// connection comes from cannot be claimed that way, so a ban is kept under
// the peer's host address (IP, not port) and under nothing it said.
//
// On loopback every node of the machine shares the host address (a demo,
// a test), which then tells no node from another: there the ban falls back
// to the node ID, as the only name left.

// banKey is the identity a ban on the peer at remote (host:port, as the
// connection saw it), claiming id, is kept under.
func banKey(remote, id string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		// Not an IP address (a test's pipe): the ID is all there is.
		return id
	}
	ip := ap.Addr().Unmap()
	if ip.IsLoopback() {
		return id
	}
	return ip.String()
}

// banPeer bans the peer at remote claiming id.
func (n *Node) banPeer(remote net.Addr, id string) {
	n.Ban(banKey(addrString(remote), id))
}

// peerBanned reports whether the peer at remote claiming id is refused.
func (n *Node) peerBanned(remote net.Addr, id string) bool {
	return n.Banned(banKey(addrString(remote), id))
}

// addrBanned reports whether the host of addr (host:port, before dialing
// it) is refused; a name or a loopback address is known only once the
// handshake gave the peer's ID.
func (n *Node) addrBanned(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || ap.Addr().Unmap().IsLoopback() {
		return false
	}
	return n.Banned(ap.Addr().Unmap().String())
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
