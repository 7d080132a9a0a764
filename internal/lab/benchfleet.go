package lab

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/integration/fleetbench"
	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/internal/cli"
)

// runBenchFleet builds a fleet of network-namespace hosts on shaped links
// with an S3 host (serving the model, or with --origin hf running a Hub
// that does), warms a model on every host and prints the figures (see
// integration/fleetbench). It needs root.
func runBenchFleet(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "bench fleet")
	hosts := fs.Int("hosts", 8, "hosts in the fleet, each a network namespace with its own daemon")
	link := 200 * netlab.Mbit
	fs.Var(&link, "link", "every host's link rate, both directions (200mbit, 1gbit, ...)")
	var s3Link netlab.Rate
	fs.Var(&s3Link, "s3-link", "the S3 host's link rate (default: --link)")
	mtu := fs.Int("mtu", 0, "every link's MTU, e.g. 9000 for jumbo frames as in most GPU clusters (default: 1500)")
	modelSize := cli.ByteSize(1 << 30)
	fs.Var(&modelSize, "model-size", "model size, split evenly over --files")
	files := fs.Int("files", 4, "files in the model")
	runs := fs.Int("runs", 1, "runs per mode; the figures are medians")
	hostProcs := fs.Int("host-procs", 1, "every daemon's GOMAXPROCS: the hosts share this machine's cores, as daemons under a CPU limit share a node's (0: Go's default, all cores)")
	runTimeout := fs.Duration("run-timeout", 0, "give up a warm-up after this long (0: twice the lower bound per 4 hosts, plus 2m)")
	settle := fs.Duration("settle", 10*time.Second, "pause before each warm-up, once the previous run's data is deleted (0: back to back)")
	output := fs.String("o", "table", "output format: table or json")
	var daemonArgs cli.ListFlag
	fs.Var(&daemonArgs, "daemon-arg", "extra flag for every daemon, e.g. --daemon-arg=--s3-concurrency=8 (repeatable)")
	versitygw := fs.String("versitygw", "", "versitygw binary for the S3 host (default: ./bin/versitygw, else PATH)")
	dir := fs.String("dir", "", "keep data and daemon logs here (default: a temporary directory, removed)")
	plot := fs.String("plot", "", "also write a timeline plot (bytes received per host over time) to this SVG file")
	cpuProfile := fs.String("cpu-profile", "", "every daemon writes a CPU profile of its life to cpu-PID.pprof in this directory (created)")
	verbose := fs.Bool("v", false, "log progress to stderr")
	naiveOnly := fs.Bool("naive-only", false, "measure only the baseline (every host from S3)")
	swarmOnly := fs.Bool("swarm-only", false, "measure only the swarm (the baseline takes hosts times longer)")
	scaleOut := fs.Bool("scale-out", false, "also time the last host joining the others once they are warm (swarm)")
	origin := fs.String("origin", "s3", "where the model comes from: s3 (versitygw) or hf (a Hugging Face Hub and its CDN, in memory, on the S3 host's link: the S3 figures are then the Hub's)")
	keepAlive := fs.Bool("s3-keep-alive", false, "put a keep-alive HTTP front before versitygw, which closes every connection after one response where S3 keeps it open (origin s3)")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if *mtu != 0 && (*mtu < 576 || *mtu > 65535) {
		return cli.UsageError("--mtu %d: want 576..65535", *mtu)
	}
	if *hostProcs < 0 {
		return cli.UsageError("--host-procs %d: want 0 or more", *hostProcs)
	}
	if *runTimeout < 0 {
		return cli.UsageError("--run-timeout %v: want 0 or more", *runTimeout)
	}
	if *settle < 0 {
		return cli.UsageError("--settle %v: want 0 or more", *settle)
	}
	if *origin != "s3" && *origin != "hf" {
		return cli.UsageError("--origin %q: want s3 or hf", *origin)
	}
	if *keepAlive && *origin != "s3" {
		return cli.UsageError("--s3-keep-alive applies to --origin s3 (the Hub's CDN keeps connections alive)")
	}
	if *output != "table" && *output != "json" {
		return cli.UsageError("-o %q: want table or json", *output)
	}
	if err := checkOutput("plot", *plot, true); err != nil {
		return err
	}
	if warn := uploadOverLink(daemonArgs, link); warn != "" {
		fmt.Fprintln(e.Stderr, "bench fleet: warning:", warn)
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary for the daemons: %w", err)
	}
	*versitygw = labVersitygw(*versitygw)
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	var sampleEvery time.Duration
	if *plot != "" {
		sampleEvery = 500 * time.Millisecond
	}
	opts := fleetbench.Options{
		Hosts: *hosts, Link: link, S3Link: s3Link, MTU: *mtu, ModelSize: int64(modelSize), Files: *files, Runs: *runs,
		Bin: bin, Versitygw: *versitygw, Origin: *origin, S3KeepAlive: *keepAlive, DaemonArgs: append([]string{"--containerd", "off"}, daemonArgs...), Dir: *dir,
		HostProcs: *hostProcs, Settle: *settle, RunTimeout: *runTimeout, SampleEvery: sampleEvery, PeerBytesMetric: `warmfleet_peer_bytes_total{direction="in"}`,
		Logger: slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if *naiveOnly && *swarmOnly {
		return cli.UsageError("--naive-only and --swarm-only exclude each other")
	}
	opts.SkipNaive, opts.ScaleOut = *swarmOnly, *scaleOut
	if *cpuProfile != "" {
		abs, err := filepath.Abs(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		opts.DaemonEnv = []string{CPUProfileEnv + "=" + abs}
	}
	if !*naiveOnly {
		keyDir, err := os.MkdirTemp("", "warmfleet-bench-key-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(keyDir)
		key, err := gossip.GenerateKey()
		if err != nil {
			return err
		}
		opts.ClusterKeyFile = filepath.Join(keyDir, "cluster.key")
		if err := os.WriteFile(opts.ClusterKeyFile, []byte(gossip.EncodeKey(key)+"\n"), 0o600); err != nil {
			return err
		}
		opts.SwarmArgs = []string{"--gossip", "{ip}:7946", "--join", "{seed}:7946", "--cluster-key-file", "{keyfile}", "--p2p", "{ip}:7947"}
	}
	res, err := fleetbench.Run(ctx, opts)
	if err != nil {
		return err
	}
	// The figures first: a plot that cannot be written loses only itself.
	write := res.WriteTable
	if *output == "json" {
		write = res.WriteJSON
	}
	if err := write(e.Stdout); err != nil {
		return err
	}
	if *plot != "" {
		return writeSVGFile(*plot, res)
	}
	return nil
}

// checkOutput refuses, before a run of minutes, a file a bench writes
// only at its end: one whose directory does not exist, or a plot (svg)
// whose name does not end in .svg. An empty path is no file.
func checkOutput(flag, path string, svg bool) error {
	if path == "" {
		return nil
	}
	if svg && !strings.HasSuffix(strings.ToLower(path), ".svg") {
		return cli.UsageError("--%s writes SVG: the file name must end in .svg", flag)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return cli.UsageError("--%s %s: its directory does not exist", flag, path)
	}
	return nil
}

// uploadOverLink says what is wrong when the daemons' --p2p-upload-limit
// (the last one given in args) lets a host send faster than its link: the
// kernel paces each upload at its share of the limit, not of the link, so
// the link's shaper drops what goes beyond it, everything crossing that
// link loses packets with it, and the warm-up measures the retransmits.
// Empty when the limit is under the link, unset or unparsable (the daemons
// then say so themselves).
func uploadOverLink(args []string, link netlab.Rate) string {
	var limit int64
	for i, a := range args {
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "p2p-upload-limit" {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				continue
			}
			v = args[i+1]
		}
		if n, err := bytesize.Parse(v); err == nil {
			limit = n
		}
	}
	if link == 0 || limit <= 0 || float64(limit) <= link.BytesPerSecond() {
		return ""
	}
	return fmt.Sprintf("--p2p-upload-limit %s is %.1f Mbit/s, above the %s link (%.2f MB/s): the link's shaper drops what the hosts send beyond it; set it a little under the link rate", bytesize.Format(limit), float64(limit)*8/1e6, link, link.BytesPerSecond()/1e6)
}

// labVersitygw is the versitygw a lab bench runs: the --versitygw flag's
// value if given, else ./bin/versitygw (make deps puts it there), else the
// one in PATH.
func labVersitygw(flag string) string {
	if flag != "" {
		return flag
	}
	if st, err := os.Stat(filepath.Join("bin", "versitygw")); err == nil && !st.IsDir() {
		if abs, err := filepath.Abs(filepath.Join("bin", "versitygw")); err == nil {
			return abs
		}
	}
	return "versitygw"
}

func writeSVGFile(path string, res fleetbench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if err := res.WriteSVG(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("plot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}
