package hforigin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
)

// URL names obj for messages: hf://repo@commit/path.
func URL(obj s3origin.Object) string {
	return "hf://" + obj.Bucket + "@" + obj.VersionID + "/" + obj.Key
}

// checkObject refuses an Object that did not come from List: reads must be
// pinned to a commit and checked against a digest.
func checkObject(obj s3origin.Object) error {
	switch {
	case obj.Size < 0 || obj.Size > s3origin.MaxObjectSize:
		return fmt.Errorf("%s: size %d, want 0..%d", URL(obj), obj.Size, int64(s3origin.MaxObjectSize))
	case !commitRE.MatchString(obj.VersionID):
		return fmt.Errorf("%s: no commit to pin reads to (take the Object from List)", URL(obj))
	case !commitRE.MatchString(obj.ETag) && !sha256RE.MatchString(obj.ETag):
		return fmt.Errorf("%s: no sha256 or git blob id to verify against (take the Object from List)", URL(obj))
	}
	if err := s3origin.ValidRelPath(obj.Key); err != nil {
		return fmt.Errorf("%s: %w", URL(obj), err)
	}
	return nil
}

// resolveURL is the Hub's address of obj at its commit.
func (c *Client) resolveURL(obj s3origin.Object) string {
	return c.opts.Endpoint + "/" + obj.Bucket + "/resolve/" + obj.VersionID + "/" + escapePath(obj.Key)
}

// locator remembers where a file's bytes are read from: the Hub itself or
// the CDN address it redirected to. Asking once per file instead of once
// per range keeps a download far below the Hub's resolver rate limits.
type locator struct {
	c   *Client
	obj s3origin.Object
	mu  sync.Mutex
	url string
}

func (l *locator) get(ctx context.Context) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.url == "" {
		u, err := l.c.resolve(ctx, l.obj)
		if err != nil {
			return "", err
		}
		l.url = u
	}
	return l.url, nil
}

// forget drops an address the CDN no longer honours (signed URLs expire);
// the next get asks the Hub again.
func (l *locator) forget(u string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.url == u {
		l.url = ""
	}
}

// resolve asks the Hub (HEAD on the resolve endpoint) where obj's bytes
// are, following relative redirects only, and checks that the answer is
// about the file listed: the same commit, digest and size.
func (c *Client) resolve(ctx context.Context, obj s3origin.Object) (string, error) {
	u := c.resolveURL(obj)
	for hop := 0; hop <= 5; hop++ {
		req, err := c.newRequest(ctx, http.MethodHead, u)
		if err != nil {
			return "", err
		}
		resp, err := c.api.Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			return u, checkResolved(obj, resp.Header, true)
		case resp.StatusCode < 300 || resp.StatusCode >= 400:
			return "", newStatusError(resp, time.Now())
		}
		loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
		if err != nil || resp.Header.Get("Location") == "" || (loc.Scheme != "http" && loc.Scheme != "https") {
			return "", fmt.Errorf("%w: redirect %d without a usable Location", s3origin.ErrServer, resp.StatusCode)
		}
		if loc.Host != c.hubHost {
			// The CDN: its address is signed, the token never goes there.
			return loc.String(), checkResolved(obj, resp.Header, false)
		}
		u = loc.String() // a renamed repository: still the Hub
	}
	return "", fmt.Errorf("%w: more than 5 redirects resolving %s", s3origin.ErrServer, URL(obj))
}

// checkResolved compares what the Hub says about a file with the listing.
// Headers that are absent, or an ETag that is no digest (some mirrors send
// their own), are not held against it; the content is verified anyway.
func checkResolved(obj s3origin.Object, h http.Header, direct bool) error {
	if got := h.Get("X-Repo-Commit"); got != "" && got != obj.VersionID {
		return fmt.Errorf("%s: %w: the Hub answered for commit %q", URL(obj), s3origin.ErrSourceChanged, got)
	}
	etag := h.Get("X-Linked-Etag")
	if etag == "" {
		etag = h.Get("ETag")
	}
	etag = strings.Trim(strings.TrimPrefix(etag, "W/"), `"`)
	if (commitRE.MatchString(etag) || sha256RE.MatchString(etag)) && etag != obj.ETag {
		return fmt.Errorf("%s: %w: its digest is now %s, was %s", URL(obj), s3origin.ErrSourceChanged, etag, obj.ETag)
	}
	size := h.Get("X-Linked-Size")
	if size == "" && direct {
		size = h.Get("Content-Length")
	}
	if n, err := strconv.ParseInt(size, 10, 64); err == nil && n != obj.Size {
		return fmt.Errorf("%s: %w: its size is now %d, was %d", URL(obj), s3origin.ErrSourceChanged, n, obj.Size)
	}
	return nil
}

// Download writes obj into dst: the parts plan.Done does not claim are
// fetched by parallel ranged GETs pinned to obj's commit, then dst is
// verified against obj's sha256 or git blob id (ErrCorrupt when it does
// not match). A broken connection resumes its part at the byte where it
// stopped; throttling and server errors are retried with backoff. Any
// failure leaves the parts already reported by OnPart valid.
func (c *Client) Download(ctx context.Context, obj s3origin.Object, dst s3origin.File, plan s3origin.Plan) error {
	if err := checkObject(obj); err != nil {
		return fmt.Errorf("download %w", err)
	}
	loc := &locator{c: c, obj: obj}
	// Asking first also fails fast on a gated repository or a moved file.
	if err := c.retrier(obj.Bucket, "retrying Hub request").Do(ctx, "resolve "+URL(obj), func() error {
		_, err := loc.get(ctx)
		return err
	}); err != nil {
		return err
	}
	n := s3origin.Parts(obj.Size, c.opts.PartSize)
	var pending []int
	for part := range n {
		if plan.Done == nil || !plan.Done(part) {
			pending = append(pending, part)
		}
	}
	// The digest is not a CRC that parts could combine, so a hasher reads
	// the file back in order while parts arrive, each one as soon as it and
	// all before it are written (from the page cache, while the network is
	// busy): at the end only the last parts remain to hash.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fr := newFrontier(n, plan.Done)
	hashed := make(chan error, 1)
	h, method := digestOf(obj)
	go func() {
		buf := make([]byte, min(s3origin.ReadBackBuf, max(c.opts.PartSize, 1)))
		hashed <- fr.each(ctx, func(part int) error {
			off, length := s3origin.PartRange(part, obj.Size, c.opts.PartSize)
			return s3origin.ReadRange(ctx, dst, off, length, buf, func(p []byte) { h.Write(p) })
		})
	}()
	onPart := func(part int, size int64) {
		fr.done(part)
		if plan.OnPart != nil {
			plan.OnPart(part, size)
		}
	}
	if err := c.fetchParts(ctx, loc, dst, pending, onPart); err != nil {
		cancel()
		<-hashed //nolint:errcheck // the fetch's error is the one to report; the hasher's is its cancellation
		return err
	}
	if err := <-hashed; err != nil {
		return fmt.Errorf("verify %s: %w", URL(obj), err)
	}
	v, err := compareDigest(obj, method, h, fmt.Sprintf("hashed while downloading (%d of %d parts from an earlier run)", n-len(pending), n))
	if err != nil {
		return err
	}
	if plan.OnVerify != nil {
		plan.OnVerify(v)
	}
	return nil
}

// frontier tells a hasher which parts of a file are written.
type frontier struct {
	mu    sync.Mutex
	ready []bool
	wake  chan struct{} // signalled (not closed) when a part is done
}

func newFrontier(n int, earlier func(int) bool) *frontier {
	f := &frontier{ready: make([]bool, n), wake: make(chan struct{}, 1)}
	for part := range n {
		f.ready[part] = earlier != nil && earlier(part)
	}
	return f
}

func (f *frontier) done(part int) {
	f.mu.Lock()
	f.ready[part] = true
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// each calls fn for parts 0, 1, ... in order, each once it is done.
func (f *frontier) each(ctx context.Context, fn func(part int) error) error {
	for part := range f.ready {
		for {
			f.mu.Lock()
			ok := f.ready[part]
			f.mu.Unlock()
			if ok {
				break
			}
			select {
			case <-f.wake:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		if err := fn(part); err != nil {
			return err
		}
	}
	return nil
}

// fetchParts fetches parts, Concurrency at a time; the first failure stops
// the others.
func (c *Client) fetchParts(ctx context.Context, loc *locator, dst s3origin.File, parts []int, onPart func(int, int64)) error {
	obj := loc.obj
	return s3origin.FetchParts(ctx, c.opts.Concurrency, URL(obj), parts, func(ctx context.Context, part int, buf []byte) error {
		off, n := s3origin.PartRange(part, obj.Size, c.opts.PartSize)
		what := fmt.Sprintf("get %s part %d (bytes %d-%d)", URL(obj), part, off, off+n-1)
		if err := c.fetchRange(ctx, loc, off, off+n, what, dst, buf); err != nil {
			return err
		}
		onPart(part, n)
		return nil
	})
}

// fetchRange writes bytes [start, end) of the file into dst, resuming
// where a broken connection stopped.
func (c *Client) fetchRange(ctx context.Context, loc *locator, start, end int64, what string, dst io.WriterAt, buf []byte) error {
	return c.retrier(loc.obj.Bucket, "retrying Hub range").FetchRange(ctx, start, end, what, func(off int64) (int64, error) {
		return c.getRange(ctx, loc, off, end, dst, buf)
	})
}

// retrier is s3origin's retry loop with the Hub's errors and delays
// (Retry-After), its failures explained for repo, note logged on a retry.
func (c *Client) retrier(repo, note string) s3origin.Retrier {
	return s3origin.Retrier{
		MaxAttempts: c.opts.MaxAttempts,
		Retryable:   retryable,
		Delay: func(err error, failures int) time.Duration {
			return retryDelay(err, failures, c.opts.RetryBackoff, c.opts.MaxRetryAfter, rand.Float64())
		},
		Explain: func(err error, what string) error { return c.explain(err, repo, what) },
		Sleep:   c.sleep,
		Logger:  c.opts.Logger,
		Note:    note,
	}
}

// errExpired: the CDN refused an address it gave before (signed URLs
// expire). Retried after asking the Hub again.
var errExpired = errors.New("the CDN refused the file's address")

// getRange streams bytes [off, end) of the file into dst through buf and
// returns how many bytes it wrote, also on failure.
func (c *Client) getRange(ctx context.Context, loc *locator, off, end int64, dst io.WriterAt, buf []byte) (int64, error) {
	u, err := loc.get(ctx)
	if err != nil {
		return 0, err
	}
	req, err := c.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, end-1))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req = req.WithContext(ctx)
	resp, err := c.get.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		se := newStatusError(resp, time.Now())
		if resp.Request.URL.Host != c.hubHost && (se.status == 403 || se.status == 404 || se.status == 410) {
			loc.forget(u)
			return 0, fmt.Errorf("%w: %w", errExpired, se)
		}
		return 0, se
	}
	cr := ""
	if resp.StatusCode == http.StatusPartialContent {
		cr = resp.Header.Get("Content-Range")
	}
	// The CDN's ETag is its own: the listing's digest was checked on resolve.
	if err := s3origin.CheckRange(loc.obj, off, end, "", cr, resp.ContentLength); err != nil {
		return 0, fmt.Errorf("%s: %w", resp.Request.URL.Host, err)
	}
	// A connection that delivers nothing for StallTimeout is dropped (and
	// retried, resuming where it stopped).
	var stalled atomic.Bool
	stall := time.AfterFunc(c.opts.StallTimeout, func() { stalled.Store(true); cancel() })
	defer stall.Stop()
	body := readerFunc(func(p []byte) (int, error) {
		n, err := resp.Body.Read(p)
		stall.Reset(c.opts.StallTimeout)
		return n, err
	})
	written, err := s3origin.CopyRange(body, dst, loc.obj.Path, off, end, buf, c.opts.OnBytes, nil)
	if err != nil && stalled.Load() && !errors.As(err, new(s3origin.LocalError)) {
		err = fmt.Errorf("%w: no byte for %s after %d of %d bytes", s3origin.ErrShortBody, c.opts.StallTimeout, written, end-off)
	}
	return written, err
}

// readerFunc is an io.Reader from a function.
type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// OpenRange streams bytes [off, off+n) of obj, pinned to its commit, with
// the same retries and resumption as Download: the byte source of a swarm
// origin. Closing the reader early stops the transfer.
func (c *Client) OpenRange(ctx context.Context, obj s3origin.Object, off, n int64) (io.ReadCloser, error) {
	if err := checkObject(obj); err != nil {
		return nil, fmt.Errorf("open %w", err)
	}
	if off < 0 || n < 0 || off > obj.Size || n > obj.Size-off {
		return nil, fmt.Errorf("range %d+%d of %s (%d bytes): out of bounds", off, n, URL(obj), obj.Size)
	}
	what := fmt.Sprintf("get %s bytes %d-%d", URL(obj), off, off+n-1)
	return s3origin.OpenStream(off, n, func(dst io.WriterAt, buf []byte) error {
		return c.fetchRange(ctx, c.rangeLocator(obj), off, off+n, what, dst, buf)
	}), nil
}

// rangeLocator is the locator OpenRange reads obj through, shared by every
// range of the same file version (the CDN address is asked once, and again
// only when the CDN refuses it).
func (c *Client) rangeLocator(obj s3origin.Object) *locator {
	k := locatorKey{obj.Bucket, obj.VersionID, obj.Key, obj.ETag}
	c.rangesMu.Lock()
	defer c.rangesMu.Unlock()
	if l := c.ranges[k]; l != nil {
		return l
	}
	if len(c.ranges) >= maxRangeLocators {
		clear(c.ranges)
	}
	l := &locator{c: c, obj: obj}
	c.ranges[k] = l
	return l
}
