// Package origin defines what the daemon and a model origin say to each
// other: the Origin interface the daemon fetches through, the objects a
// listing returns, the file a download writes into, the download plan
// (resume and progress), how a copy was verified, and the kinds of failure
// (ErrNotFound, ErrCorrupt, ...) every origin wraps its errors in, so the
// daemon treats every source alike. The origins (internal/s3origin for
// s3://, internal/hforigin for hf://, origin/memorigin in memory) implement
// Origin; Mux picks one by the source's scheme.
//
// It holds types and pure helpers only: no client, no IO, no import of an
// origin or of the daemon.
package origin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Origin is where a model's files come from. Every method may be called
// from several goroutines at once.
type Origin interface {
	// List returns the objects source names now, each pinned (ETag,
	// VersionID) so later reads get these bytes or fail with
	// ErrSourceChanged, never others. source is the spec's text
	// (s3://bucket/prefix/, hf://org/model@rev/subdir); List fails with
	// ErrEmpty when it names nothing and ErrUnsafeKey on a name that is not
	// a safe relative path. Every error it returns begins "list SOURCE: "
	// (SOURCE as parsed, which may differ in form from the text given), so
	// callers pass it on without naming the listing again.
	List(ctx context.Context, source string) ([]Object, error)
	// Download writes obj into dst in parts (plan.Done ones skipped, each
	// finished one reported to plan.OnPart) and checks the result end to
	// end: ErrCorrupt when dst does not match obj.
	Download(ctx context.Context, obj Object, dst File, plan Plan) error
	// OpenRange streams n bytes of obj at off (the swarm's origin reads).
	OpenRange(ctx context.Context, obj Object, off, n int64) (io.ReadCloser, error)
	// NewRangeCheck returns a check built from the CRCs of ranges taken as
	// they arrived, or nil (and no error) when obj's digest is no CRC:
	// Verify then reads the copy back.
	NewRangeCheck(ctx context.Context, obj Object) (RangeCheck, error)
	// Verify checks r, a local copy of obj, against obj's digest at the
	// origin: ErrCorrupt when they differ, ErrSourceChanged or ErrNotFound
	// when obj is no longer there, Verified false when the origin holds no
	// digest it can check against.
	Verify(ctx context.Context, obj Object, r io.ReaderAt) (Verification, error)
}

// RangeCheck verifies a copy filled range by range (the swarm) from CRCs
// taken while the bytes arrived, so the end needs no read-back.
type RangeCheck interface {
	// Update continues a range's CRC over p; a range's CRC starts at 0.
	Update(crc uint64, p []byte) uint64
	// Verify combines known (ranges, none overlapping, in any order) with
	// the gaps between them, read back from r, and compares the result
	// with the object's digest (ErrCorrupt when it differs).
	Verify(ctx context.Context, r io.ReaderAt, known []RangeCRC) (Verification, error)
}

// Kinds of failure a caller may act on: every origin wraps its errors in
// them, so errors.Is works whatever the source.
var (
	// ErrNoCredentials: no credentials were found where the origin's
	// client looks for them (for S3, the AWS SDK's credential chain), so
	// nothing was sent; setting them, not retrying, fixes it.
	ErrNoCredentials = errors.New("no S3 credentials found")
	// ErrCredentials: the origin rejected the credentials.
	ErrCredentials = errors.New("the origin rejected the credentials")
	// ErrAccessDenied: the credentials are valid but lack permission.
	ErrAccessDenied = errors.New("access denied")
	// ErrNoSuchBucket: the bucket (or repository) does not exist.
	ErrNoSuchBucket = errors.New("no such bucket")
	// ErrNotFound: the object (or version, or revision) does not exist (any
	// more).
	ErrNotFound = errors.New("object not found")
	// ErrUnreachable: the origin could not be reached.
	ErrUnreachable = errors.New("origin unreachable")
	// ErrSourceChanged: the object changed while it was being fetched.
	ErrSourceChanged = errors.New("source object changed")
	// ErrCorrupt: the local copy does not match the object's digest.
	ErrCorrupt = errors.New("local copy does not match the source")
	// ErrEmpty: nothing to fetch under the source.
	ErrEmpty = errors.New("no objects")
	// ErrUnsafeKey: a name cannot be mapped to a safe local path.
	ErrUnsafeKey = errors.New("unsafe object key")
	// ErrServer: the server answered in a way its protocol never does
	// (ignored a Range, returned the wrong length).
	ErrServer = errors.New("origin server misbehaved")
	// ErrNoOrigin: nothing reads the source's scheme here.
	ErrNoOrigin = errors.New("no origin for scheme")
)

// Scheme is the scheme of a source ("s3" for s3://bucket/prefix/), or ""
// when it has none. BitTorrent sources have two: "magnet" for a magnet
// link, "torrent" for every torrent+X:// form (a .torrent file read over
// X).
func Scheme(source string) string {
	if strings.HasPrefix(source, "magnet:") {
		return "magnet"
	}
	scheme, _, ok := strings.Cut(source, "://")
	if !ok {
		return ""
	}
	if strings.HasPrefix(scheme, "torrent+") {
		return "torrent"
	}
	return scheme
}

// Mux holds an Origin per source scheme ("s3", "hf", "magnet", "torrent").
type Mux map[string]Origin

// For returns the origin of source's scheme.
func (m Mux) For(source string) (Origin, error) {
	scheme := Scheme(source)
	if o := m[scheme]; o != nil {
		return o, nil
	}
	return nil, fmt.Errorf("source %q: %w %q (this daemon reads %s)", source, ErrNoOrigin, scheme, strings.Join(m.Schemes(), ", "))
}

// Schemes lists the schemes m serves, sorted.
func (m Mux) Schemes() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch {
		case m[k] == nil:
		case k == "magnet":
			out = append(out, "magnet:")
		case k == "torrent":
			out = append(out, "torrent+...://")
		default:
			out = append(out, k+"://")
		}
	}
	return out
}

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

// Object is one file of a model at its origin.
type Object struct {
	Bucket string
	Key    string
	// Bucket is the S3 bucket, or the Hub repository (org/model).
	// Path is Key relative to the listed prefix: a safe, relative,
	// slash-separated path (see internal/s3origin.ValidRelPath).
	Path string
	Size int64
	// ETag without quotes.
	ETag string
	// VersionID pins a version when known (ListObjectsV2 does not report
	// it; If-Match on ETag protects downloads either way).
	VersionID    string
	LastModified time.Time
}

// URL is s3://bucket/key.
func (o Object) URL() string { return "s3://" + o.Bucket + "/" + o.Key }

// File is where an object is downloaded to: written at offsets by parallel
// parts, read back for verification. *os.File is one.
type File interface {
	io.WriterAt
	io.ReaderAt
}

// Plan lets the caller resume a download and learn its progress.
type Plan struct {
	// Done reports parts that are already durable from a previous run;
	// they are not fetched again. Nil fetches every part.
	Done func(part int) bool
	// OnPart is called once a part has been written in full (not synced:
	// sync the file before recording the part as durable). It may be
	// called from several goroutines at once.
	OnPart func(part int, n int64)
	// OnVerify receives the end-to-end check's result, including when the
	// object could not be verified (Verified false, with the reason).
	OnVerify func(Verification)
}

// Verification says how a local copy was checked against its object.
type Verification struct {
	// Verified is true when every byte was checked against a digest the
	// server holds for the object.
	Verified bool
	// Method is the digest used: "crc64nvme", "crc32c", "crc32", "sha256",
	// "sha1" (full-object checksums), "md5" (single-part ETag),
	// "md5-multipart" (ETag of a multipart upload), or "none".
	Method string
	// Detail explains Method, or why nothing could be verified.
	Detail string
}

// RangeCRC is the CRC of Len bytes of an object at Off.
type RangeCRC struct {
	Off, Len int64
	CRC      uint64
}
