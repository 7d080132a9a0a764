package s3origin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// bufSize is each worker's copy buffer: memory stays Concurrency*bufSize
// whatever the part and object sizes.
const bufSize = 1 << 20

// Parts is the number of parts of partSize bytes an object of size bytes is
// split into (the last one may be shorter). Zero for an empty object.
func Parts(size, partSize int64) int {
	if size <= 0 || partSize <= 0 {
		return 0
	}
	return int((size-1)/partSize + 1) // size+partSize-1 could overflow
}

// PartRange is the offset and length of part in an object of size bytes.
func PartRange(part int, size, partSize int64) (off, n int64) {
	off = int64(part) * partSize
	if part < 0 || off >= size {
		return 0, 0
	}
	return off, min(partSize, size-off)
}

// Download writes obj into dst: the parts plan.Done does not claim are
// fetched by parallel ranged GETs pinned to obj.ETag, then the whole file is
// verified against the object. A broken connection resumes its part at the
// byte where it stopped; throttling and server errors are retried with
// backoff. Any failure leaves the parts already reported by OnPart valid.
//
// When the object has a full-object CRC (CRC64NVME, CRC32C, CRC32: what S3
// stores by default since 2025), each part's CRC is computed as it streams
// in and the CRCs are combined, so only parts from an earlier run are read
// back. Other digests (MD5 ETags, SHA) are checked by reading dst back.
func (c *Client) Download(ctx context.Context, obj Object, dst File, plan Plan) error {
	if obj.Size < 0 || obj.Size > MaxObjectSize {
		return fmt.Errorf("download %s: size %d, want 0..%d", obj.URL(), obj.Size, int64(MaxObjectSize))
	}
	if obj.ETag == "" {
		return fmt.Errorf("download %s: no ETag to pin the version to (take the Object from List)", obj.URL())
	}
	// Asking first also fails fast on a vanished object or bad credentials.
	chk, err := c.inspect(ctx, obj)
	if err != nil {
		return err
	}
	n := Parts(obj.Size, c.opts.PartSize)
	var pending, skipped []int
	for part := range n {
		if plan.Done == nil || !plan.Done(part) {
			pending = append(pending, part)
		} else {
			skipped = append(skipped, part)
		}
	}
	kind := crcKindFor(chk.method)
	var crcs []uint64
	if kind != nil {
		crcs = make([]uint64, n)
	}
	if err := c.fetchParts(ctx, obj, dst, pending, plan.OnPart, kind, crcs); err != nil {
		return err
	}
	var v Verification
	if kind != nil {
		// The parts an earlier run fetched are the gaps, read back.
		fetched := make([]RangeCRC, 0, len(pending))
		for _, part := range pending {
			off, length := PartRange(part, obj.Size, c.opts.PartSize)
			fetched = append(fetched, RangeCRC{Off: off, Len: length, CRC: crcs[part]})
		}
		got, _, err := c.combineCRCs(ctx, obj, kind, dst, fetched)
		if err != nil {
			return fmt.Errorf("verify %s: parts from an earlier run: %w", obj.URL(), err)
		}
		v, err = c.compareCombined(obj, kind, chk, got, fmt.Sprintf("checked while downloading (%d of %d parts read back)", len(skipped), n))
		if err != nil {
			return err
		}
	} else {
		v, err = c.checkCopy(ctx, obj, dst, chk)
	}
	if err != nil {
		return err
	}
	if plan.OnVerify != nil {
		plan.OnVerify(v)
	}
	if !v.Verified {
		c.opts.Logger.Warn("downloaded object could not be verified", "object", obj.URL(), "reason", v.Detail)
	}
	return nil
}

// fetchParts fetches parts with Concurrency workers. With kind set, the CRC
// of each part's bytes lands in crcs[part].
func (c *Client) fetchParts(ctx context.Context, obj Object, dst File, parts []int, onPart func(int, int64), kind *crcKind, crcs []uint64) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(c.opts.Concurrency, len(parts)) {
		wg.Go(func() {
			buf := make([]byte, bufSize)
			for part := range work {
				var sink func([]byte)
				if kind != nil {
					sink = func(p []byte) { crcs[part] = kind.update(crcs[part], p) }
				}
				if err := c.fetchPart(ctx, obj, part, dst, buf, sink); err != nil {
					cancel(err)
					return
				}
				if onPart != nil {
					_, n := PartRange(part, obj.Size, c.opts.PartSize)
					onPart(part, n)
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
	if err := context.Cause(ctx); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("download %s: %w", obj.URL(), err)
		}
		return err
	}
	return nil
}

// fetchPart fetches one part, resuming from the last byte written after a
// retryable failure. The attempt budget is for failures in a row without
// progress, so a flaky link that keeps delivering still finishes.
// sink, if set, sees every byte of the part once, in order.
func (c *Client) fetchPart(ctx context.Context, obj Object, part int, dst File, buf []byte, sink func([]byte)) error {
	start, n := PartRange(part, obj.Size, c.opts.PartSize)
	what := fmt.Sprintf("get %s part %d (bytes %d-%d)", obj.URL(), part, start, start+n-1)
	return c.fetchRange(ctx, obj, start, start+n, what, dst, buf, sink)
}

// fetchRange writes bytes [start, end) of obj into dst, resuming a broken
// connection at the byte where it stopped and retrying throttling and
// server errors with backoff.
func (c *Client) fetchRange(ctx context.Context, obj Object, start, end int64, what string, dst File, buf []byte, sink func([]byte)) error {
	failures := 0
	for off := start; off < end; {
		got, err := c.getRange(ctx, obj, off, end, dst, buf, sink)
		off += got
		if err == nil {
			continue
		}
		if !retryable(err) {
			return c.explain(err, what)
		}
		if got > 0 {
			failures = 0
		}
		failures++
		if failures >= c.opts.MaxAttempts {
			return c.explain(fmt.Errorf("giving up after %d attempts without progress: %w", failures, err), what)
		}
		delay := backoff(failures, c.opts.RetryBackoff, rand.Float64())
		c.opts.Logger.Info("retrying S3 range", "what", what, "resume_at", off,
			"attempt", failures+1, "delay", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		case <-t.C:
		}
	}
	return nil
}

// OpenRange streams bytes [off, off+n) of obj, pinned to its ETag, with
// the same retries and resumption as Download: the byte source of a swarm
// origin. Closing the reader early stops the transfer.
func (c *Client) OpenRange(ctx context.Context, obj Object, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 || off > obj.Size || n > obj.Size-off { // off+n could overflow
		return nil, fmt.Errorf("range %d+%d of %s (%d bytes): out of bounds", off, n, obj.URL(), obj.Size)
	}
	pr, pw := io.Pipe()
	go func() {
		what := fmt.Sprintf("get %s bytes %d-%d", obj.URL(), off, off+n-1)
		buf := make([]byte, min(bufSize, max(n, 1)))
		pw.CloseWithError(c.fetchRange(ctx, obj, off, off+n, what, &pipeFile{w: pw, next: off}, buf, nil))
	}()
	return pr, nil
}

// pipeFile turns the in-order writes of fetchRange into a stream.
type pipeFile struct {
	w    *io.PipeWriter
	next int64
}

func (p *pipeFile) WriteAt(b []byte, off int64) (int, error) {
	if off != p.next {
		return 0, fmt.Errorf("s3origin: stream write at %d, expected %d", off, p.next)
	}
	n, err := p.w.Write(b)
	p.next += int64(n)
	return n, err
}

func (p *pipeFile) ReadAt([]byte, int64) (int, error) {
	return 0, errors.New("s3origin: a stream cannot be read back")
}

// backoff is the delay before retry number attempt (1-based): exponential
// from base, capped at 64x, with "equal jitter" (half fixed, half random
// from r in [0,1)) so a fleet of workers throttled together does not come
// back together.
func backoff(attempt int, base time.Duration, r float64) time.Duration {
	d := base << min(max(attempt-1, 0), 6)
	return d/2 + time.Duration(r*float64(d/2))
}

// localError marks a failure writing the local file: never retried.
type localError struct{ err error }

func (e localError) Error() string { return e.err.Error() }
func (e localError) Unwrap() error { return e.err }

// getRange streams bytes [off, end) of obj into dst through buf and returns
// how many bytes it wrote, also on failure.
func (c *Client) getRange(ctx context.Context, obj Object, off, end int64, dst File, buf []byte, sink func([]byte)) (int64, error) {
	in := &s3.GetObjectInput{
		Bucket:  aws.String(obj.Bucket),
		Key:     aws.String(obj.Key),
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", off, end-1)),
		IfMatch: aws.String(strconv.Quote(obj.ETag)),
	}
	if obj.VersionID != "" {
		in.VersionId = aws.String(obj.VersionID)
	}
	// fetchPart retries, resuming mid-part; the SDK would restart the
	// request from scratch and count attempts its own way.
	out, err := c.s3.GetObject(ctx, in, func(o *s3.Options) { o.Retryer = aws.NopRetryer{} })
	if err != nil {
		return 0, err
	}
	defer out.Body.Close()
	if err := checkRange(obj, off, end, aws.ToString(out.ETag), aws.ToString(out.ContentRange), aws.ToInt64(out.ContentLength)); err != nil {
		return 0, err
	}
	var written int64
	for written < end-off {
		want := min(int64(len(buf)), end-off-written)
		n, rerr := io.ReadFull(out.Body, buf[:want])
		if n > 0 {
			c.opts.OnBytes(n)
			if _, werr := dst.WriteAt(buf[:n], off+written); werr != nil {
				return written, localError{fmt.Errorf("write %s at offset %d: %w", obj.Path, off+written, werr)}
			}
			if sink != nil {
				sink(buf[:n])
			}
			written += int64(n)
		}
		if rerr != nil {
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				rerr = fmt.Errorf("%w after %d of %d bytes", errShortBody, written, end-off)
			}
			return written, rerr
		}
	}
	return written, nil
}

// checkRange makes sure a ranged GET answers with bytes off..end-1 of the
// object we listed. S3 enforces If-Match itself; comparing the ETag and
// total size here also catches servers that ignore it, and a server that
// ignores Range would otherwise have us write the object's head at off.
func checkRange(obj Object, off, end int64, etag, contentRange string, contentLength int64) error {
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
	if contentLength != end-off {
		return fmt.Errorf("%w: Content-Length %d for %d bytes %q", ErrServer, contentLength, end-off, contentRange)
	}
	return nil
}

// parseContentRange parses "bytes FIRST-LAST/TOTAL" (TOTAL may be "*",
// reported as -1).
func parseContentRange(s string) (first, last, total int64, err error) {
	bad := func() (int64, int64, int64, error) {
		return 0, 0, 0, fmt.Errorf("bad Content-Range %q", s)
	}
	rest, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return bad()
	}
	rng, tot, ok := strings.Cut(rest, "/")
	if !ok {
		return bad()
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return bad()
	}
	if first, err = strconv.ParseInt(a, 10, 64); err != nil || first < 0 {
		return bad()
	}
	if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first {
		return bad()
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil || total <= last {
			return bad()
		}
	}
	return first, last, total, nil
}
