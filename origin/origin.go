// Package origin defines what the daemon and a model origin say to each
// other: the objects a listing returns, the file a download writes into, the
// download plan (resume and progress), and how a copy was verified. The
// origins (internal/s3origin, internal/hforigin) use these types (s3origin
// under alias names), and so does the daemon's Origin interface. Its
// NewRangeCheck still answers with internal/s3origin's *RangeCheck, so only
// code inside this module can implement an Origin.
//
// It holds data types only: no client, no IO, no import of an origin.
package origin

import (
	"io"
	"time"
)

// Object is one file of a model at its origin.
type Object struct {
	Bucket string
	Key    string
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
