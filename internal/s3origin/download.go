package s3origin

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

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
	return FetchParts(ctx, c.opts.Concurrency, obj.URL(), parts, func(ctx context.Context, part int, buf []byte) error {
		var sink func([]byte)
		if kind != nil {
			sink = func(p []byte) { crcs[part] = kind.update(crcs[part], p) }
		}
		start, n := PartRange(part, obj.Size, c.opts.PartSize)
		what := fmt.Sprintf("get %s part %d (bytes %d-%d)", obj.URL(), part, start, start+n-1)
		if err := c.fetchRange(ctx, obj, start, start+n, what, dst, buf, sink); err != nil {
			return err
		}
		if onPart != nil {
			onPart(part, n)
		}
		return nil
	})
}

// fetchRange writes bytes [start, end) of obj into dst, resuming a broken
// connection at the byte where it stopped and retrying throttling and
// server errors with backoff. sink, if set, sees every byte once, in order.
func (c *Client) fetchRange(ctx context.Context, obj Object, start, end int64, what string, dst io.WriterAt, buf []byte, sink func([]byte)) error {
	r := Retrier{
		MaxAttempts: c.opts.MaxAttempts,
		Retryable:   retryable,
		Delay: func(_ error, failures int) time.Duration {
			return Backoff(failures, c.opts.RetryBackoff, rand.Float64())
		},
		Explain: c.explain,
		Logger:  c.opts.Logger,
		Note:    "retrying S3 range",
	}
	return r.FetchRange(ctx, start, end, what, func(off int64) (int64, error) {
		return c.getRange(ctx, obj, off, end, dst, buf, sink)
	})
}

// OpenRange streams bytes [off, off+n) of obj, pinned to its ETag, with
// the same retries and resumption as Download: the byte source of a swarm
// origin. Closing the reader early stops the transfer.
func (c *Client) OpenRange(ctx context.Context, obj Object, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 || off > obj.Size || n > obj.Size-off { // off+n could overflow
		return nil, fmt.Errorf("range %d+%d of %s (%d bytes): out of bounds", off, n, obj.URL(), obj.Size)
	}
	what := fmt.Sprintf("get %s bytes %d-%d", obj.URL(), off, off+n-1)
	return OpenStream(off, n, func(dst io.WriterAt, buf []byte) error {
		return c.fetchRange(ctx, obj, off, off+n, what, dst, buf, nil)
	}), nil
}

// getRange streams bytes [off, end) of obj into dst through buf and returns
// how many bytes it wrote, also on failure.
func (c *Client) getRange(ctx context.Context, obj Object, off, end int64, dst io.WriterAt, buf []byte, sink func([]byte)) (int64, error) {
	in := &s3.GetObjectInput{
		Bucket:  aws.String(obj.Bucket),
		Key:     aws.String(obj.Key),
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", off, end-1)),
		IfMatch: aws.String(strconv.Quote(obj.ETag)),
	}
	if obj.VersionID != "" {
		in.VersionId = aws.String(obj.VersionID)
	}
	// fetchRange retries, resuming mid-part; the SDK would restart the
	// request from scratch and count attempts its own way.
	out, err := c.s3.GetObject(ctx, in, func(o *s3.Options) { o.Retryer = aws.NopRetryer{} })
	if err != nil {
		return 0, err
	}
	defer out.Body.Close()
	if err := CheckRange(obj, off, end, aws.ToString(out.ETag), aws.ToString(out.ContentRange), aws.ToInt64(out.ContentLength)); err != nil {
		return 0, err
	}
	return CopyRange(out.Body, dst, obj.Path, off, end, buf, c.opts.OnBytes, sink)
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
