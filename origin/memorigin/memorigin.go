// Package memorigin is an origin.Origin held in memory: buckets of objects
// that tests (and tools that need no server) put and delete, read through
// the same contract as internal/s3origin reads S3. Sources are written as
// for S3 (s3://bucket/prefix/), so a daemon spec names either alike.
//
// It keeps S3's rules where the daemon depends on them: a listing skips
// folder markers and refuses unsafe or clashing names (ErrUnsafeKey), an
// empty prefix is ErrEmpty, a missing bucket ErrNoSuchBucket; the ETag is
// the MD5 of the content (same bytes, same ETag), and every read is pinned
// to the listed ETag, as If-Match pins S3's (ErrSourceChanged once the
// object changed, ErrNotFound once it is gone). A download writes the parts
// plan.Done does not hold, then reads the whole copy back and compares it
// with the object (ErrCorrupt). NewRangeCheck returns a check that compares
// the CRC of each range the caller took with the object's own bytes there.
//
// It imports no test support: the conformance suite that checks it against
// the S3 client lives in internal/testutil/origintest.
package memorigin

import (
	"bytes"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// DefaultPartSize is the part size when Options leaves it zero.
const DefaultPartSize = 1 << 20

// MethodMemory is the Verification method: a byte-for-byte comparison
// with the object held in memory.
const MethodMemory = "memory"

// Options tune an Origin.
type Options struct {
	// PartSize is the unit of Download's resume (default 1 MiB).
	PartSize int64
	// OnBytes is called with the size of every chunk an object's bytes are
	// read in (downloads and OpenRange), as s3origin's OnBytes is.
	OnBytes func(n int)
	// Clock stamps LastModified (default time.Now).
	Clock func() time.Time
}

// Origin holds buckets of objects in memory. Its methods are safe for
// concurrent use.
type Origin struct {
	opts Options
	*store
}

// store is the buckets, which several Origins (With) may share.
type store struct {
	mu      sync.Mutex
	buckets map[string]map[string]object
}

type object struct {
	data     []byte // never changed once stored: Put stores a new slice
	etag     string
	modified time.Time
}

var _ origin.Origin = (*Origin)(nil)

// New returns an empty Origin.
func New(opts Options) *Origin {
	return (&Origin{store: &store{buckets: map[string]map[string]object{}}}).With(opts)
}

// With returns an Origin over the same buckets with other options: a
// second client of the same server, say, with its own byte counter.
func (o *Origin) With(opts Options) *Origin {
	opts.PartSize = cmp.Or(max(opts.PartSize, 0), DefaultPartSize)
	if opts.OnBytes == nil {
		opts.OnBytes = func(int) {}
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	return &Origin{opts: opts, store: o.store}
}

// CreateBucket adds an empty bucket (a no-op when it exists).
func (o *Origin) CreateBucket(bucket string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.buckets[bucket] == nil {
		o.buckets[bucket] = map[string]object{}
	}
}

// Put stores a copy of data as bucket/key, creating the bucket if needed.
func (o *Origin) Put(bucket, key string, data []byte) {
	sum := md5.Sum(data)
	obj := object{data: bytes.Clone(data), etag: hex.EncodeToString(sum[:]), modified: o.opts.Clock()}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.buckets[bucket] == nil {
		o.buckets[bucket] = map[string]object{}
	}
	o.buckets[bucket][key] = obj
}

// Delete removes bucket/key; a missing one is no error.
func (o *Origin) Delete(bucket, key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.buckets[bucket], key)
}

// List returns the objects under source (s3://bucket/prefix/), sorted by
// path.
func (o *Origin) List(ctx context.Context, source string) ([]origin.Object, error) {
	src, err := spec.ParseS3URL(source)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", source, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list %s: %w", src, err)
	}
	o.mu.Lock()
	b, ok := o.buckets[src.Bucket]
	keys := slices.Sorted(maps.Keys(b))
	objs := make([]origin.Object, 0, len(keys))
	for _, k := range keys {
		if rel, ok := strings.CutPrefix(k, src.Prefix); ok {
			v := b[k]
			objs = append(objs, origin.Object{Bucket: src.Bucket, Key: k, Path: rel, Size: int64(len(v.data)), ETag: v.etag, LastModified: v.modified})
		}
	}
	o.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("list %s: %w %q in memory", src, origin.ErrNoSuchBucket, src.Bucket)
	}
	objs = slices.DeleteFunc(objs, func(obj origin.Object) bool { return strings.HasSuffix(obj.Key, "/") && obj.Size == 0 })
	for _, obj := range objs {
		if err := s3origin.ValidRelPath(obj.Path); err != nil {
			return nil, fmt.Errorf("list %s: key %q: %w", src, obj.Key, err)
		}
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("list %s: %w under %s", src, origin.ErrEmpty, src)
	}
	if err := s3origin.CheckPathClashes(objs); err != nil {
		return nil, fmt.Errorf("list %s: %w", src, err)
	}
	return objs, nil
}

// url names obj for messages.
func url(obj origin.Object) string { return "mem://" + obj.Bucket + "/" + obj.Key }

// get returns obj's bytes if obj is still what was listed.
func (o *Origin) get(obj origin.Object) ([]byte, error) {
	o.mu.Lock()
	v, ok := o.buckets[obj.Bucket][obj.Key]
	o.mu.Unlock()
	switch {
	case !ok:
		return nil, fmt.Errorf("%s: %w", url(obj), origin.ErrNotFound)
	case v.etag != obj.ETag:
		return nil, fmt.Errorf("%s: %w (its ETag is %s, %s was listed)", url(obj), origin.ErrSourceChanged, v.etag, obj.ETag)
	case int64(len(v.data)) != obj.Size:
		return nil, fmt.Errorf("%s: %w: %d bytes, %d listed", url(obj), origin.ErrServer, len(v.data), obj.Size)
	}
	return v.data, nil
}

// Download writes the parts of obj plan.Done does not hold into dst, in
// order, each read again from the object as it is then (a changed object
// fails the download), and checks the whole copy.
func (o *Origin) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	for part := range origin.Parts(obj.Size, o.opts.PartSize) {
		if plan.Done != nil && plan.Done(part) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("download %s: %w", url(obj), context.Cause(ctx))
		}
		data, err := o.get(obj)
		if err != nil {
			return fmt.Errorf("download %w", err)
		}
		off, n := origin.PartRange(part, obj.Size, o.opts.PartSize)
		if _, err := dst.WriteAt(data[off:off+n], off); err != nil {
			return fmt.Errorf("download %s: write part %d: %w", url(obj), part, err)
		}
		o.opts.OnBytes(int(n))
		if plan.OnPart != nil {
			plan.OnPart(part, n)
		}
	}
	v, err := o.Verify(ctx, obj, dst)
	if err == nil && plan.OnVerify != nil {
		plan.OnVerify(v)
	}
	return err
}

// OpenRange streams n bytes of obj at off.
func (o *Origin) OpenRange(_ context.Context, obj origin.Object, off, n int64) (io.ReadCloser, error) {
	data, err := o.get(obj)
	if err != nil {
		return nil, fmt.Errorf("read %w", err)
	}
	if off < 0 || n < 0 || off > obj.Size-n {
		return nil, fmt.Errorf("read %s: range %d+%d outside %d bytes", url(obj), off, n, obj.Size)
	}
	return io.NopCloser(&countingReader{r: bytes.NewReader(data[off : off+n]), onBytes: o.opts.OnBytes}), nil
}

type countingReader struct {
	r       io.Reader
	onBytes func(int)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.onBytes(n)
	return n, err
}

// Verify compares r, a local copy of obj, with the object byte for byte.
func (o *Origin) Verify(ctx context.Context, obj origin.Object, r io.ReaderAt) (origin.Verification, error) {
	data, err := o.get(obj)
	if err != nil {
		return origin.Verification{}, fmt.Errorf("verify %w", err)
	}
	if err := compare(ctx, obj, data, r, 0, obj.Size); err != nil {
		return origin.Verification{}, err
	}
	return origin.Verification{Verified: true, Method: MethodMemory, Detail: "every byte compared with the object in memory"}, nil
}

// compare checks n bytes of r at off against data.
func compare(ctx context.Context, obj origin.Object, data []byte, r io.ReaderAt, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for at := off; at < off+n; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("verify %s: %w", url(obj), err)
		}
		k := min(int64(len(buf)), off+n-at)
		if _, err := r.ReadAt(buf[:k], at); err != nil {
			return fmt.Errorf("verify %s: read the copy at %d: %w", url(obj), at, err)
		}
		if !bytes.Equal(buf[:k], data[at:at+k]) {
			return fmt.Errorf("verify %s: %w: the copy differs in bytes %d..%d", url(obj), origin.ErrCorrupt, at, at+k)
		}
		at += k
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewRangeCheck returns a check of CRC32C ranges.
func (o *Origin) NewRangeCheck(_ context.Context, obj origin.Object) (origin.RangeCheck, error) {
	if _, err := o.get(obj); err != nil {
		return nil, fmt.Errorf("range check %w", err)
	}
	return &rangeCheck{o: o, obj: obj}, nil
}

type rangeCheck struct {
	o   *Origin
	obj origin.Object
}

func (rc *rangeCheck) Update(crc uint64, p []byte) uint64 {
	return uint64(crc32.Update(uint32(crc), castagnoli, p))
}

// Verify compares each known range's CRC with the CRC of the object's bytes
// there, and the gaps between them byte for byte.
func (rc *rangeCheck) Verify(ctx context.Context, r io.ReaderAt, known []origin.RangeCRC) (origin.Verification, error) {
	data, err := rc.o.get(rc.obj)
	if err != nil {
		return origin.Verification{}, fmt.Errorf("verify %w", err)
	}
	known = slices.SortedFunc(slices.Values(known), func(a, b origin.RangeCRC) int { return cmp.Compare(a.Off, b.Off) })
	at, readBack := int64(0), int64(0)
	for _, k := range known {
		if k.Off < at || k.Len < 0 || k.Off > rc.obj.Size-k.Len {
			return origin.Verification{}, fmt.Errorf("verify %s: range %d+%d overlaps another or lies outside %d bytes", url(rc.obj), k.Off, k.Len, rc.obj.Size)
		}
		if err := compare(ctx, rc.obj, data, r, at, k.Off-at); err != nil {
			return origin.Verification{}, err
		}
		readBack += k.Off - at
		if want := rc.Update(0, data[k.Off:k.Off+k.Len]); want != k.CRC {
			return origin.Verification{}, fmt.Errorf("verify %s: %w: range %d+%d has CRC32C %08x, the object %08x", url(rc.obj), origin.ErrCorrupt, k.Off, k.Len, k.CRC, want)
		}
		at = k.Off + k.Len
	}
	if err := compare(ctx, rc.obj, data, r, at, rc.obj.Size-at); err != nil {
		return origin.Verification{}, err
	}
	readBack += rc.obj.Size - at
	return origin.Verification{Verified: true, Method: "crc32c", Detail: fmt.Sprintf("checked while filling (%d of %d bytes read back)", readBack, rc.obj.Size)}, nil
}
