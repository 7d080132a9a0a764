package lab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

func simFlags(fs *flag.FlagSet, c *llmsim.Config) {
	fs.StringVar(&c.Model, "model", c.Model, "model name served")
	fs.IntVar(&c.KVBlocks, "kv-blocks", c.KVBlocks, "KV cache capacity in blocks")
	fs.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "tokens per KV block")
	fs.IntVar(&c.MaxSeqs, "max-seqs", c.MaxSeqs, "concurrent sequences")
	fs.IntVar(&c.CharsPerToken, "chars-per-token", c.CharsPerToken, "prompt bytes per token")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", c.PrefillPerToken, "simulated prefill time per uncached prompt token")
	fs.DurationVar(&c.DecodePerToken, "decode-per-token", c.DecodePerToken, "simulated time per output token")
	fs.BoolVar(&c.SideBySide, "side-by-side-prefill", c.SideBySide, "prefill every admitted sequence on its own clock, as llm-d-inference-sim does, instead of on one prefill stream as vLLM's scheduler does")
}

func runLLMSim(ctx context.Context, e *cli.Env, args []string) error {
	fs := cli.NewFlagSet(e, "llmsim")
	cfg := llmsim.Defaults()
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve on")
	simFlags(fs, &cfg)
	fs.IntVar(&cfg.DefaultMaxTok, "default-max-tokens", cfg.DefaultMaxTok, "output tokens when a request names none")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "run simulated time this many times faster than real time")
	fs.DurationVar(&cfg.ChunkInterval, "chunk-interval", cfg.ChunkInterval, "coalesce streamed tokens into one event per this much wall time (0: per token)")
	fs.Float64Var(&cfg.LoadFactor, "time-factor-under-load", 1, "how many times slower decode (and side-by-side prefill) is with every sequence slot busy than with one, as llm-d-inference-sim's flag of that name")
	if err := cli.ParseFlags(fs, e, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError("unexpected arguments %q", fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return cli.UsageError("%v", err)
	}
	s, err := llmsim.New(cfg, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	slog.New(slog.NewTextHandler(e.Stderr, nil)).Info("llmsim listening", "addr", l.Addr().String(), "model", cfg.Model)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
