package lab

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/lab/s3bench"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
)

// runBenchS3 measures caching a model from a local S3 server with the
// daemon against the s3origin library, a plain SDK copy and rclone in the
// same run, then reading the cache back against a dd copy (see
// internal/lab/s3bench).
func runBenchS3(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "bench s3")
	modelSize := cli.ByteSize(2 << 30)
	fs.Var(&modelSize, "model-size", "model size, split evenly over --files")
	files := fs.Int("files", 4, "safetensors files in the model")
	runs := fs.Int("runs", 3, "runs per method; the figures are medians")
	methods := cli.ListFlag{}
	fs.Var(&methods, "methods", "methods to compare, comma-separated: "+strings.Join(s3bench.AllMethods(), ",")+" (default all)")
	concurrency := fs.Int("concurrency", s3origin.DefaultConcurrency, "parallel ranged GETs per file for the daemon, s3origin and plain")
	partSize := cli.ByteSize(s3origin.DefaultPartSize)
	fs.Var(&partSize, "part-size", "ranged-GET part size for the daemon, s3origin and plain")
	var daemonArgs cli.ListFlag
	fs.Var(&daemonArgs, "daemon-arg", "extra flag for the daemon, e.g. --daemon-arg=--file-concurrency=4 (repeatable)")
	daemonBin := fs.String("daemon-bin", "", "warmfleet binary the daemon method runs (default: this one)")
	readBack := fs.Bool("read-back", true, "also compare reading the daemon's cache with a dd copy")
	readRuns := fs.Int("read-runs", 5, "reads of each copy per reader in the read-back")
	dropCaches := fs.Bool("drop-caches", true, "drop the page cache before every read-back (root only), so reads come from the disk")
	pause := fs.Duration("pause", time.Second, "pause before each run, after deleting the previous output (0: none)")
	dir := fs.String("dir", "", "work directory for the S3 data and the copies, about 4x --model-size free (default: a temporary directory, removed)")
	output := fs.String("o", "table", "output format: table or json")
	verbose := fs.Bool("v", false, "log progress to stderr")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if err := checkBenchS3Flags(int64(modelSize), *files, *runs, *concurrency, int64(partSize), methods, *output); err != nil {
		return err
	}
	if *readRuns < 1 || *readRuns > 100 {
		return cli.UsageError("--read-runs %d: want 1..100", *readRuns)
	}
	if len(methods) == 0 {
		methods = s3bench.AllMethods()
	}
	if *daemonBin == "" && slices.Contains(methods, s3bench.MethodDaemon) {
		bin, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own binary for the daemon: %w", err)
		}
		*daemonBin = bin
	}
	switch {
	case *pause < 0:
		return cli.UsageError("--pause %v: want 0 or more", *pause)
	case *pause == 0:
		*pause = -1 // the library's "none"
	}
	workDir := *dir
	if workDir == "" {
		tmp, err := os.MkdirTemp("", "warmfleet-bench-s3-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		workDir = tmp
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	rep, err := s3bench.Run(ctx, s3bench.Config{
		Dir: workDir, Size: int64(modelSize), Shards: *files, Runs: *runs,
		Concurrency: *concurrency, PartSize: int64(partSize), Methods: methods,
		DaemonBin: *daemonBin, DaemonArgs: daemonArgs, ReadBack: *readBack, KeepPageCache: !*dropCaches, ReadRuns: *readRuns, Pause: *pause,
		Logger: slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: level})),
	})
	if err != nil {
		return err
	}
	if *output == "json" {
		return rep.WriteJSON(e.Stdout)
	}
	return rep.WriteText(e.Stdout)
}

// checkBenchS3Flags turns bad flag values into usage errors before anything
// starts.
func checkBenchS3Flags(size int64, files, runs, concurrency int, partSize int64, methods []string, output string) error {
	switch {
	case size < int64(files)*2 || size > synthmodel.MaxSize:
		return cli.UsageError("--model-size %d: want at least 2 bytes per file and at most %d", size, int64(synthmodel.MaxSize))
	case files < 1 || files > synthmodel.MaxShards:
		return cli.UsageError("--files %d: want 1..%d", files, synthmodel.MaxShards)
	case runs < 1 || runs > 100:
		return cli.UsageError("--runs %d: want 1..100", runs)
	case concurrency < 1 || concurrency > 256:
		return cli.UsageError("--concurrency %d: want 1..256", concurrency)
	case partSize < 1<<20 || partSize > 1<<30:
		return cli.UsageError("--part-size %d: want 1MiB..1GiB (the daemon's range)", partSize)
	case output != "table" && output != "json":
		return cli.UsageError("-o %q: want table or json", output)
	}
	seen := map[string]bool{}
	for _, m := range methods {
		if !slices.Contains(s3bench.AllMethods(), m) {
			return cli.UsageError("--methods: unknown method %q (want some of %s)", m, strings.Join(s3bench.AllMethods(), ","))
		}
		if seen[m] {
			return cli.UsageError("--methods: %q given twice", m)
		}
		seen[m] = true
	}
	return nil
}
