package p2p

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// flipAll corrupts every byte of a seed's copy.
func flipAll(b []byte) {
	for i := range b {
		b[i] ^= 0x55
	}
}

// impostorFetch has x fetch m while offering only the impostor's address
// until x has refused or banned someone, then the honest node's too, so the
// impostor is certainly heard first.
func impostorFetch(t *testing.T, x *testNode, impostor, honest string, m *Manifest) {
	t.Helper()
	s, err := x.Open(context.Background(), m, filepath.Join(x.dir, "f2"), x.comp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	src := switchingPeers(func() bool { return refusedOrBanned(x.Stats()) }, impostor, honest)
	if _, err := s.Fetch(ctx, FetchOptions{Peers: src, PeerRefresh: 20 * time.Millisecond}); err != nil {
		t.Fatalf("fetch with an impostor about: %v (stats %+v)", err, x.Stats())
	}
}

func refusedOrBanned(s Stats) bool { return s.IdentityRefusals+s.PeersBanned > 0 }

// A member holding the cluster key that claims another member's node ID
// (the impostor, serving corrupt bytes) is refused in the handshake: it
// cannot take the honest node's place in the fetch, and the honest node is
// neither banned nor turned away. Before identity keys, the impostor's bad
// piece banned the name "honest", and the real one with it.
func TestImpostorClaimingAnotherIDIsRefused(t *testing.T) {
	data := randomData(t, 1<<20)
	m := manifestFor(t, data, 0, int64(len(data)), testPiece, SHA256)
	first := randomData(t, 256<<10)
	mFirst := manifestFor(t, first, 0, int64(len(first)), testPiece, SHA256)
	mFirst.ShardID = "test/first"

	honest := startNode(t, "honest", nil)
	seedNode(t, honest, data, m, nil)
	impostor := startNode(t, "honest", nil) // the same ID, its own key
	seedNode(t, impostor, data, m, flipAll)

	t.Run("pinned on first sight", func(t *testing.T) {
		x := startNode(t, "x", nil)
		// x meets the honest node first, over another shard.
		if err := os.WriteFile(filepath.Join(honest.dir, "first"), first, 0o644); err != nil {
			t.Fatal(err)
		}
		hs, err := honest.Open(context.Background(), mFirst, filepath.Join(honest.dir, "first"), honest.comp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hs.Recheck(context.Background()); err != nil || !hs.Complete() {
			t.Fatalf("recheck: %v", err)
		}
		s1, err := x.Open(context.Background(), mFirst, filepath.Join(x.dir, "first"), x.comp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s1.Fetch(context.Background(), FetchOptions{Peers: peers(honest.addr)}); err != nil {
			t.Fatal(err)
		}
		impostorFetch(t, x, impostor.addr, honest.addr, m)
		assertImpostorRefused(t, x, honest, m, data)
	})
	t.Run("pinned by the fleet", func(t *testing.T) {
		dir := keyDir{"honest": honest.PublicKey()}
		x := startNode(t, "y", func(c *Config) { c.PeerKeys = dir }) // honest pinned "x" to the first x
		impostorFetch(t, x, impostor.addr, honest.addr, m)
		assertImpostorRefused(t, x, honest, m, data)
		// Serving too: x turns the impostor away when it asks for pieces.
		s, err := impostor.Open(context.Background(), m, filepath.Join(impostor.dir, "g"), impostor.comp)
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		before := x.Stats()
		_, _ = s.Fetch(short, FetchOptions{Peers: peers(x.addr), PeerRefresh: 50 * time.Millisecond})
		if after := x.Stats(); after.PeerBytesOut != before.PeerBytesOut || after.IdentityRefusals == before.IdentityRefusals {
			t.Fatalf("x served the impostor: before %+v after %+v", before, after)
		}
	})
}

func assertImpostorRefused(t *testing.T, x, honest *testNode, m *Manifest, data []byte) {
	t.Helper()
	assertFileRange(t, filepath.Join(x.dir, "f2"), data, m)
	st := x.Stats()
	if st.IdentityRefusals == 0 || st.PeersBanned != 0 || st.PiecesFailed != 0 {
		t.Fatalf("want the impostor refused in the handshake, before any byte: stats %+v", st)
	}
	if x.Banned(honest.PublicKey()) {
		t.Fatal("the honest node is banned")
	}
}

// keyDir is a fixed KeyDirectory.
type keyDir map[string]ed25519.PublicKey

func (d keyDir) PeerKey(id string) []byte { return d[id] }
