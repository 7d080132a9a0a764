package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/lab/s3embed"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"github.com/warmfleet/warmfleet/nvme"
)

// runDemo shows the main job end to end with nothing installed: an S3 server
// embedded in the process, a synthetic model in it, a daemon caching it onto
// a temporary data directory with a live progress bar, and a check of what
// landed on disk; then a router that learns the node's inference endpoints
// from gossip and keeps each document's questions on one of them.
func runDemo(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "demo")
	var size cli.ByteSize = 256 << 20
	fs.Var(&size, "model-size", "size of the synthetic model")
	files := fs.Int("files", 4, "number of safetensors shards")
	dataDir := fs.String("data-dir", "", "data directory (default: a temporary one, removed at the end)")
	verbose := fs.Bool("v", false, "show the daemon's log")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	model, err := synthmodel.New(synthmodel.Options{Seed: 1, Size: int64(size), Shards: *files, Name: "demo-llama"})
	if err != nil {
		return cli.UsageError("%v", err)
	}
	work, err := os.MkdirTemp("", "warmfleet-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if *dataDir == "" {
		*dataDir = filepath.Join(work, "data")
	}

	say := func(format string, a ...any) { fmt.Fprintf(e.Stdout, "==> "+format+"\n", a...) }
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	srv, err := s3embed.Start(ctx, "127.0.0.1:0", s3embed.Options{})
	if err != nil {
		return err
	}
	defer srv.Close()
	say("embedded S3 server at %s", srv.Endpoint())
	if err := srv.CreateBucket(ctx, "models"); err != nil {
		return err
	}
	if err := model.Upload(ctx, func(ctx context.Context, key string, r io.Reader, n int64) error {
		return srv.PutObject(ctx, "models", "demo-llama/"+key, r, n)
	}); err != nil {
		return err
	}
	say("wrote a synthetic model to s3://models/demo-llama/: %d files, %s", len(model.Files()), bytesize.Format(model.TotalSize()))

	// A fleet of one, on loopback, so the router can join it.
	key, err := gossip.GenerateKey()
	if err != nil {
		return err
	}
	apiAddr, keyFile := "unix://"+filepath.Join(work, "api.sock"), filepath.Join(work, "cluster.key")
	if err := os.WriteFile(keyFile, []byte(gossip.EncodeKey(key)+"\n"), 0o600); err != nil {
		return err
	}
	logOut := io.Discard
	if *verbose {
		logOut = e.Stderr
	}
	started := make(chan struct{})
	daemonErr := make(chan error, 1)
	go func() {
		// No WARMFLEET_* settings: the demo's daemon is the one described here.
		daemonErr <- cli.ServeDaemon(ctx, &cli.Env{Stdout: logOut, Stderr: logOut, Getenv: func(string) string { return "" }}, []string{
			"--data-dir", *dataDir, "--api", apiAddr, "--reserve", "0", "--reserve-fraction", "0", "--node-name", "demo-node",
			"--gossip", "127.0.0.1:0", "--cluster-key-file", keyFile,
		}, s3origin.Options{Endpoint: srv.Endpoint(), Credentials: srv.Credentials(), Region: s3embed.Region}, func() { close(started) })
	}()
	select {
	case <-started:
	case err := <-daemonErr:
		return fmt.Errorf("daemon: %w", err)
	}
	addr := apiAddr
	say("daemon running on %s, data dir %s", addr, *dataDir)

	cl, err := api.NewClient(apiAddr, "")
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := cl.AddCache(ctx, api.AddCacheRequest{Name: "demo/llama", Source: "s3://models/demo-llama/"}); err != nil {
		return err
	}
	say("warmfleet cache add demo/llama --source s3://models/demo-llama/ --wait")
	st, err := cli.WaitReady(ctx, e, cl, "demo/llama")
	if err != nil {
		return err
	}
	elapsed := time.Since(start)

	if err := checkDemo(st, model); err != nil {
		return fmt.Errorf("verification: %w", err)
	}
	metrics, err := cl.Metrics(ctx)
	if err != nil {
		return err
	}
	s3Bytes := metricValue(metrics, "warmfleet_s3_bytes_total")
	say("verified: every file is a complete safetensors file identical to the source")
	rr, err := demoRouter(ctx, e, say, cl, "demo/llama", keyFile, logOut)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	fmt.Fprintf(e.Stdout, "\nsummary\n")
	fmt.Fprintf(e.Stdout, "  model          demo/llama, %d files, %s\n", st.Files, bytesize.Format(st.BytesTotal))
	fmt.Fprintf(e.Stdout, "  revision       %s\n", st.RevisionID)
	fmt.Fprintf(e.Stdout, "  ready at       %s\n", st.Path)
	fmt.Fprintf(e.Stdout, "  current link   %s\n", filepath.Join(filepath.Dir(st.Path), nvme.CurrentLink))
	fmt.Fprintf(e.Stdout, "  time to ready  %s (%s/s)\n", elapsed.Round(time.Millisecond), bytesize.Format(int64(float64(st.BytesTotal)/elapsed.Seconds())))
	fmt.Fprintf(e.Stdout, "  bytes from S3  %s (warmfleet_s3_bytes_total; the model is %d bytes)\n", s3Bytes, st.BytesTotal)
	affinity := "each document's questions stayed on one server"
	if !rr.stayed {
		affinity = "some documents' questions moved between servers"
	}
	fmt.Fprintf(e.Stdout, "  router         %d requests over %d servers; %s\n", rr.requests, rr.servers, affinity)
	fmt.Fprintf(e.Stdout, "  prefix cache   %d of %d prompt tokens (%.0f%%) served from the servers' caches (each document's first question misses)\n",
		rr.cachedTokens, rr.promptTokens, 100*float64(rr.cachedTokens)/float64(max(rr.promptTokens, 1)))

	cancel()
	if err := <-daemonErr; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("daemon: %w", err)
	}
	return nil
}

// checkDemo checks the cached revision against the synthetic model: every
// file present, parseable and byte-identical.
func checkDemo(st api.CacheStatus, model *synthmodel.Model) error {
	if !st.Ready {
		return fmt.Errorf("cache not ready: %+v", st)
	}
	for _, f := range model.Files() {
		path := filepath.Join(st.Path, f.Name)
		if strings.HasSuffix(f.Name, ".safetensors") {
			if _, err := synthmodel.CheckFile(path); err != nil {
				return err
			}
		}
		if err := sameContent(path, f.Open()); err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
	}
	return nil
}

func sameContent(path string, want io.Reader) error {
	got, err := os.Open(path)
	if err != nil {
		return err
	}
	defer got.Close()
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; {
		n, errA := io.ReadFull(got, a)
		m, errB := io.ReadFull(want, b)
		if n != m || string(a[:n]) != string(b[:m]) {
			return fmt.Errorf("differs from the source near byte %d", off)
		}
		off += int64(n)
		if errA != nil || errB != nil {
			if (errA == io.EOF || errA == io.ErrUnexpectedEOF) && (errB == io.EOF || errB == io.ErrUnexpectedEOF) {
				return nil
			}
			return errors.Join(errA, errB)
		}
	}
}

// metricValue finds an unlabelled sample in a Prometheus text exposition.
func metricValue(text, name string) string {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return strconv.FormatFloat(f, 'f', -1, 64)
			}
			return v
		}
	}
	return "?"
}
