package daemon

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/internal/torrentorigin"
	"github.com/warmfleet/warmfleet/spec"
)

// These tests warm magnet: caches from an anacrolix seeder on loopback
// (internal/testutil/torrentseed) through internal/torrentorigin, the
// origin the daemon wires for BitTorrent sources.

func torrentOrigin(t *testing.T, d **Daemon, stall time.Duration) *torrentorigin.Origin {
	t.Helper()
	o, err := torrentorigin.New(torrentorigin.Options{
		Dir: t.TempDir(), Listen: "127.0.0.1:0", PartSize: testPartSize, StallTimeout: stall,
		OnBytes: func(n int) { (*d).AddOriginBytes("torrent", n) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

func TestCacheFromMagnet(t *testing.T) {
	files := []torrentseed.File{
		{Path: "config.json", Data: []byte(`{"layers": 2}`)},
		{Path: "model-00001.safetensors", Data: origintest.Bytes(30, 2<<20+11)},
		{Path: "sub/model-00002.safetensors", Data: origintest.Bytes(31, 1<<20+5)},
	}
	seeder := torrentseed.Start(t)
	mi, magnet := seeder.Add(t, "tiny", files, 256<<10)
	var d *Daemon
	d = newDaemon(t, t.TempDir(), torrentOrigin(t, &d, 0))
	run(t, d)
	if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: "tiny", Source: magnet}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "tiny").Ready })
	st := status(t, d, "tiny")
	var total int64
	for _, f := range files {
		got, err := os.ReadFile(filepath.Join(st.Path, f.Path))
		if err != nil || sha256.Sum256(got) != sha256.Sum256(f.Data) {
			t.Fatalf("%s: SHA-256 differs from the source's (%v)", f.Path, err)
		}
		total += int64(len(f.Data))
	}
	if ih := mi.HashInfoBytes().HexString(); st.Commit != ih || st.Files != 3 {
		t.Errorf("status %+v, want commit = info hash %s and 3 files", st, ih)
	}
	if got := testutil.ToFloat64(d.metrics.originBytes.WithLabelValues("torrent")); got != float64(total) {
		t.Errorf(`warmfleet_origin_bytes_total{source="torrent"} = %v, want %v`, got, total)
	}
	// verify re-hashes the copy against the torrent's pieces.
	res, err := d.Verify(t.Context(), "tiny")
	if err != nil || res.Checked != 3 || len(res.Damaged) > 0 {
		t.Fatalf("verify: %+v, %v", res, err)
	}
}

// A seeder that sends bad pieces never makes a cache ready: every
// attempt fails naming the hash check, is counted as corrupt, and no file
// is published.
func TestCorruptSeederNeverReady(t *testing.T) {
	seeder := torrentseed.Start(t, torrentseed.Corrupt())
	_, magnet := seeder.Add(t, "bad", []torrentseed.File{{Data: origintest.Bytes(32, 1<<20)}}, 256<<10)
	var d *Daemon
	d = newDaemon(t, t.TempDir(), torrentOrigin(t, &d, 2*time.Second))
	run(t, d)
	if err := d.AddCache(t.Context(), spec.Spec{Kind: spec.KindModel, Name: "bad", Source: magnet}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "an attempt to fail", func() bool {
		st := status(t, d, "bad")
		return st.State == api.StateFailed && st.Attempts >= 1
	}, wait.Timeout(time.Minute))
	st := status(t, d, "bad")
	if st.Ready || st.Path != "" || !strings.Contains(st.Error, "SHA-1") {
		t.Fatalf("status %+v: want failed, nothing published, the hash check named", st)
	}
	if got := testutil.ToFloat64(d.metrics.originCorrupt.WithLabelValues("torrent")); got < 1 {
		t.Errorf(`warmfleet_origin_corrupt_total{source="torrent"} = %v after a failed attempt, want it counted`, got)
	}
}
