package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// stallDialers is the attacker's threads dialing at once.
const stallDialers = 8

// stalledHandshakes keeps n connections from attacker to each of addrs,
// each sending nothing, stalled in the handshake; one the node
// closes is opened again after redial. A few threads, entered into the
// attacker's namespace once, dial them all, in parallel as an attacker
// racing the members for slots would: the attacker runs on the fleet's
// cores here, and entering the namespace per dial would charge the fleet
// for an attacker's CPU that is elsewhere in life. It returns the
// number of connections opened so far and a function that ends the attack.
func stalledHandshakes(attacker *netlab.Host, addrs []string, n int, redial time.Duration) (opened func() int64, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var count atomic.Int64
	var wg sync.WaitGroup
	type dial struct {
		addr  string
		reply chan net.Conn
	}
	dials := make(chan dial)
	for range stallDialers {
		wg.Go(func() {
			_ = attacker.NS.Do(func() error {
				var d net.Dialer
				for {
					select {
					case <-ctx.Done():
						return nil
					case r := <-dials:
						c, err := d.DialContext(ctx, "tcp", r.addr)
						if err != nil {
							c = nil
						}
						r.reply <- c
					}
				}
			})
		})
	}
	for _, addr := range addrs {
		for range n {
			wg.Go(func() {
				reply := make(chan net.Conn, 1)
				for {
					select {
					case <-ctx.Done():
						return
					case dials <- dial{addr, reply}:
					}
					if c := <-reply; c != nil {
						count.Add(1)
						closeOnStop := context.AfterFunc(ctx, func() { c.Close() })
						// Nothing is sent: the node waits for a TLS ClientHello
						// (or, in plaintext, the hello) until its handshake
						// timeout. A wrong first byte would be refused at once.
						_, _ = io.Copy(io.Discard, c) // until the node closes it
						closeOnStop()
						c.Close()
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(redial):
					}
				}
			})
		}
	}
	return count.Load, func() { cancel(); wg.Wait() }
}

// stallLab is a swarm fleet of three daemons and an attacker host that
// reaches their peer ports.
type stallLab struct {
	lab      *netlab.Lab
	fleet    []*netlab.Daemon
	attacker *netlab.Host
	peers    []string
	model    netlab.Model
}

func newStallLab(tb testing.TB, ctx context.Context, size int64) *stallLab {
	lab := netlabtest.New(tb, netlab.Options{Hosts: 4, Link: 400 * netlab.Mbit, S3: true})
	bin := warmfleetBin(tb)
	model, err := lab.S3().SeedModel(ctx, "models", "stall/", 2, size, 3)
	if err != nil {
		tb.Fatal(err)
	}
	key := writeKey(tb, "cluster.key")
	hosts := lab.Hosts()
	seed := hosts[0].IP.String() + ":7946"
	sl := &stallLab{lab: lab, attacker: hosts[3], model: model}
	for _, h := range hosts[:3] {
		sl.fleet = append(sl.fleet, startSwarmDaemon(tb, ctx, lab, h, bin, key, seed))
		sl.peers = append(sl.peers, h.IP.String()+":7947")
	}
	waitMembers(tb, ctx, sl.fleet[0], 3)
	return sl
}

// warm caches the model as name on the fleet and returns how long until
// every node had it ready and verified.
func (sl *stallLab) warm(tb testing.TB, ctx context.Context, name string) time.Duration {
	start := time.Now()
	if _, err := sl.fleet[0].CLI(ctx, "cache", "add", name, "--source", sl.model.Source()); err != nil {
		tb.Fatal(err)
	}
	for _, d := range sl.fleet {
		waitReady(tb, ctx, d, name, sl.model)
	}
	return time.Since(start)
}

// remove drops name everywhere, so the next warm is cold again.
func (sl *stallLab) remove(tb testing.TB, ctx context.Context, name string) {
	if _, err := sl.fleet[0].CLI(ctx, "cache", "rm", name); err != nil {
		tb.Fatal(err)
	}
	for _, d := range sl.fleet {
		waitRemoved(tb, ctx, d, name)
	}
}

// TestSwarmCompletesUnderStalledHandshakes warms a swarm fleet while an
// attacker host keeps 300 connections to every node's peer port that stall
// in the handshake, sending nothing: the strangers hold only their small
// handshake budget, the members keep their slots, and the swarm completes
// with the content read from S3 about once.
func TestSwarmCompletesUnderStalledHandshakes(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	sl := newStallLab(t, ctx, 48<<20)
	opened, stop := stalledHandshakes(sl.attacker, sl.peers, 300, 100*time.Millisecond)
	defer stop()
	wait.Err(t, "the attack in place", func() error {
		if n := opened(); n < 3*300 {
			return fmt.Errorf("%d connections opened", n)
		}
		return nil
	}, wait.Context(ctx))
	took := sl.warm(t, ctx, "stalled")
	for _, d := range sl.fleet {
		refused, found, err := d.Metric(ctx, "warmfleet_peer_connections_refused_total")
		if err != nil || !found || refused == 0 {
			t.Fatalf("%s refused %v connections (exported: %v, err %v), want the attack's refused", d.Host().Name, refused, found, err)
		}
	}
	s3Total := s3Bytes(t, ctx, sl.fleet...)
	t.Logf("warm under %d stalled connections opened: %v, %.2fx the model from S3", opened(), took, s3Total/float64(sl.model.Size()))
	if s3Total > 1.2*float64(sl.model.Size()) {
		t.Fatalf("the fleet read %.2fx the model from S3 under attack, want the swarm to carry it", s3Total/float64(sl.model.Size()))
	}
}

// BenchmarkSwarmUnderStalledHandshakes times a cold 300 MB swarm warm-up
// of three nodes, undisturbed and while an attacker keeps 300 stalled
// handshakes open against each peer port (reopened at once when the node
// closes one), alternating, one of each per iteration, in one lab. It
// reports the median seconds of each and their ratio.
func BenchmarkSwarmUnderStalledHandshakes(b *testing.B) {
	ctx := b.Context()
	sl := newStallLab(b, ctx, 300<<20)
	var calm, stalled []float64
	k := 0
	b.ResetTimer()
	for b.Loop() {
		k++
		name := fmt.Sprintf("calm%d", k)
		calm = append(calm, sl.warm(b, ctx, name).Seconds())
		sl.remove(b, ctx, name)
		opened, stop := stalledHandshakes(sl.attacker, sl.peers, 300, 0)
		wait.Err(b, "the attack in place", func() error {
			if n := opened(); n < 3*300 {
				return fmt.Errorf("%d connections opened", n)
			}
			return nil
		}, wait.Context(ctx))
		name = fmt.Sprintf("stalled%d", k)
		stalled = append(stalled, sl.warm(b, ctx, name).Seconds())
		stop()
		sl.remove(b, ctx, name)
		b.Logf("run %d: undisturbed %.1f s, 300 stalled per port %.1f s", k, calm[k-1], stalled[k-1])
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(calm), "undisturbed-s")
	b.ReportMetric(median(stalled), "stalled-s")
	b.ReportMetric(median(stalled)/median(calm), "ratio")
}
