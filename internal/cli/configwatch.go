package cli

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"time"
)

// watchConfigFile re-reads path every interval and calls reload when its
// content differs from the last content seen, until ctx ends. It compares
// content, not modification times, because a Kubernetes ConfigMap volume
// changes by swapping a symlink to a new directory: the path's content
// changes while nothing is written to it. A failed reload is logged and
// the running configuration kept; the same content is not tried again
// until it changes once more. loaded is the digest of the content the
// running configuration came from, read before it was loaded: the file may
// change before the watcher first looks.
func watchConfigFile(ctx context.Context, path string, loaded [sha256.Size]byte, interval time.Duration, reload func() error, log *slog.Logger) {
	last := loaded
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := fileDigest(path)
		if err != nil {
			// Mid-swap or removed: keep the running configuration and look
			// again next tick.
			log.Warn("config file unreadable; keeping the running configuration", "path", path, "err", err)
			continue
		}
		if cur == last {
			continue
		}
		last = cur
		if err := reload(); err != nil {
			log.Error("config file changed but does not load; keeping the running configuration", "path", path, "err", err)
			continue
		}
		log.Info("config file changed: reloaded", "path", path)
	}
}

func fileDigest(path string) ([sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}
