package cli

import (
	"context"
	"log/slog"

	"github.com/warmfleet/warmfleet/internal/hforigin"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/torrentorigin"
	"github.com/warmfleet/warmfleet/origin"
)

// origins are the settings of the daemon's origins, one per source scheme.
type origins struct {
	s3 s3origin.Options
	hf hforigin.Options
}

// hubOptions reads the Hub's endpoint and token: the flags, else the
// environment huggingface_hub reads (HF_ENDPOINT, HF_TOKEN, HF_TOKEN_PATH,
// HF_HOME).
func hubOptions(f *daemonFlags, getenv func(string) string) (hforigin.Options, error) {
	opts := hforigin.Options{Endpoint: f.hfEndpoint}
	if f.hfTokenFile != "" {
		tok, err := hforigin.ReadTokenFile(f.hfTokenFile)
		if err != nil {
			return opts, usageError("--hf-token-file: %v", err)
		}
		opts.Token = tok
	}
	opts, err := opts.FromGetenv(getenv)
	if err != nil {
		return opts, usageError("hub token: %v", err)
	}
	return opts, nil
}

// build makes the origins, with the daemon's part size and concurrency
// (the part is the unit of resume, whatever the source) and onBytes
// counting what each reads by source kind; closeAll stops those that hold
// resources (the BitTorrent client).
func (o origins) build(ctx context.Context, log *slog.Logger, f *daemonFlags, onBytes func(kind string, n int)) (mux origin.Mux, closeAll func() error, err error) {
	o.s3.Concurrency, o.s3.PartSize = f.s3Concurrency, int64(f.partSize)
	o.s3.Logger = log.With("component", "s3")
	o.s3.OnBytes = func(n int) { onBytes("s3", n) }
	s3c, err := s3origin.New(ctx, o.s3)
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	o.hf.Concurrency, o.hf.PartSize = f.s3Concurrency, int64(f.partSize)
	o.hf.Logger = log.With("component", "hf")
	o.hf.OnBytes = func(n int) { onBytes("hf", n) }
	hfc, err := hforigin.New(o.hf)
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	s3o := s3origin.AsOrigin(s3c)
	topts := f.torrent.options(f.dataDir)
	topts.PartSize, topts.Concurrency, topts.S3 = int64(f.partSize), f.s3Concurrency, s3o
	topts.Logger = log.With("component", "torrent")
	topts.OnBytes = func(n int) { onBytes("torrent", n) }
	tc, err := torrentorigin.New(topts)
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	return origin.Mux{"s3": s3o, "hf": hfc, "magnet": tc, "torrent": tc}, tc.Close, nil
}
