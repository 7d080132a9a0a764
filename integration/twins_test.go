package integration

import (
	"context"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
)

// TestSwarmTwinModels caches three models from identical files (same
// names and bytes under three prefixes) on a swarm fleet. They share their
// revision and so their shard IDs: all three become ready on every node with
// the content read from S3 about once, not once per name; after one is
// removed, the other two stay ready, and a node joining then fills both from
// the twins that took over serving the shards.
func TestSwarmTwinModels(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 4, Link: 400 * netlab.Mbit, S3: true})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	names := []string{"tw1", "tw2", "tw3"}
	var models []netlab.Model
	for _, name := range names {
		m, err := lab.S3().SeedModel(ctx, "models", name+"/", 2, 24<<20, 5) // one seed: identical files
		if err != nil {
			t.Fatal(err)
		}
		models = append(models, m)
	}
	key := writeKey(t, "cluster.key")
	hosts := lab.Hosts()
	seed := hosts[0].IP.String() + ":7946"
	var fleet []*netlab.Daemon
	for _, h := range hosts[:3] {
		fleet = append(fleet, startSwarmDaemon(t, ctx, lab, h, bin, key, seed))
	}
	waitMembers(t, ctx, fleet[0], 3)
	for i, name := range names {
		if _, err := fleet[0].CLI(ctx, "cache", "add", name, "--source", models[i].Source()); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range fleet {
		for i, name := range names {
			waitReady(t, ctx, d, name, models[i])
		}
	}
	size := float64(models[0].Size())
	s3Total := s3Bytes(t, ctx, fleet...)
	t.Logf("three names of one content read %.2fx the content from S3", s3Total/size)
	if s3Total > 1.5*size {
		t.Fatalf("the fleet read %.2fx the content from S3 for three names of it, want about 1x", s3Total/size)
	}

	if _, err := fleet[0].CLI(ctx, "cache", "rm", "tw1"); err != nil {
		t.Fatal(err)
	}
	for _, d := range fleet {
		waitRemoved(t, ctx, d, "tw1")
	}
	late := startSwarmDaemon(t, ctx, lab, hosts[3], bin, key, seed)
	for _, d := range append(fleet, late) {
		for i, name := range names[1:] {
			waitReady(t, ctx, d, name, models[i+1])
		}
	}
	if s3 := s3Bytes(t, ctx, late); s3 > 0.1*size {
		t.Fatalf("the node joining after tw1 went read %.2fx the content from S3, want it from its peers", s3/size)
	}
}
