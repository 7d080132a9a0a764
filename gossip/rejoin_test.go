package gossip

import (
	"context"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/warmfleet/warmfleet/internal/testutil/memnet"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestRejoinTargets: a whole fleet rejoins nowhere; a lone node tries its
// join list; a node whose members died without a goodbye tries the most
// recently gone of them, a bounded few, even when it is not alone (the
// two halves of a healed partition).
func TestRejoinTargets(t *testing.T) {
	t0 := time.Unix(1000, 0)
	dead := []deadMember{{"10.0.0.3:7946", t0}, {"10.0.0.4:7946", t0.Add(2 * time.Second)}, {"10.0.0.5:7946", t0.Add(time.Second)}}
	join := []string{"10.0.0.1:7946", "10.0.0.4:7946"}
	tests := []struct {
		name  string
		alone bool
		dead  []deadMember
		want  []string
	}{
		{"whole fleet", false, nil, nil},
		{"alone", true, nil, join},
		{"half of a partition", false, dead, []string{"10.0.0.4:7946", "10.0.0.5:7946"}},
		{"alone with dead members", true, dead, []string{"10.0.0.4:7946", "10.0.0.5:7946", "10.0.0.1:7946"}},
	}
	for _, tt := range tests {
		got := rejoinTargets(join, tt.alone, slices.Clone(tt.dead), 2)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: rejoinTargets = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// dialCounter counts dials, those to first, and those started after the
// test flags the node closing.
type dialCounter struct {
	*memnet.Transport
	first      string
	toFirst    atomic.Int32
	afterClose atomic.Int32
	closing    atomic.Bool
}

func (d *dialCounter) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if a.Addr == d.first {
		d.toFirst.Add(1)
	}
	if d.closing.Load() {
		d.afterClose.Add(1)
	}
	return d.Transport.DialAddressTimeout(a, timeout)
}

func (d *dialCounter) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return d.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// TestCloseDuringRejoinStopsDialling: a lone node whose join list names
// members that never answer is in the middle of a rejoin when it closes.
// Close waits for the dial in flight, not for one to every address left:
// memberlist's Join, given them all, would try each in turn.
func TestCloseDuringRejoinStopsDialling(t *testing.T) {
	holes := []string{"h0", "h1", "h2"}
	c := newMockCluster(t, append([]string{"a"}, holes...)...)
	c.tun.TCPTimeout = 500 * time.Millisecond
	var join []string
	for _, h := range holes {
		join = append(join, c.addr(h)) // on the network, never accepting: dials time out
	}
	d := &dialCounter{Transport: c.transport("a"), first: join[0]}
	n := c.start("a", func(cfg *Config) { cfg.Join, cfg.Transport = join, d })
	// A rejoin round dials the join list in order: a new dial to the first
	// address is a round that has just begun.
	base := d.toFirst.Load()
	wait.For(t, "a new rejoin round", func() bool { return d.toFirst.Load() > base })
	d.closing.Store(true)
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// One more at most, had the machine stalled through a whole dial.
	if got := d.afterClose.Load(); got > 1 {
		t.Fatalf("%d dials started after Close began, want at most 1", got)
	}
}
