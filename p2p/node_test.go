package p2p

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestBanExpires(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n, err := NewNode(Config{NodeID: "n", ClusterKey: testKey, BanDuration: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	n.Ban("peer")
	steps := []struct {
		after  time.Duration
		banned bool
	}{{0, true}, {59 * time.Second, true}, {time.Second, false}, {time.Hour, false}}
	for _, s := range steps {
		now = now.Add(s.after)
		if got := n.Banned("peer"); got != s.banned {
			t.Fatalf("at +%v banned=%v, want %v", s.after, got, s.banned)
		}
	}
	if n.Banned("other") || n.Stats().PeersBanned != 1 {
		t.Fatalf("stats %+v", n.Stats())
	}
}

func TestNewNodeRejectsBadConfig(t *testing.T) {
	cases := map[string]Config{
		"short key":      {NodeID: "n", ClusterKey: []byte("short")},
		"no id":          {ClusterKey: testKey},
		"negative limit": {NodeID: "n", ClusterKey: testKey, UploadLimit: -1},
	}
	for name, c := range cases {
		if _, err := NewNode(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A ban is kept under the peer's host address: the banned member coming
// back from another port under another name is still refused, and a member
// claiming the banned one's name from another host is not (it cannot get an
// honest member banned by naming it). On loopback, where every node shares
// the address, the node ID is the key.
func TestBanKeyedByHost(t *testing.T) {
	n, err := NewNode(Config{NodeID: "n", ClusterKey: testKey, BanDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	n.banPeer(tcp("10.1.2.3:7947"), "bad")
	for _, c := range []struct {
		remote, id string
		want       bool
	}{
		{"10.1.2.3:7947", "bad", true},
		{"10.1.2.3:40001", "bad-renamed", true},
		{"[::ffff:10.1.2.3]:7950", "other", true},
		{"10.1.2.4:7947", "bad", false},
		{"127.0.0.1:7947", "good", false},
	} {
		if got := n.peerBanned(tcp(c.remote), c.id); got != c.want {
			t.Errorf("peerBanned(%s, %q) = %v, want %v", c.remote, c.id, got, c.want)
		}
	}
	if !n.addrBanned("10.1.2.3:7999") || n.addrBanned("10.1.2.4:7947") || n.addrBanned("node-a:7947") {
		t.Error("addrBanned: want the banned host refused before dialing, others (and names) not")
	}
	n.banPeer(tcp("127.0.0.1:5000"), "lb-bad")
	if !n.peerBanned(tcp("127.0.0.1:6000"), "lb-bad") || n.peerBanned(tcp("127.0.0.1:5000"), "lb-good") || n.addrBanned("127.0.0.1:5000") {
		t.Error("on loopback the ban must follow the node ID, not the shared address")
	}
	if got := n.Stats().PeersBanned; got != 2 {
		t.Errorf("PeersBanned = %d, want 2", got)
	}
}
