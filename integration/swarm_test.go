package integration

import (
	"context"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
)

// TestSwarmPullsOnceFromS3 runs a cold fleet of three daemons with the
// swarm on: together they read the model from S3 about once, every node
// ends with a verified copy, and after the three restart, a node joining the
// warm fleet reads nothing from S3.
func TestSwarmPullsOnceFromS3(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 4, Link: 400 * netlab.Mbit, S3: true})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	model, err := lab.S3().SeedModel(ctx, "models", "swarm/", 2, 80<<20, 11)
	if err != nil {
		t.Fatal(err)
	}
	key := writeKey(t, "cluster.key")
	hosts := lab.Hosts()
	seed := hosts[0].IP.String() + ":7946"
	start := func(h *netlab.Host) *netlab.Daemon { return startSwarmDaemon(t, ctx, lab, h, bin, key, seed) }
	var cold []*netlab.Daemon
	for _, h := range hosts[:3] {
		cold = append(cold, start(h))
	}
	waitMembers(t, ctx, cold[0], 3)
	if _, err := cold[0].CLI(ctx, "cache", "add", "swarm", "--source", model.Source()); err != nil {
		t.Fatal(err)
	}
	ready := func(d *netlab.Daemon) { waitReady(t, ctx, d, "swarm", model) }
	for _, d := range cold {
		ready(d)
	}
	size := float64(model.Size())
	var s3Total float64
	for _, d := range cold {
		s3, peerIn := s3Bytes(t, ctx, d), metricOf(t, ctx, d, `warmfleet_peer_bytes_total{direction="in"}`)
		t.Logf("%s: %.2f of the model from S3, %.2f from peers", d.Host().Name, s3/size, peerIn/size)
		s3Total += s3
	}
	// Each byte is pulled once by its origin; the end-to-end check of a
	// file reads nothing from S3 (HEAD only).
	if s3Total < size || s3Total > 1.1*size {
		t.Fatalf("cold fleet read %.2fx the model from S3, want about 1x", s3Total/size)
	}

	// The warm nodes restart (an upgrade, a reboot): they serve what they
	// hold again, so a node joining the fleet now still fills from peers
	// only.
	for _, d := range cold {
		if err := d.Restart(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range cold {
		ready(d)
	}
	late := start(hosts[3])
	ready(late)
	if s3 := s3Bytes(t, ctx, late); s3 != 0 {
		t.Fatalf("joining node read %.0f bytes from S3, want 0", s3)
	}
}

// startSwarmDaemon runs a daemon on h that joins the fleet at seed with the
// swarm on; p2p replaces the default --p2p h:7947 when given.
func startSwarmDaemon(t testing.TB, ctx context.Context, lab *netlab.Lab, h *netlab.Host, bin, key, seed string, p2p ...string) *netlab.Daemon {
	t.Helper()
	d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: bin, Env: lab.S3().Env(), Args: netlab.SwarmArgs(h, seedHost(t, lab, seed), key, p2p...)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// seedHost is the lab host whose gossip address is seed.
func seedHost(t testing.TB, lab *netlab.Lab, seed string) *netlab.Host {
	t.Helper()
	for _, h := range lab.Hosts() {
		if h.Addr(7946) == seed {
			return h
		}
	}
	t.Fatalf("no lab host gossips at %s", seed)
	return nil
}

// waitMembers waits until d sees n members.
func waitMembers(t testing.TB, ctx context.Context, d *netlab.Daemon, n int) {
	t.Helper()
	if err := d.WaitMembers(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// waitReady waits until d has cache name ready with model's exact bytes.
func waitReady(t testing.TB, ctx context.Context, d *netlab.Daemon, name string, model netlab.Model) {
	t.Helper()
	if err := d.WaitReady(ctx, name, model); err != nil {
		t.Fatal(err)
	}
}

// waitRemoved waits until d no longer has cache name.
func waitRemoved(t testing.TB, ctx context.Context, d *netlab.Daemon, name string) {
	t.Helper()
	if err := d.WaitRemoved(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// metricOf returns d's metric name (a sum over its label sets; a selector
// such as name{label="v"} narrows it).
func metricOf(t testing.TB, ctx context.Context, d *netlab.Daemon, name string) float64 {
	t.Helper()
	v, _, err := d.Metric(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// s3Bytes returns the bytes the daemons read from S3 together.
func s3Bytes(t testing.TB, ctx context.Context, ds ...*netlab.Daemon) float64 {
	t.Helper()
	var sum float64
	for _, d := range ds {
		sum += metricOf(t, ctx, d, "warmfleet_s3_bytes_total")
	}
	return sum
}
