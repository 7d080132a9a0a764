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
)

// TestSwarmPullsOnceFromHub runs a cold fleet of three daemons with the
// swarm on against a Hub (internal/testutil/hubserver) on a fourth host:
// an hf:// cache is pinned to its commit, read from the Hub about once by
// the fleet together, and every node ends with a verified copy.
func TestSwarmPullsOnceFromHub(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 4, Link: 400 * netlab.Mbit})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	hosts := lab.Hosts()
	hubHost := hosts[3]
	hubLn, err := hubHost.NS.Listen("tcp", hubHost.Addr(8080))
	if err != nil {
		t.Fatal(err)
	}
	cdnLn, err := hubHost.NS.Listen("tcp", hubHost.Addr(8081))
	if err != nil {
		t.Fatal(err)
	}
	hub := hubserver.NewOn(t, hubLn, cdnLn)
	files := map[string]hubserver.File{"config.json": {Data: []byte(`{"model_type":"llama"}`)}}
	model := netlab.Model{Files: []netlab.ModelFile{{Name: "config.json", Size: int64(len(files["config.json"].Data)), SHA256: hubserver.SHA256(files["config.json"].Data)}}}
	for i := range 2 {
		name := fmt.Sprintf("model-%05d.safetensors", i+1)
		data := origintest.Bytes(uint64(20+i), 40<<20)
		files[name] = hubserver.File{Data: data, LFS: true}
		model.Files = append(model.Files, netlab.ModelFile{Name: name, Size: int64(len(data)), SHA256: hubserver.SHA256(data)})
	}
	commit := hub.Push("org/llama", "main", files)

	daemons := startSwarmFleet(t, ctx, bin, hosts[:3], "--hf-endpoint", hub.Endpoint())
	if _, err := daemons[0].CLI(ctx, "cache", "add", "llama", "--source", "hf://org/llama"); err != nil {
		t.Fatal(err)
	}
	size := float64(model.Size())
	var hubTotal float64
	for _, d := range daemons {
		waitReady(t, ctx, d, "llama", model)
		st, err := d.CacheStatus(ctx, "llama")
		if err != nil {
			t.Fatal(err)
		}
		if st.Commit != commit {
			t.Errorf("%s: ready at commit %q, want %s", d.Host().Name, st.Commit, commit)
		}
		hf, peerIn := metricOf(t, ctx, d, `warmfleet_origin_bytes_total{source="hf"}`), metricOf(t, ctx, d, `warmfleet_peer_bytes_total{direction="in"}`)
		t.Logf("%s: %.2f of the model from the Hub, %.2f from peers", d.Host().Name, hf/size, peerIn/size)
		hubTotal += hf
		if s3 := s3Bytes(t, ctx, d); s3 != 0 {
			t.Errorf("%s: %v bytes counted as S3 for a Hub source", d.Host().Name, s3)
		}
	}
	// Each byte is read once by its shard's origin; the end-to-end checks
	// read the local copies back, not the Hub.
	if hubTotal < size || hubTotal > 1.1*size {
		t.Fatalf("cold fleet read %.2fx the model from the Hub, want about 1x", hubTotal/size)
	}
	st := hub.Stats()
	t.Logf("hub: %d API requests, %d resolves, %d CDN GETs (%d with a token)", st.API, st.Resolves, st.CDNGets, st.CDNAuthorized)
}

// startSwarmFleet starts a daemon with the swarm on (gossip, a shared
// cluster key, --p2p) on each of hosts, with extra flags, and waits for
// them to see each other.
func startSwarmFleet(t *testing.T, ctx context.Context, bin string, hosts []*netlab.Host, extra ...string) []*netlab.Daemon {
	t.Helper()
	key := writeKey(t, "cluster.key")
	seed := hosts[0].IP.String() + ":7946"
	var daemons []*netlab.Daemon
	for _, h := range hosts {
		d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: bin, Args: append([]string{
			"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
			"--gossip", h.IP.String() + ":7946", "--join", seed, "--cluster-key-file", key,
			"--p2p", h.IP.String() + ":7947",
		}, extra...)})
		if err != nil {
			t.Fatal(err)
		}
		daemons = append(daemons, d)
	}
	waitMembers(t, ctx, daemons[0], len(hosts))
	return daemons
}
