package integration

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/fleetbench"
	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// warmfleetBin builds the warmfleet binary once per test binary and checks
// that it has the daemon and cache commands.
func warmfleetBin(t testing.TB) string {
	return builtBin(t, "warmfleet", netlabtest.BuildWarmfleet, [][]string{{"daemon", "--help"}, {"cache", "add", "--help"}, {"cache", "status", "--help"}})
}

// labBin builds the warmfleet-lab binary (llmsim, the benchmarks) once per
// test binary.
func labBin(t testing.TB) string {
	return builtBin(t, "warmfleet-lab", netlabtest.BuildLab, [][]string{{"llmsim", "--help"}})
}

func builtBin(t testing.TB, name string, build func(context.Context, string, bool) (string, error), checks [][]string) string {
	t.Helper()
	bin := filepath.Join(binDir, name)
	if _, err := exec.LookPath(bin); err != nil {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		if bin, err = build(ctx, binDir, raceEnabled); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range checks {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	return bin
}

// TestFleetNaiveCache runs a daemon on each of three hosts and caches the
// same model on all of them from the S3 host over shaped links. Without the
// swarm every host pulls the whole model from S3.
func TestFleetNaiveCache(t *testing.T) {
	const link = 200 * netlab.Mbit
	lab := netlabtest.New(t, netlab.Options{Hosts: 3, Link: link, S3: true})
	bin := warmfleetBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	model, err := lab.S3().SeedModel(ctx, "models", "tiny/", 2, 6<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	daemons := make([]*netlab.Daemon, len(lab.Hosts()))
	for i, h := range lab.Hosts() {
		d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: bin, Env: lab.S3().Env(), Args: []string{"--reserve", "0", "--reserve-fraction", "0"}})
		if err != nil {
			t.Fatal(err)
		}
		daemons[i] = d
	}

	start := time.Now()
	var wg sync.WaitGroup
	readyAfter := make([]time.Duration, len(daemons))
	errs := make([]error, len(daemons))
	for i, d := range daemons {
		wg.Go(func() {
			st, err := d.CacheAdd(ctx, "tiny", model.Source())
			readyAfter[i] = time.Since(start)
			switch {
			case err != nil:
				errs[i] = err
			case !st.Ready || st.Path == "":
				errs[i] = errors.New("cache add --wait returned a status that is not ready: " + st.State)
			default:
				errs[i] = model.Verify(st.Path)
			}
		})
	}
	wg.Wait()
	warm := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v\nlog:\n%s", daemons[i].Host().Name, err, daemons[i].Log())
		}
	}
	if t.Failed() {
		return
	}

	size := float64(model.Size())
	for i, d := range daemons {
		st, err := d.CacheStatus(ctx, "tiny")
		if err != nil || !st.Ready {
			t.Errorf("%s: cache status %+v, %v; want ready", d.Host().Name, st, err)
		}
		s3Bytes, found, err := d.Metric(ctx, "warmfleet_s3_bytes_total")
		if err != nil || !found {
			t.Fatalf("%s: warmfleet_s3_bytes_total: found %v, %v", d.Host().Name, found, err)
		}
		ps, err := d.Stats()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: ready after %v, %.0f bytes from S3 (%.2fx the model), peak RSS %.1f MiB, CPU %v",
			d.Host().Name, readyAfter[i].Round(time.Millisecond), s3Bytes, s3Bytes/size, float64(ps.PeakRSS)/(1<<20), ps.CPU)
		// Naive mode: each host reads the model from S3 once; retries may
		// add a little, a missing byte would be a bug.
		if s3Bytes < size || s3Bytes > 1.25*size {
			t.Errorf("%s read %.0f bytes from S3 for a %.0f-byte model, want about one copy", d.Host().Name, s3Bytes, size)
		}
	}
	// A crashed daemon comes back with its cache still ready.
	d0 := daemons[0]
	if err := d0.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := d0.Restart(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := d0.CacheStatus(ctx, "tiny"); err != nil || !st.Ready {
		t.Errorf("h0 after a crash and restart: cache status %+v, %v; want ready", st, err)
	} else if err := model.Verify(st.Path); err != nil {
		t.Errorf("h0 after a crash and restart: %v", err)
	}

	lower := time.Duration(float64(len(daemons)) * size * 8 / float64(link) * float64(time.Second))
	t.Logf("fleet of %d warm after %v; the S3 link's lower bound for %d naive copies is %v",
		len(daemons), warm.Round(time.Millisecond), len(daemons), lower.Round(time.Millisecond))
}

// TestFleetBenchSmall runs the fleet benchmark end to end on a small fleet,
// both modes, and checks the shape and the byte counts of its result, not
// its timings: the swarm takes about one model from S3 and the rest from
// peers; naive takes one model per host from S3.
func TestFleetBenchSmall(t *testing.T) {
	testenv.RequireRoot(t)
	bin := warmfleetBin(t)
	const hosts, size = 3, 4 << 20
	res, err := fleetbench.Run(t.Context(), fleetbench.Options{
		Hosts: hosts, Link: 200 * netlab.Mbit, ModelSize: size, Files: 2, Runs: 1,
		Bin: bin, Versitygw: testenv.Bin(t, "versitygw"), Dir: t.TempDir(),
		DaemonArgs:     []string{"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off"},
		SwarmArgs:      []string{"--gossip", "{ip}:7946", "--join", "{seed}:7946", "--cluster-key-file", "{keyfile}", "--p2p", "{ip}:7947"},
		ClusterKeyFile: writeKey(t, "cluster.key"),
		SampleEvery:    100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	if err := res.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("bench fleet:\n%s", buf.String())
	var svg strings.Builder
	if err := res.WriteSVG(&svg); err != nil {
		t.Errorf("timeline plot: %v", err)
	}
	swarm := res.Modes[0]
	if swarm.Mode != "swarm" || !swarm.Available || res.WarmSeconds == nil || *res.WarmSeconds <= 0 || res.SwarmSpeedup == nil {
		t.Fatalf("swarm mode %+v, warm %v, speedup %v; want it measured", swarm, res.WarmSeconds, res.SwarmSpeedup)
	}
	// Swarm: the model leaves S3 about once, and every host gets what it did
	// not read from S3 from its peers.
	if r := *res.S3EgressRatio; r < 1 || r > 1.5 {
		t.Errorf("swarm S3 egress ratio %.2f, want about 1", r)
	}
	var s3, peer int64
	for _, h := range swarm.Hosts {
		if h.PeerBytes == nil {
			t.Fatalf("swarm host %s reports no peer bytes (metric not found)", h.Host)
		}
		s3, peer = s3+h.S3Bytes, peer+*h.PeerBytes
	}
	if len(swarm.Hosts) != hosts || peer <= 0 || s3+peer < hosts*size {
		t.Errorf("swarm: %d hosts read %d bytes from S3 and %d from peers, want %d hosts, peer bytes, and %d bytes in all",
			len(swarm.Hosts), s3, peer, hosts, hosts*size)
	}
	if swarm.PeakRSSBytes <= 0 {
		t.Errorf("swarm peak RSS %d, want positive", swarm.PeakRSSBytes)
	}
	if res.NaiveWarmSeconds <= 0 || res.NaiveLowerBoundSeconds <= 0 {
		t.Errorf("naive warm %v s, lower bound %v s; want both positive", res.NaiveWarmSeconds, res.NaiveLowerBoundSeconds)
	}
	// Naive: every host reads the whole model from S3.
	if r := res.NaiveS3EgressRatio; r < hosts || r > 1.25*hosts {
		t.Errorf("naive S3 egress ratio %.2f, want about %d", r, hosts)
	}
	naive := res.Modes[len(res.Modes)-1]
	if len(naive.Hosts) != hosts || naive.PeakRSSBytes <= 0 {
		t.Errorf("naive mode %+v, want %d hosts with a peak RSS", naive, hosts)
	}
	// The S3 link carried every host's copy, headers on top.
	if u := naive.S3Link; u == nil || u.SentBytes < hosts*size || u.BusySeconds <= 0 || u.BusySeconds > naive.WarmSeconds {
		t.Errorf("naive S3 link %+v, want at least %d bytes sent, busy for a part of the %.1f s run", u, hosts*size, naive.WarmSeconds)
	}
	// Every copy left S3 as TCP segments of at most a jumbo frame each.
	if l := naive.Losses; l == nil || l.S3Segments < hosts*size/9000 {
		t.Errorf("naive losses %+v, want at least %d S3 segments counted", l, hosts*size/9000)
	}
}

// TestFleetBenchHub runs the fleet benchmark with a Hub as the origin
// (Options.Origin "hf"), swarm only: the model leaves the Hub about once,
// counted as hf bytes (S3 holds no model, so nothing can come from it),
// the Hub host's link carried it, and every host got the rest from peers.
func TestFleetBenchHub(t *testing.T) {
	testenv.RequireRoot(t)
	bin := warmfleetBin(t)
	const hosts, size = 3, 6 << 20
	res, err := fleetbench.Run(t.Context(), fleetbench.Options{
		Hosts: hosts, Link: 200 * netlab.Mbit, ModelSize: size, Files: 3, Runs: 1, Origin: "hf", SkipNaive: true,
		Bin: bin, Versitygw: testenv.Bin(t, "versitygw"), Dir: t.TempDir(),
		DaemonArgs:     []string{"--reserve", "0", "--reserve-fraction", "0", "--containerd", "off"},
		SwarmArgs:      []string{"--gossip", "{ip}:7946", "--join", "{seed}:7946", "--cluster-key-file", "{keyfile}", "--p2p", "{ip}:7947"},
		ClusterKeyFile: writeKey(t, "cluster.key"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	if err := res.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("bench fleet, Hub origin:\n%s", buf.String())
	swarm := res.Modes[0]
	if res.Origin != "hf" || swarm.Mode != "swarm" || !swarm.Available || res.S3EgressRatio == nil {
		t.Fatalf("result %+v, want the swarm measured from the Hub", res)
	}
	if r := *res.S3EgressRatio; r < 1 || r > 1.5 {
		t.Errorf("Hub egress ratio %.2f, want about 1", r)
	}
	var hub, peer int64
	for _, h := range swarm.Hosts {
		hub, peer = hub+h.S3Bytes, peer+*h.PeerBytes
	}
	if peer <= 0 || hub+peer < hosts*size {
		t.Errorf("%d hosts read %d bytes from the Hub and %d from peers, want peer bytes and %d bytes in all", len(swarm.Hosts), hub, peer, hosts*size)
	}
	if u := swarm.S3Link; u == nil || u.SentBytes < size {
		t.Errorf("the Hub host's link %+v, want at least the model sent", u)
	}
}
