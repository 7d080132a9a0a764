package gossip

import (
	"bytes"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A member's peer key is pinned to its name on first sight: metadata that
// announces another key while the member is in the fleet is refused (the
// first key stays, the refusal is counted), and only a member that was
// gone (dead or left) and joins again may bring a new one (a reinstalled
// node).
func TestPeerKeyPinnedToName(t *testing.T) {
	n := fuzzNode(t)
	ev := (*events)(n)
	first, second, third := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32), bytes.Repeat([]byte{3}, 32)
	node := func(key []byte) *memberlist.Node {
		b, err := encodeMeta(RoleNode, Meta{PeerAddr: "10.0.0.9:7947", PeerKey: key})
		if err != nil {
			t.Fatal(err)
		}
		return &memberlist.Node{Name: "c", Addr: []byte{10, 0, 0, 9}, Port: 7946, Meta: b}
	}
	conflicts := func() float64 { return testutil.ToFloat64(n.met.dropped.WithLabelValues(dropKeyChange)) }

	if n.PeerKey("c") != nil {
		t.Fatal("a key for a member never seen")
	}
	ev.NotifyJoin(node(first))
	if !bytes.Equal(n.PeerKey("c"), first) {
		t.Fatalf("after join: %x", n.PeerKey("c"))
	}
	ev.NotifyUpdate(node(second)) // a member (or someone using its name) changing keys
	if !bytes.Equal(n.PeerKey("c"), first) || conflicts() != 1 {
		t.Fatalf("after a key change: key %x, conflicts %v", n.PeerKey("c"), conflicts())
	}
	for _, m := range n.Members() {
		if m.Name == "c" && !bytes.Equal(m.Meta.PeerKey, first) {
			t.Fatalf("Members lists key %x", m.Meta.PeerKey)
		}
	}
	ev.NotifyUpdate(node(nil)) // nor does dropping the key unpin it
	if !bytes.Equal(n.PeerKey("c"), first) || conflicts() != 2 {
		t.Fatalf("after a keyless update: key %x, conflicts %v", n.PeerKey("c"), conflicts())
	}
	ev.NotifyLeave(node(first))
	if n.PeerKey("c") != nil {
		t.Fatal("a key for a dead member")
	}
	ev.NotifyJoin(node(third)) // back from the dead, reinstalled
	if !bytes.Equal(n.PeerKey("c"), third) || conflicts() != 2 {
		t.Fatalf("after rejoining: key %x, conflicts %v", n.PeerKey("c"), conflicts())
	}
}
