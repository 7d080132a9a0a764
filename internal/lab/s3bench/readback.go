package s3bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// ReadBack compares reading the daemon's cached files with reading a copy
// of the same bytes written by dd: the cache's layout (files written by
// parallel ranged parts into preallocated space, then renamed into place)
// must not cost a serving framework read speed.
type ReadBack struct {
	Bytes int64
	// Cold is true when the page cache was dropped before every read, so
	// the figures are the disk's; otherwise Note says why not and both
	// sides are read from memory.
	Cold      bool
	Note      string
	DDCommand string
	Runs      int
	Readers   []ReaderResult
	// Extents of the cached and the dd copy (all files, from filefrag):
	// a layout the disk reads slower shows as many more extents. -1 when
	// filefrag could not tell.
	CachedExtents, DDExtents int
}

// ReaderResult is one way of reading, applied to both copies.
type ReaderResult struct {
	Reader     string // short name
	Detail     string // how it reads
	Cached, DD Result
}

// Ratio is the cached copy's throughput over the dd copy's (medians);
// the goal is >= 0.95.
func (r ReaderResult) Ratio() float64 { return speedup(r.Cached, r.DD) }

const (
	readChunk   = 16 << 20
	readWorkers = 4
)

// reader reads every file under root, returning the bytes read.
type reader struct {
	name, detail string
	read         func(ctx context.Context, root string, objs []s3origin.Object) (int64, error)
}

func readers() []reader {
	return []reader{
		{"sequential", fmt.Sprintf("one goroutine, %d MiB reads, one file after another", readChunk>>20), readSequential},
		{fmt.Sprintf("parallel-%d", readWorkers), fmt.Sprintf("%d goroutines taking %d MiB preads over all files, as a framework loading shards", readWorkers, readChunk>>20), readParallel},
	}
}

// readBack copies the cached files with dd into ddDir, then reads both
// copies with each reader, runs times, alternating which copy goes first.
func readBack(ctx context.Context, cfg Config, cached, ddDir string, objs []s3origin.Object) (*ReadBack, error) {
	if err := os.RemoveAll(ddDir); err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(ddDir) }()
	rb := &ReadBack{Cold: true, DDCommand: fmt.Sprintf("dd if=<cached file> of=<dd file> bs=%dM", readChunk>>20), Runs: cfg.ReadRuns}
	for _, o := range objs {
		rb.Bytes += o.Size
		if err := ddCopy(ctx, filepath.Join(cached, o.Path), filepath.Join(ddDir, o.Path)); err != nil {
			return nil, err
		}
	}
	rb.CachedExtents, rb.DDExtents = extents(ctx, cached, objs), extents(ctx, ddDir, objs)
	if cfg.KeepPageCache {
		rb.Cold = false
		rb.Note = "page cache kept (asked for): warm-cache figures, both copies read from memory"
	} else if err := dropCaches(); err != nil {
		rb.Cold = false
		rb.Note = fmt.Sprintf("page cache not dropped (%v; needs root): warm-cache figures, both copies read from memory", err)
	}
	for _, r := range readers() {
		res := ReaderResult{Reader: r.name, Detail: r.detail, Cached: Result{Method: "cached"}, DD: Result{Method: "dd"}}
		for run := range cfg.ReadRuns {
			sides := []struct {
				res  *Result
				root string
			}{{&res.Cached, cached}, {&res.DD, ddDir}}
			if run%2 == 1 {
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, side := range sides {
				if rb.Cold {
					if err := dropCaches(); err != nil {
						return nil, err
					}
				}
				start := time.Now()
				n, err := r.read(ctx, side.root, objs)
				d := time.Since(start)
				if err != nil {
					return nil, fmt.Errorf("%s read of %s: %w", r.name, side.root, err)
				}
				if n != rb.Bytes {
					return nil, fmt.Errorf("%s read %d bytes of %s, want %d", r.name, n, side.root, rb.Bytes)
				}
				cfg.Logger.Info("read-back run", "reader", r.name, "copy", side.res.Method, "run", run+1,
					"seconds", d.Seconds(), "MBps", mbps(n, d))
				side.res.Samples = append(side.res.Samples, Sample{Duration: d})
			}
		}
		rb.Readers = append(rb.Readers, res)
	}
	return rb, nil
}

func ddCopy(ctx context.Context, from, to string) error {
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "dd", "if="+from, "of="+to, fmt.Sprintf("bs=%dM", readChunk>>20), "status=none")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("dd %s: %w: %s", from, err, out)
	}
	return nil
}

// extents counts the extents of the files under root with filefrag; -1
// when it cannot tell (not installed, a file system without FIEMAP): the
// figure explains a result, it is not one.
func extents(ctx context.Context, root string, objs []s3origin.Object) int {
	bin, err := exec.LookPath("filefrag")
	if err != nil {
		return -1
	}
	args := make([]string, len(objs))
	for i, o := range objs {
		args[i] = filepath.Join(root, o.Path)
	}
	out, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		return -1
	}
	n, err := parseFilefrag(out, len(objs))
	if err != nil {
		return -1
	}
	return n
}

// parseFilefrag sums "PATH: N extent(s) found" lines, one per file.
func parseFilefrag(out []byte, files int) (int, error) {
	total, seen := 0, 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndex(line, ": ")
		if i < 0 {
			return 0, fmt.Errorf("filefrag: unexpected line %q", line)
		}
		f := strings.Fields(line[i+2:])
		if len(f) != 3 || (f[1] != "extents" && f[1] != "extent") || f[2] != "found" {
			return 0, fmt.Errorf("filefrag: unexpected line %q", line)
		}
		n, err := strconv.Atoi(f[0])
		if err != nil || n < 0 || n > 1<<30 {
			return 0, fmt.Errorf("filefrag: unexpected line %q", line)
		}
		total += n
		seen++
	}
	if seen != files {
		return 0, fmt.Errorf("filefrag: %d lines for %d files", seen, files)
	}
	return total, nil
}

// dropCaches writes dirty pages back and empties the page cache, so the
// next read comes from the disk.
func dropCaches() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return fmt.Errorf("drop page cache: %w", err)
	}
	return nil
}

func readSequential(ctx context.Context, root string, objs []s3origin.Object) (int64, error) {
	buf := make([]byte, readChunk)
	var total int64
	for _, o := range objs {
		f, err := os.Open(filepath.Join(root, o.Path))
		if err != nil {
			return total, err
		}
		for {
			if err := ctx.Err(); err != nil {
				_ = f.Close()
				return total, err
			}
			n, err := f.Read(buf)
			total += int64(n)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = f.Close()
				return total, err
			}
		}
		if err := f.Close(); err != nil {
			return total, err
		}
	}
	return total, nil
}

type chunk struct {
	file     int
	off, len int64
}

func readParallel(ctx context.Context, root string, objs []s3origin.Object) (int64, error) {
	files := make([]*os.File, len(objs))
	defer func() {
		for _, f := range files {
			if f != nil {
				_ = f.Close()
			}
		}
	}()
	var chunks []chunk
	for i, o := range objs {
		f, err := os.Open(filepath.Join(root, o.Path))
		if err != nil {
			return 0, err
		}
		files[i] = f
		for off := int64(0); off < o.Size; off += readChunk {
			chunks = append(chunks, chunk{i, off, min(readChunk, o.Size-off)})
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan chunk)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	for range readWorkers {
		wg.Go(func() {
			buf := make([]byte, readChunk)
			for c := range work {
				n, err := files[c.file].ReadAt(buf[:c.len], c.off)
				mu.Lock()
				total += int64(n)
				mu.Unlock()
				if err != nil && !(errors.Is(err, io.EOF) && int64(n) == c.len) {
					cancel(err)
					return
				}
			}
		})
	}
feed:
	for _, c := range chunks {
		select {
		case work <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return total, context.Cause(ctx)
}
