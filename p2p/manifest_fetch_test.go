package p2p

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
)

func TestFetchManifest(t *testing.T) {
	data := randomData(t, 1<<20+7)
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil)
	if _, err := b.FetchManifest(t.Context(), a.addr, "m/f#0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("manifest of a shard nobody holds: %v, want ErrNoManifest", err)
	}
	sa, err := a.Build(t.Context(), BuildSpec{ShardID: "m/f#0", Name: "f", Path: filepath.Join(a.dir, "f"),
		FileSize: int64(len(data)), Length: int64(len(data)), PieceLength: testPiece,
		Source: newHTTPOrigin(t, data).Source(), Completion: a.comp})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.FetchManifest(t.Context(), a.addr, "m/f#0")
	if err != nil {
		t.Fatal(err)
	}
	if m.ID() != sa.Manifest().ID() || !bytes.Equal(m.Hashes, sa.Manifest().Hashes) {
		t.Fatal("fetched manifest differs from the built one")
	}
	// A node without the cluster key gets nothing.
	intruder := startNode(t, "x", func(c *Config) { c.ClusterKey = bytes.Repeat([]byte{9}, ClusterKeySize) })
	if _, err := intruder.FetchManifest(t.Context(), a.addr, "m/f#0"); err == nil {
		t.Fatal("a node with another key fetched a manifest")
	}
}
