package netlab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// Fleet helpers: what the multi-host tests and the chaos suite ask of a
// fleet of daemons, each returning an error so a test and a command (the
// lab's benchmarks) share them. Every wait ends with ctx.

// WriteClusterKey writes a fresh gossip cluster key to path, as
// --cluster-key-file reads it.
func WriteClusterKey(path string) error {
	key, err := gossip.GenerateKey()
	if err != nil {
		return fmt.Errorf("cluster key: %w", err)
	}
	if err := os.WriteFile(path, []byte(gossip.EncodeKey(key)+"\n"), 0o600); err != nil {
		return fmt.Errorf("cluster key: %w", err)
	}
	return nil
}

// SwarmArgs are the daemon flags that make h a member of the fleet whose
// seed is seed's gossip port, with the swarm on; p2p replaces the default
// --p2p h:7947 when given.
func SwarmArgs(h, seed *Host, keyFile string, p2p ...string) []string {
	if len(p2p) == 0 {
		p2p = []string{"--p2p", h.Addr(7947)}
	}
	return append([]string{
		"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--gossip", h.Addr(7946), "--join", seed.Addr(7946), "--cluster-key-file", keyFile,
	}, p2p...)
}

// FleetMember is the part of one member in `warmfleet fleet -o json` the
// harness reads.
type FleetMember struct {
	Name   string                     `json:"name"`
	State  string                     `json:"state"`
	Models map[string]FleetModelState `json:"models"`
}

// FleetModelState is a member's state of one model, from its inventory.
type FleetModelState struct {
	State string `json:"state"`
}

// FleetView runs `warmfleet fleet -o json` against d.
func (d *Daemon) FleetView(ctx context.Context) ([]FleetMember, error) {
	out, err := d.CLI(ctx, "fleet", "-o", "json")
	if err != nil {
		return nil, err
	}
	var f struct {
		Members []FleetMember `json:"members"`
	}
	if err := json.Unmarshal(out, &f); err != nil {
		return nil, fmt.Errorf("fleet JSON of %s %q: %w", d.host.Name, tail(string(out), 512), err)
	}
	return f.Members, nil
}

// WaitMembers waits until d sees n members alive.
func (d *Daemon) WaitMembers(ctx context.Context, n int) error {
	return d.waitFor(ctx, fmt.Sprintf("%d members alive", n), func() error {
		ms, err := d.FleetView(ctx)
		if err != nil {
			return err
		}
		alive := 0
		for _, m := range ms {
			if m.State == "alive" {
				alive++
			}
		}
		if alive != n {
			return fmt.Errorf("%d of %d members alive", alive, len(ms))
		}
		return nil
	})
}

// WaitReady waits until d has cache name ready with m's exact bytes.
func (d *Daemon) WaitReady(ctx context.Context, name string, m Model) error {
	return d.waitFor(ctx, name+" ready", func() error {
		st, err := d.CacheStatus(ctx, name)
		if err != nil {
			return err
		}
		if !st.Ready {
			return fmt.Errorf("state %s %s", st.State, st.Error)
		}
		return m.Verify(st.Path)
	})
}

// WaitRemoved waits until d no longer has cache name.
func (d *Daemon) WaitRemoved(ctx context.Context, name string) error {
	return d.waitFor(ctx, name+" removed", func() error {
		if st, err := d.CacheStatus(ctx, name); err == nil {
			return fmt.Errorf("still there: %s", st.State)
		}
		return nil
	})
}

// MetricValue is Metric that reads a missing metric as an error.
func (d *Daemon) MetricValue(ctx context.Context, name string) (float64, error) {
	v, found, err := d.Metric(ctx, name)
	if err == nil && !found {
		err = fmt.Errorf("%s does not export %s", d.host.Name, name)
	}
	return v, err
}

// waitFor polls cond until it holds, ctx ends or a generous deadline for a
// loaded two-core machine passes; the error names the host and what.
func (d *Daemon) waitFor(ctx context.Context, what string, cond func() error) error {
	if err := wait.Until(ctx, cond, wait.Timeout(3*time.Minute)); err != nil {
		return fmt.Errorf("%s: waiting for %s: %w", d.host.Name, what, err)
	}
	return nil
}
