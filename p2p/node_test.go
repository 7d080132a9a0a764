package p2p

import (
	"bytes"
	"crypto/ed25519"
	"testing"
	"time"
)

func TestBanExpires(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n, err := NewNode(Config{NodeID: "n", ClusterKey: testKey, BanDuration: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	peer, other := ed25519.PublicKey(bytes.Repeat([]byte{1}, 32)), ed25519.PublicKey(bytes.Repeat([]byte{2}, 32))
	n.Ban(peer)
	steps := []struct {
		after  time.Duration
		banned bool
	}{{0, true}, {59 * time.Second, true}, {time.Second, false}, {time.Hour, false}}
	for _, s := range steps {
		now = now.Add(s.after)
		if got := n.Banned(peer); got != s.banned {
			t.Fatalf("at +%v banned=%v, want %v", s.after, got, s.banned)
		}
	}
	if n.Banned(other) || n.Stats().PeersBanned != 1 {
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
