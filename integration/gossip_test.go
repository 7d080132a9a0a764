package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func writeKey(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := netlab.WriteClusterKey(path); err != nil {
		t.Fatal(err)
	}
	return path
}

func fleetView(ctx context.Context, d *netlab.Daemon) (api.Fleet, error) {
	out, err := d.CLI(ctx, "fleet", "-o", "json")
	if err != nil {
		return api.Fleet{}, err
	}
	var f api.Fleet
	if err := json.Unmarshal(out, &f); err != nil {
		return api.Fleet{}, fmt.Errorf("fleet JSON %q: %w", out, err)
	}
	return f, nil
}

// TestFleetGossip runs five daemons, each on its own host, in one
// encrypted gossip cluster: a spec added on one reaches all and every node
// caches it; a killed node's inventory disappears from the others' views; a
// restarted node rejoins with its cache; a node with another key stays out.
func TestFleetGossip(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 6, Link: 500 * netlab.Mbit, S3: true})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	model, err := lab.S3().SeedModel(ctx, "models", "small/", 2, 2<<20, 7)
	if err != nil {
		t.Fatal(err)
	}
	key := writeKey(t, "cluster.key")
	hosts := lab.Hosts()
	seed := hosts[0].IP.String() + ":7946"
	start := func(h *netlab.Host, keyFile string) *netlab.Daemon {
		d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: bin, Env: lab.S3().Env(), Args: []string{
			"--reserve", "0", "--reserve-fraction", "0", "--gossip", h.IP.String() + ":7946",
			"--join", seed, "--cluster-key-file", keyFile, "--label", "rack=" + h.Name,
		}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	var daemons []*netlab.Daemon
	for _, h := range hosts[:5] {
		daemons = append(daemons, start(h, key))
	}
	names := func(f api.Fleet, state string) []string {
		var out []string
		for _, m := range f.Members {
			if m.State == state {
				out = append(out, m.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	want := []string{"h0", "h1", "h2", "h3", "h4"}
	for _, d := range daemons {
		wait.Err(t, "five members alive", func() error {
			f, err := fleetView(ctx, d)
			if err != nil {
				return err
			}
			if got := names(f, "alive"); !slices.Equal(got, want) || !f.Clustered {
				return fmt.Errorf("alive members %v", got)
			}
			return nil
		}, wait.Context(ctx))
	}

	// A spec added on h2 reaches every node, and every node caches it.
	if _, err := daemons[2].CLI(ctx, "cache", "add", "small", "--source", model.Source()); err != nil {
		t.Fatal(err)
	}
	for _, d := range daemons {
		wait.Err(t, d.Host().Name+" ready", func() error {
			st, err := d.CacheStatus(ctx, "small")
			if err != nil {
				return err
			}
			if !st.Ready {
				return fmt.Errorf("state %s %s", st.State, st.Error)
			}
			return model.Verify(st.Path)
		}, wait.Context(ctx))
	}
	// Every node sees every node ready, through inventories.
	wait.Err(t, "fleet-wide readiness seen from h0", func() error {
		f, err := fleetView(ctx, daemons[0])
		if err != nil {
			return err
		}
		for _, m := range f.Members {
			if m.Models["small"].State != "ready" {
				return fmt.Errorf("%s: %+v", m.Name, m.Models["small"])
			}
		}
		return nil
	}, wait.Context(ctx))

	// A killed node drops out with its inventory.
	if err := daemons[4].Kill(); err != nil {
		t.Fatal(err)
	}
	wait.Err(t, "h4 dead in h0's view", func() error {
		f, err := fleetView(ctx, daemons[0])
		if err != nil {
			return err
		}
		for _, m := range f.Members {
			if m.Name == "h4" && (m.State == "alive" || len(m.Models) > 0) {
				return fmt.Errorf("h4 still %s with %d models", m.State, len(m.Models))
			}
		}
		return nil
	}, wait.Context(ctx))
	// It rejoins after a restart, still ready.
	if err := daemons[4].Restart(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	wait.Err(t, "h4 rejoined and ready", func() error {
		f, err := fleetView(ctx, daemons[1])
		if err != nil {
			return err
		}
		for _, m := range f.Members {
			if m.Name == "h4" && m.State == "alive" && m.Models["small"].State == "ready" {
				return nil
			}
		}
		return fmt.Errorf("h4 not back: %v", names(f, "alive"))
	}, wait.Context(ctx))

	// Removing the spec anywhere frees the space everywhere.
	if _, err := daemons[3].CLI(ctx, "cache", "rm", "small"); err != nil {
		t.Fatal(err)
	}
	for _, d := range daemons {
		waitRemoved(t, ctx, d, "small")
	}

	// A node with another key cannot join: it stays alone and unseen.
	intruder := start(hosts[5], writeKey(t, "other.key"))
	wait.For(t, "the intruder's join refused", func() bool { return strings.Contains(intruder.Log(), "gossip: join failed") }, wait.Context(ctx))
	f, err := fleetView(ctx, daemons[0])
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names(f, "alive"), "h5") {
		t.Fatalf("a node with another key joined: %v", names(f, "alive"))
	}
	fi, err := fleetView(ctx, intruder)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(fi, "alive"); !slices.Equal(got, []string{"h5"}) {
		t.Fatalf("intruder sees %v", got)
	}
}
