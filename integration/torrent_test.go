package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestSwarmPullsOnceFromTorrent runs a cold fleet of three daemons with the
// swarm on against an anacrolix seeder on a fourth host (DHT, trackers and
// PEX off everywhere; the magnet's x.pe names the seeder): the fleet reads
// the torrent about once together, each shard from the seeder by its
// origin node and from the fleet's data plane by the others, and every
// node ends with a copy whose every file matches its SHA-256. Then a
// seeder on the same host that sends bad pieces: no node is ever ready
// with its bytes, and the failed attempts are counted as corrupt.
func TestSwarmPullsOnceFromTorrent(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 4, Link: 400 * netlab.Mbit})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	hosts := lab.Hosts()
	seedHost := hosts[3]
	on := torrentseed.On(seedHost.IP.String(), seedHost.NS.Do)
	seeder := torrentseed.Start(t, on)

	files := []torrentseed.File{{Path: "config.json", Data: []byte(`{"model_type":"llama"}`)}}
	for i := range 2 {
		files = append(files, torrentseed.File{Path: fmt.Sprintf("model-%05d.safetensors", i+1), Data: origintest.Bytes(uint64(40+i), 24<<20+i*4099)})
	}
	var model netlab.Model
	for _, f := range files {
		model.Files = append(model.Files, netlab.ModelFile{Name: f.Path, Size: int64(len(f.Data)), SHA256: hubserver.SHA256(f.Data)})
	}
	mi, magnet := seeder.Add(t, "llama", files, 256<<10)

	daemons := startSwarmFleet(t, ctx, bin, hosts[:3], "--torrent-stall-timeout", "5s")
	if _, err := daemons[0].CLI(ctx, "cache", "add", "llama", "--source", magnet); err != nil {
		t.Fatal(err)
	}
	size := float64(model.Size())
	var fromSeeder float64
	for _, d := range daemons {
		waitReady(t, ctx, d, "llama", model)
		st, err := d.CacheStatus(ctx, "llama")
		if err != nil {
			t.Fatal(err)
		}
		if ih := mi.HashInfoBytes().HexString(); st.Commit != ih {
			t.Errorf("%s: ready at %q, want the info hash %s", d.Host().Name, st.Commit, ih)
		}
		tor := metricOf(t, ctx, d, `warmfleet_origin_bytes_total{source="torrent"}`)
		peerIn := metricOf(t, ctx, d, `warmfleet_peer_bytes_total{direction="in"}`)
		t.Logf("%s: %.2f of the model from the seeder, %.2f from peers", d.Host().Name, tor/size, peerIn/size)
		fromSeeder += tor
		if tor+peerIn < size {
			t.Errorf("%s: read %.0f bytes from the seeder and %.0f from peers, less than the model's %.0f", d.Host().Name, tor, peerIn, size)
		}
		if s3 := s3Bytes(t, ctx, d); s3 != 0 {
			t.Errorf("%s: %v bytes counted as S3 for a torrent source", d.Host().Name, s3)
		}
	}
	if fromSeeder < size || fromSeeder > 1.1*size {
		t.Fatalf("cold fleet read %.2fx the model from the seeder, want about 1x", fromSeeder/size)
	}

	// A seeder that claims every piece and sends flipped bytes.
	bad := torrentseed.Start(t, on, torrentseed.Corrupt())
	_, badMagnet := bad.Add(t, "bad", []torrentseed.File{{Path: "model.safetensors", Data: origintest.Bytes(50, 4<<20)}}, 256<<10)
	if _, err := daemons[1].CLI(ctx, "cache", "add", "bad", "--source", badMagnet); err != nil {
		t.Fatal(err)
	}
	corrupt := func() (n float64) {
		for _, d := range daemons {
			n += metricOf(t, ctx, d, `warmfleet_origin_corrupt_total{source="torrent"}`)
		}
		return n
	}
	wait.For(t, "an attempt on the bad seeder to fail as corrupt", func() bool { return corrupt() >= 1 }, wait.Timeout(2*time.Minute))
	var after float64
	for _, d := range daemons {
		st, err := d.CacheStatus(ctx, "bad")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: bad: %s, %q", d.Host().Name, st.State, st.Error)
		if st.Ready || st.Path != "" {
			t.Errorf("%s: the bad seeder's torrent is ready (%+v)", d.Host().Name, st)
		}
		after += metricOf(t, ctx, d, `warmfleet_origin_bytes_total{source="torrent"}`)
	}
	// Only verified pieces are read out of anacrolix, and none was.
	if after != fromSeeder {
		t.Errorf("the fleet counted %.0f torrent bytes more after the bad seeder: bad bytes were handed out", after-fromSeeder)
	}
}
