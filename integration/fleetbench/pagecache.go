package fleetbench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/warmfleet/warmfleet/internal/procstat"
)

// PageCache is what writing through this machine's page cache costs the
// writer, measured once before the runs: every host writes the whole model
// through it. On a VM whose host takes freed guest memory back (virtio
// balloon free page reporting) a write into memory freed a while ago is a
// fault the host must serve, many times what writing a page the guest
// still holds costs. Each run deletes the last one's data and pauses
// (Options.Settle) before it starts, so its hosts pay that for every byte
// they cache, on the cores the daemons use: it is in the warm-up figures
// of such a machine and in none on a node that keeps its memory.
type PageCache struct {
	Bytes int64 `json:"bytes"`
	// AfterPauseCPUSecondsPerGiB is the CPU time of a write into memory
	// freed one settle pause before, as a run's first writes are.
	AfterPauseCPUSecondsPerGiB float64 `json:"after_pause_cpu_s_per_gib"`
	// AtOnceCPUSecondsPerGiB is the same write at once after deleting the
	// last: into pages the guest has just freed and still holds.
	AtOnceCPUSecondsPerGiB float64 `json:"at_once_cpu_s_per_gib"`
	// FreePageReporting says whether the guest reports free memory to its
	// host; null where no virtio balloon driver is bound.
	FreePageReporting *bool `json:"free_page_reporting"`
}

// pageCacheProbe is how much measurePageCache writes each time (less for a
// smaller model): enough to see the cost per page, little beside a model.
const pageCacheProbe = 256 << 20

// measurePageCache writes a file of size bytes in dir and deletes it, then
// after pause writes it again (AfterPause) and, deleting it, once more at
// once (AtOnce); it leaves nothing behind. The first write only frees
// memory for the second, whatever the kernel had free before.
func measurePageCache(ctx context.Context, dir string, size int64, pause time.Duration) (PageCache, error) {
	pc := PageCache{Bytes: size, FreePageReporting: freePageReporting()}
	path := filepath.Join(dir, "page-cache-probe")
	defer os.Remove(path)
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for pass, dst := range []*float64{nil, &pc.AfterPauseCPUSecondsPerGiB, &pc.AtOnceCPUSecondsPerGiB} {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return pc, fmt.Errorf("page cache probe: %w", err)
		}
		if pass == 1 {
			select {
			case <-ctx.Done():
				return pc, context.Cause(ctx)
			case <-time.After(pause):
			}
		}
		before, err := procstat.CPU(0)
		if err != nil {
			return pc, err
		}
		if err := writeProbe(path, buf, size); err != nil {
			return pc, fmt.Errorf("page cache probe, pass %d: %w", pass+1, err)
		}
		after, err := procstat.CPU(0)
		if err != nil {
			return pc, err
		}
		if dst != nil {
			*dst = (after - before).Seconds() / (float64(size) / (1 << 30))
		}
	}
	return pc, nil
}

func writeProbe(path string, buf []byte, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	for n := int64(0); n < size; n += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-n)]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// balloonFeatures is where the bound virtio balloon devices list their
// negotiated features, one character per bit.
var balloonFeatures = "/sys/bus/virtio/drivers/virtio_balloon/virtio*/features"

// freePageReporting reads whether a bound virtio balloon negotiated
// VIRTIO_BALLOON_F_REPORTING (bit 5); nil if none is bound.
func freePageReporting() *bool {
	paths, _ := filepath.Glob(balloonFeatures)
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || len(b) < 6 {
			continue
		}
		on := b[5] == '1'
		return &on
	}
	return nil
}
