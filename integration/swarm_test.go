package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
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

// TestSwarmSurvivesOriginDeath kills one node of a cold fleet mid-way: the
// shards it was the origin of move to the next node in rank, and the
// others still finish with verified copies.
func TestSwarmSurvivesOriginDeath(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3: true})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	model, err := lab.S3().SeedModel(ctx, "models", "fault/", 3, 96<<20, 12)
	if err != nil {
		t.Fatal(err)
	}
	key := writeKey(t, "cluster.key")
	hosts := lab.Hosts()
	var daemons []*netlab.Daemon
	for _, h := range hosts {
		daemons = append(daemons, startSwarmDaemon(t, ctx, lab, h, bin, key, hosts[0].IP.String()+":7946"))
	}
	waitMembers(t, ctx, daemons[1], 3)
	if _, err := daemons[1].CLI(ctx, "cache", "add", "fault", "--source", model.Source()); err != nil {
		t.Fatal(err)
	}
	// Kill the node that is furthest into its S3 reads: it is an origin.
	var victim *netlab.Daemon
	wait.Err(t, "an origin at work", func() error {
		for _, d := range daemons {
			if s3, _, err := d.Metric(ctx, "warmfleet_s3_bytes_total"); err == nil && s3 >= 8<<20 {
				victim = d
				return nil
			}
		}
		return fmt.Errorf("no node has read 8 MiB from S3 yet")
	}, wait.Context(ctx))
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s mid-way", victim.Host().Name)
	var s3Total float64
	for _, d := range daemons {
		if d == victim {
			continue
		}
		waitReady(t, ctx, d, "fault", model)
		s3Total += s3Bytes(t, ctx, d)
	}
	// One survivor takes over each of the victim's shards; the others keep
	// following, so the survivors together still read the model about once.
	if size := float64(model.Size()); s3Total > 1.1*size {
		t.Fatalf("survivors read %.2fx the model from S3, want about 1x", s3Total/size)
	}
}

// TestSwarmBansCorruptingPeer has a warm member serve corrupt bytes (a
// proxy in front of its peer port flips bits past the handshake): a node
// joining the fleet detects the bad pieces, bans that member, and fills
// from the honest one, still without reading S3.
func TestSwarmBansCorruptingPeer(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 3, Link: 400 * netlab.Mbit, S3: true})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	model, err := lab.S3().SeedModel(ctx, "models", "corrupt/", 2, 64<<20, 13)
	if err != nil {
		t.Fatal(err)
	}
	key := writeKey(t, "cluster.key")
	hosts := lab.Hosts()
	bad := hosts[0]
	// The bad member's daemon listens on 7948; members reach it through the
	// proxy on 7947, the address it advertises.
	proxy, err := bad.Proxy(bad.IP.String()+":7947", bad.IP.String()+":7948")
	if err != nil {
		t.Fatal(err)
	}
	seed := hosts[0].IP.String() + ":7946"
	warm := []*netlab.Daemon{
		startSwarmDaemon(t, ctx, lab, bad, bin, key, seed, "--p2p", bad.IP.String()+":7948", "--p2p-advertise", bad.IP.String()+":7947"),
		startSwarmDaemon(t, ctx, lab, hosts[1], bin, key, seed),
	}
	waitMembers(t, ctx, warm[1], 2)
	if _, err := warm[1].CLI(ctx, "cache", "add", "corrupt", "--source", model.Source()); err != nil {
		t.Fatal(err)
	}
	for _, d := range warm {
		waitReady(t, ctx, d, "corrupt", model)
	}
	// From now on every 256 KiB-th byte the bad member sends past its
	// first 64 KiB is flipped: handshakes and bitfields pass, piece bytes do
	// not.
	proxy.SetMangle(func(off int64, p []byte) {
		for i := range p {
			if o := off + int64(i); o >= 64<<10 && o%(256<<10) == 0 {
				p[i] ^= 0x01
			}
		}
	})
	joiner := startSwarmDaemon(t, ctx, lab, hosts[2], bin, key, seed)
	waitReady(t, ctx, joiner, "corrupt", model)
	metric := func(name string) float64 { return metricOf(t, ctx, joiner, name) }
	banned, failed, s3 := metric("warmfleet_peers_banned_total"), metric(`warmfleet_pieces_total{result="failed"}`), metric("warmfleet_s3_bytes_total")
	t.Logf("joiner: %v peers banned, %v pieces failed, %v bytes from S3", banned, failed, s3)
	if failed < 1 || banned < 1 {
		t.Fatalf("corrupt pieces went unnoticed: %v failed, %v bans", failed, banned)
	}
	if s3 != 0 {
		t.Fatalf("joiner read %v bytes from S3; the honest member holds everything", s3)
	}
}

// startSwarmDaemon runs a daemon on h that joins the fleet at seed with the
// swarm on; p2p replaces the default --p2p h:7947 when given.
func startSwarmDaemon(t testing.TB, ctx context.Context, lab *netlab.Lab, h *netlab.Host, bin, key, seed string, p2p ...string) *netlab.Daemon {
	t.Helper()
	if len(p2p) == 0 {
		p2p = []string{"--p2p", h.IP.String() + ":7947"}
	}
	d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: bin, Env: lab.S3().Env(), Args: append([]string{
		"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--gossip", h.IP.String() + ":7946", "--join", seed, "--cluster-key-file", key,
	}, p2p...)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitMembers waits until d sees n members.
func waitMembers(t testing.TB, ctx context.Context, d *netlab.Daemon, n int) {
	t.Helper()
	wait.Err(t, fmt.Sprintf("%d members", n), func() error {
		f, err := fleetView(ctx, d)
		if err != nil {
			return err
		}
		if len(f.Members) != n {
			return fmt.Errorf("%d members", len(f.Members))
		}
		return nil
	}, wait.Context(ctx))
}

// waitReady waits until d has cache name ready with model's exact bytes.
func waitReady(t testing.TB, ctx context.Context, d *netlab.Daemon, name string, model netlab.Model) {
	t.Helper()
	wait.Err(t, d.Host().Name+" ready", func() error {
		st, err := d.CacheStatus(ctx, name)
		if err != nil {
			return err
		}
		if !st.Ready {
			return fmt.Errorf("state %s %s", st.State, st.Error)
		}
		return model.Verify(st.Path)
	}, wait.Context(ctx))
}

// waitRemoved waits until d no longer has cache name.
func waitRemoved(t testing.TB, ctx context.Context, d *netlab.Daemon, name string) {
	t.Helper()
	wait.Err(t, d.Host().Name+" removed "+name, func() error {
		if st, err := d.CacheStatus(ctx, name); err == nil {
			return fmt.Errorf("still there: %s", st.State)
		}
		return nil
	}, wait.Context(ctx))
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
