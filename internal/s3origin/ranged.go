package s3origin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/origin"
)

// The ranged-download machinery of this file is shared with
// internal/hforigin: both origins split a file into the same parts, fetch
// them with a pool of workers, resume a range at the byte where it broke,
// back off with jitter and account the bytes the same way. Only the request
// that opens a range, and which errors are worth a retry, differ.

// bufSize is each worker's copy buffer: memory stays Concurrency*bufSize
// whatever the part and object sizes.
const bufSize = 1 << 20

// Parts is origin.Parts.
func Parts(size, partSize int64) int { return origin.Parts(size, partSize) }

// PartRange is origin.PartRange.
func PartRange(part int, size, partSize int64) (off, n int64) {
	return origin.PartRange(part, size, partSize)
}

// FetchParts calls fetch for each part with concurrency workers, each with
// its own copy buffer; the first failure stops the others and is returned.
// A cancelled ctx is reported as "download name: ...".
func FetchParts(ctx context.Context, concurrency int, name string, parts []int, fetch func(ctx context.Context, part int, buf []byte) error) error {
	err := eachPart(ctx, concurrency, bufSize, parts, fetch)
	if contextError(err) != nil {
		return fmt.Errorf("download %s: %w", name, err)
	}
	return err
}

// eachPart runs fn for each part on workers goroutines, each with a buffer
// of bufLen bytes, and returns the first error (or ctx's cause).
func eachPart(ctx context.Context, workers, bufLen int, parts []int, fn func(ctx context.Context, part int, buf []byte) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(parts)) {
		wg.Go(func() {
			buf := make([]byte, bufLen)
			for part := range work {
				if err := fn(ctx, part, buf); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
feed:
	for _, part := range parts {
		select {
		case work <- part:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return context.Cause(ctx)
}

// Retrier runs a ranged transfer to its end, resuming each retry at the
// byte where the last attempt stopped.
type Retrier struct {
	// MaxAttempts bounds failures in a row without progress, so a flaky
	// link that keeps delivering still finishes.
	MaxAttempts int
	// Retryable tells the failures worth another attempt.
	Retryable func(error) bool
	// Delay is the wait before the retry after failures failures in a row.
	Delay func(err error, failures int) time.Duration
	// Explain wraps a final failure of what.
	Explain func(err error, what string) error
	// Sleep waits d or until ctx ends (nil: SleepCtx).
	Sleep  func(ctx context.Context, d time.Duration) error
	Logger *slog.Logger
	// Note is the log message of a retry ("retrying S3 range").
	Note string
}

// FetchRange fetches bytes [start, end): get fetches from off on and
// returns how many bytes it delivered, also when it fails.
func (r Retrier) FetchRange(ctx context.Context, start, end int64, what string, get func(off int64) (int64, error)) error {
	sleep := r.Sleep
	if sleep == nil {
		sleep = SleepCtx
	}
	failures := 0
	for off := start; off < end; {
		got, err := get(off)
		off += got
		if err == nil {
			continue
		}
		if !r.Retryable(err) {
			return r.Explain(err, what)
		}
		if got > 0 {
			failures = 0
		}
		failures++
		if failures >= r.MaxAttempts {
			return r.Explain(fmt.Errorf("giving up after %d attempts without progress: %w", failures, err), what)
		}
		delay := r.Delay(err, failures)
		r.Logger.Info(r.Note, "what", what, "resume_at", off, "attempt", failures+1, "delay", delay, "err", err)
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// Do runs try until it succeeds, fails for good or fails MaxAttempts
// times: a request that has no bytes to resume from.
func (r Retrier) Do(ctx context.Context, what string, try func() error) error {
	return r.FetchRange(ctx, 0, 1, what, func(int64) (int64, error) {
		if err := try(); err != nil {
			return 0, err
		}
		return 1, nil
	})
}

// SleepCtx waits d, or until ctx ends (returning its cause).
func SleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// Backoff is the delay before retry number attempt (1-based): exponential
// from base, capped at 64x, with "equal jitter" (half fixed, half random
// from r in [0,1)) so a fleet of workers throttled together does not come
// back together.
func Backoff(attempt int, base time.Duration, r float64) time.Duration {
	d := base << min(max(attempt-1, 0), 6)
	return d/2 + time.Duration(r*float64(d/2))
}

// ErrShortBody says a body ended before the promised length (retryable).
var ErrShortBody = errors.New("body ended early")

// LocalError marks a failure writing the local file: never retried.
type LocalError struct{ Err error }

func (e LocalError) Error() string { return e.Err.Error() }
func (e LocalError) Unwrap() error { return e.Err }

// CopyRange copies bytes [off, end) of the file name from body to dst at
// their offsets through buf, telling onBytes the size of every chunk read
// and sink (if set) every byte once, in order. It returns how many bytes it
// wrote, also on failure: a body that ends early fails with ErrShortBody, a
// write with a LocalError.
func CopyRange(body io.Reader, dst io.WriterAt, name string, off, end int64, buf []byte, onBytes func(int), sink func([]byte)) (int64, error) {
	var written int64
	for written < end-off {
		want := min(int64(len(buf)), end-off-written)
		n, rerr := io.ReadFull(body, buf[:want])
		if n > 0 {
			onBytes(n)
			if _, werr := dst.WriteAt(buf[:n], off+written); werr != nil {
				return written, LocalError{fmt.Errorf("write %s at offset %d: %w", name, off+written, werr)}
			}
			if sink != nil {
				sink(buf[:n])
			}
			written += int64(n)
		}
		if rerr != nil {
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				rerr = fmt.Errorf("%w after %d of %d bytes", ErrShortBody, written, end-off)
			}
			return written, rerr
		}
	}
	return written, nil
}

// OpenStream runs fetch in a goroutine and returns the bytes it writes,
// which must come in order from off on: the byte stream of an OpenRange.
// Closing the reader early makes the next write fail, which stops fetch.
func OpenStream(off, n int64, fetch func(dst io.WriterAt, buf []byte) error) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(fetch(&streamWriter{w: pw, next: off}, make([]byte, min(bufSize, max(n, 1)))))
	}()
	return pr
}

// streamWriter turns in-order writes at offsets into a stream.
type streamWriter struct {
	w    *io.PipeWriter
	next int64
}

func (p *streamWriter) WriteAt(b []byte, off int64) (int, error) {
	if off != p.next {
		return 0, fmt.Errorf("stream write at %d, expected %d", off, p.next)
	}
	n, err := p.w.Write(b)
	p.next += int64(n)
	return n, err
}

// CheckRange makes sure a ranged GET answers with bytes off..end-1 of the
// object listed: a server that ignores Range would otherwise have us write
// the object's head at off. etag (when not empty) must be obj's;
// contentRange is empty when the answer had none (a 200: then it must be
// the whole object); contentLength -1 means the server sent none.
func CheckRange(obj Object, off, end int64, etag, contentRange string, contentLength int64) error {
	if got := strings.Trim(etag, `"`); got != "" && got != obj.ETag {
		return fmt.Errorf("%w: ETag is now %q, was %q", ErrSourceChanged, got, obj.ETag)
	}
	if contentRange == "" {
		if off == 0 && end == obj.Size && contentLength == obj.Size {
			return nil // whole object asked for, whole object sent
		}
		return fmt.Errorf("%w: answered a GET for bytes %d-%d without Content-Range (Range ignored)", ErrServer, off, end-1)
	}
	first, last, total, err := parseContentRange(contentRange)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrServer, err)
	}
	if total >= 0 && total != obj.Size {
		return fmt.Errorf("%w: size is now %d, was %d", ErrSourceChanged, total, obj.Size)
	}
	if first != off || last != end-1 {
		return fmt.Errorf("%w: asked for bytes %d-%d, got %q", ErrServer, off, end-1, contentRange)
	}
	if contentLength != -1 && contentLength != end-off {
		return fmt.Errorf("%w: Content-Length %d for %d bytes %q", ErrServer, contentLength, end-off, contentRange)
	}
	return nil
}
