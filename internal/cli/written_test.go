package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestWrittenBytesCountSwarmFills: with the swarm on, each node's
// warmfleet_cache_written_bytes_total counts the model it wrote, the parts
// it read from S3 and the parts it took from peers alike. Only the direct
// S3 download used to count its writes, so a node that filled through the
// swarm counted none.
func TestWrittenBytesCountSwarmFills(t *testing.T) {
	model, socks, metricsAddrs := startSwarmFleet(t, 2, synthmodel.Options{Seed: 25, Size: 12 << 20, Shards: 2})
	var metrics []string
	for _, addr := range metricsAddrs {
		metrics = append(metrics, "http://"+addr+"/metrics")
	}
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	metric := func(url, name string) (float64, bool) {
		resp, err := cl.Get(url)
		if err != nil {
			return 0, false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
		if m == nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		return v, err == nil
	}
	for _, url := range metrics {
		wait.For(t, "both members alive", func() bool {
			v, ok := metric(url, `warmfleet_gossip_members{state="alive"}`)
			return ok && v == 2
		})
	}
	if code, stderr := runBounded(t, socks[0], "cache", "add", "tiny", "--source", "s3://models/tiny/"); code != 0 {
		t.Fatalf("cache add: exit %d: %s", code, stderr)
	}
	for _, sock := range socks {
		if code, stderr := runBounded(t, sock, "cache", "add", "tiny", "--source", "s3://models/tiny/", "--wait", "--timeout", "90s"); code != 0 {
			t.Fatalf("waiting on %s: exit %d: %s", sock, code, stderr)
		}
	}
	var peerIn float64
	for i, url := range metrics {
		written, _ := metric(url, "warmfleet_cache_written_bytes_total")
		in, _ := metric(url, `warmfleet_peer_bytes_total{direction="in"}`)
		peerIn += in
		// A piece that failed its check, or came twice at the end of a
		// fetch, is written twice: a little more than the model.
		if size := float64(model.TotalSize()); written < size || written > 1.1*size {
			t.Errorf("node-%d wrote %.0f bytes into its cache (%.0f from peers), want about the model's %.0f", i+1, written, in, size)
		}
	}
	if peerIn == 0 {
		t.Errorf("no node took bytes from a peer: the swarm was not used")
	}
}

// startSwarmFleet uploads a synthetic model as s3://models/tiny/ to a real
// S3 server (its settings in the environment) and runs n daemons that
// gossip with the cluster key and swarm on loopback, each with a metrics
// listener. It returns the model, the daemons' API and metrics addresses.
func startSwarmFleet(t *testing.T, n int, opts synthmodel.Options) (model *synthmodel.Model, socks, metrics []string) {
	t.Helper()
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	model, err := synthmodel.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.Upload(t.Context(), func(ctx context.Context, key string, r io.Reader, size int64) error {
		return s3.Put(ctx, "models", "tiny/"+key, r, size)
	}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, err := gossip.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "cluster.key")
	if err := gossip.WriteKeyFile(keyFile, [][]byte{key}); err != nil {
		t.Fatal(err)
	}
	seed := testenv.FreeAddr(t)
	for i := range n {
		name := fmt.Sprintf("node-%d", i+1)
		gossipAddr := seed
		if i > 0 {
			gossipAddr = testenv.FreeAddr(t)
		}
		sock := "unix://" + filepath.Join(dir, name+".sock")
		metricsAddr := testenv.FreeAddr(t)
		launchDaemon(t, os.Getenv, "--node-name", name, "--data-dir", filepath.Join(dir, name), "--api", sock,
			"--metrics-listen", metricsAddr, "--gossip", gossipAddr, "--join", seed, "--cluster-key-file", keyFile,
			"--p2p", testenv.FreeAddr(t), "--containerd", "off", "--reserve", "0", "--reserve-fraction", "0")
		socks, metrics = append(socks, sock), append(metrics, metricsAddr)
	}
	return model, socks, metrics
}
