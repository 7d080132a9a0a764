package s3origin

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/minio/crc64nvme"
	"golang.org/x/sync/errgroup"
)

// Digest methods.
const (
	MethodCRC64NVME    = "crc64nvme"
	MethodCRC32C       = "crc32c"
	MethodCRC32        = "crc32"
	MethodSHA256       = "sha256"
	MethodSHA1         = "sha1"
	MethodMD5          = "md5"
	MethodMD5Multipart = "md5-multipart"
	MethodNone         = "none"
)

// objectFacts is what HeadObject tells about how an object can be checked.
type objectFacts struct {
	ETag         string
	Size         int64
	ChecksumType types.ChecksumType
	// Checksums by method, base64 as S3 sends them.
	Checksums map[string]string
	// Encrypted names SSE-KMS or SSE-C: the ETag is then not an MD5.
	Encrypted string
}

// check is the chosen way to verify an object.
type check struct {
	method   string
	expected string // base64 checksum, or hex MD5 for ETags
	parts    int    // upload parts, for md5-multipart
	reason   string // when method is none
}

var (
	md5ETagRE       = regexp.MustCompile(`^[0-9a-f]{32}$`)
	multipartETagRE = regexp.MustCompile(`^([0-9a-f]{32})-([1-9][0-9]{0,4})$`)
)

// fullObjectOrder prefers the cheapest digest when several are present.
var fullObjectOrder = []string{MethodCRC64NVME, MethodCRC32C, MethodCRC32, MethodSHA1, MethodSHA256}

// chooseCheck picks the strongest available check: a full-object checksum,
// else the ETag when it is an MD5 (plain or multipart). It never pretends:
// an encrypted object's ETag or an unknown ETag format yields "none".
func chooseCheck(f objectFacts) check {
	// Single-part uploads do not always report a type, but their checksum
	// is of the whole object; a composite (multipart) one ends in "-N".
	if f.ChecksumType == types.ChecksumTypeFullObject || f.ChecksumType == "" {
		for _, m := range fullObjectOrder {
			if v := f.Checksums[m]; v != "" && !strings.Contains(v, "-") {
				return check{method: m, expected: v}
			}
		}
	}
	etag := strings.ToLower(f.ETag)
	switch {
	case f.Encrypted != "":
		return check{method: MethodNone, reason: fmt.Sprintf("the object is encrypted with %s, so its ETag is not an MD5, and it has no full-object checksum", f.Encrypted)}
	case md5ETagRE.MatchString(etag):
		return check{method: MethodMD5, expected: etag}
	}
	if m := multipartETagRE.FindStringSubmatch(etag); m != nil {
		n, _ := strconv.Atoi(m[2])
		if n <= 10000 {
			return check{method: MethodMD5Multipart, expected: m[1], parts: n}
		}
	}
	return check{method: MethodNone, reason: fmt.Sprintf("ETag %q is neither an MD5 nor a multipart MD5, and the object has no full-object checksum", f.ETag)}
}

// multipartLayoutOK reports whether an object of size bytes uploaded in n
// parts can have all parts of partSize bytes except a shorter last one: the
// only layout for which the part size from part 1 reproduces the ETag.
func multipartLayoutOK(size, partSize int64, n int) bool {
	return partSize > 0 && Parts(size, partSize) == n && (n > 0 || size == 0)
}

// Verify checks r (a local copy of obj) against the object's full-object
// checksum or its ETag, reading r back. It returns ErrCorrupt when they
// differ and ErrSourceChanged when the object is no longer the one listed.
// When the server holds no usable digest, it returns Verified false and
// says why.
func (c *Client) Verify(ctx context.Context, obj Object, r io.ReaderAt) (Verification, error) {
	chk, err := c.inspect(ctx, obj)
	if err != nil {
		return Verification{}, err
	}
	return c.checkCopy(ctx, obj, r, chk)
}

// inspect asks S3 how obj can be verified, and makes sure it is still the
// object that was listed.
func (c *Client) inspect(ctx context.Context, obj Object) (check, error) {
	what := "head " + obj.URL()
	head, err := c.s3.HeadObject(ctx, c.headInput(obj, 0))
	if err != nil {
		return check{}, c.explain(err, what)
	}
	if size := aws.ToInt64(head.ContentLength); size != obj.Size {
		return check{}, fmt.Errorf("%s: %w: size is now %d, was %d", what, ErrSourceChanged, size, obj.Size)
	}
	if etag := strings.Trim(aws.ToString(head.ETag), `"`); etag != obj.ETag {
		return check{}, fmt.Errorf("%s: %w: ETag is now %q, was %q", what, ErrSourceChanged, etag, obj.ETag)
	}
	facts := objectFacts{
		ETag:         obj.ETag,
		Size:         obj.Size,
		ChecksumType: head.ChecksumType,
		Checksums: map[string]string{
			MethodCRC64NVME: aws.ToString(head.ChecksumCRC64NVME),
			MethodCRC32C:    aws.ToString(head.ChecksumCRC32C),
			MethodCRC32:     aws.ToString(head.ChecksumCRC32),
			MethodSHA256:    aws.ToString(head.ChecksumSHA256),
			MethodSHA1:      aws.ToString(head.ChecksumSHA1),
		},
	}
	switch {
	case head.ServerSideEncryption == types.ServerSideEncryptionAwsKms || head.ServerSideEncryption == types.ServerSideEncryptionAwsKmsDsse:
		facts.Encrypted = string(head.ServerSideEncryption)
	case aws.ToString(head.SSECustomerAlgorithm) != "":
		facts.Encrypted = "SSE-C"
	}
	if c.ignoreChecksums {
		clear(facts.Checksums)
	}
	return chooseCheck(facts), nil
}

// checkCopy reads r back and checks it as chk says.
func (c *Client) checkCopy(ctx context.Context, obj Object, r io.ReaderAt, chk check) (Verification, error) {
	what := "verify " + obj.URL()
	switch chk.method {
	case MethodNone:
		return Verification{Method: MethodNone, Detail: chk.reason}, nil
	case MethodMD5Multipart:
		return c.verifyMultipart(ctx, obj, r, chk)
	}
	if kind := crcKindFor(chk.method); kind != nil {
		// Parts in parallel, then combined: read-back uses every core.
		got, _, err := c.combineCRCs(ctx, obj, kind, r, nil)
		if err != nil {
			return Verification{}, fmt.Errorf("%s: %w", what, err)
		}
		return c.compareCombined(obj, kind, chk, got, "read back")
	}
	h := newHash(chk.method)
	if err := ReadRange(ctx, r, 0, obj.Size, make([]byte, ReadBackBuf), func(p []byte) { h.Write(p) }); err != nil {
		return Verification{}, fmt.Errorf("%s: read back: %w", what, err)
	}
	sum := h.Sum(nil)
	got := base64.StdEncoding.EncodeToString(sum)
	if chk.method == MethodMD5 {
		got = hex.EncodeToString(sum)
	}
	if got != chk.expected {
		return Verification{}, fmt.Errorf("%s: %w: %s of the local copy is %s, S3 has %s", what, ErrCorrupt, chk.method, got, chk.expected)
	}
	return Verification{Verified: true, Method: chk.method, Detail: chk.method + " " + got + ", read back"}, nil
}

// compareCombined compares the CRC of the whole copy with the object's.
func (c *Client) compareCombined(obj Object, kind *crcKind, chk check, got uint64, how string) (Verification, error) {
	want, err := kind.decode(chk.expected)
	if err != nil {
		return Verification{}, fmt.Errorf("verify %s: %w", obj.URL(), err)
	}
	if got != want {
		return Verification{}, fmt.Errorf("verify %s: %w: %s of the local copy is %s, S3 has %s",
			obj.URL(), ErrCorrupt, chk.method, kind.encode(got), chk.expected)
	}
	return Verification{Verified: true, Method: chk.method, Detail: chk.method + " " + chk.expected + ", " + how}, nil
}

func (c *Client) headInput(obj Object, partNumber int32) *s3.HeadObjectInput {
	in := &s3.HeadObjectInput{
		Bucket:       aws.String(obj.Bucket),
		Key:          aws.String(obj.Key),
		IfMatch:      aws.String(strconv.Quote(obj.ETag)),
		ChecksumMode: types.ChecksumModeEnabled,
	}
	if obj.VersionID != "" {
		in.VersionId = aws.String(obj.VersionID)
	}
	if partNumber > 0 {
		in.PartNumber = aws.Int32(partNumber)
		in.ChecksumMode = ""
	}
	return in
}

// verifyMultipart recomputes a multipart ETag, md5(md5(part1)..md5(partN)).
// It first assumes every part but the last is as long as part 1 (what SDK
// uploaders do), which costs one HEAD. S3 also accepts parts of different
// sizes, and a wrong layout makes a good copy look corrupt (the daemon would
// then fetch it again forever), so when that layout cannot be right or its
// digest does not match, it asks S3 for the size of every part.
func (c *Client) verifyMultipart(ctx context.Context, obj Object, r io.ReaderAt, chk check) (Verification, error) {
	what := "verify " + obj.URL()
	first, err := c.partLength(ctx, obj, 1)
	if err != nil {
		if contextError(err) != nil {
			return Verification{}, fmt.Errorf("%s: %w", what, err)
		}
		return Verification{Method: MethodNone, Detail: fmt.Sprintf(
			"multipart ETag with %d parts, but the server does not tell the part size (HEAD partNumber=1: %v)", chk.parts, err)}, nil
	}
	var uniform []int64
	var uniformErr error
	if multipartLayoutOK(obj.Size, first, chk.parts) {
		uniform = uniformLayout(obj.Size, first, chk.parts)
		v, err := c.checkMultipart(ctx, obj, r, chk, uniform, fmt.Sprintf("parts of %d bytes", first))
		// With one or two parts, part 1's size fixes the layout.
		if !errors.Is(err, ErrCorrupt) || chk.parts <= 2 {
			return v, err
		}
		uniformErr = err
	}
	lengths, err := c.partLengths(ctx, obj, chk.parts)
	switch {
	case contextError(err) != nil:
		return Verification{}, fmt.Errorf("%s: %w", what, err)
	case err != nil && uniformErr != nil:
		return Verification{}, uniformErr
	case err != nil:
		return Verification{Method: MethodNone, Detail: fmt.Sprintf(
			"multipart ETag with %d parts of unequal sizes, and the server does not tell them: %v", chk.parts, err)}, nil
	case slices.Equal(lengths, uniform):
		return Verification{}, uniformErr
	}
	return c.checkMultipart(ctx, obj, r, chk, lengths, "parts of the sizes S3 reports")
}

// uniformLayout is n parts of partSize bytes but a shorter last one.
func uniformLayout(size, partSize int64, n int) []int64 {
	lengths := make([]int64, n)
	for part := range n {
		_, lengths[part] = PartRange(part, size, partSize)
	}
	return lengths
}

// checkMultipart compares the multipart MD5 of r, cut into parts of the
// given lengths, with the ETag.
func (c *Client) checkMultipart(ctx context.Context, obj Object, r io.ReaderAt, chk check, lengths []int64, layout string) (Verification, error) {
	what := "verify " + obj.URL()
	sums, err := md5Parts(ctx, r, lengths)
	if err != nil {
		return Verification{}, fmt.Errorf("%s: read back: %w", what, err)
	}
	whole := md5.Sum(sums)
	if got := hex.EncodeToString(whole[:]); got != chk.expected {
		return Verification{}, fmt.Errorf("%s: %w: multipart MD5 of the local copy (%d %s) is %s-%d, S3 has %s-%d",
			what, ErrCorrupt, chk.parts, layout, got, chk.parts, chk.expected, chk.parts)
	}
	return Verification{Verified: true, Method: MethodMD5Multipart,
		Detail: fmt.Sprintf("%s-%d, %s", chk.expected, chk.parts, layout)}, nil
}

// partLength asks S3 for the size of upload part number (1-based) of obj.
func (c *Client) partLength(ctx context.Context, obj Object, number int) (int64, error) {
	head, err := c.s3.HeadObject(ctx, c.headInput(obj, int32(number)))
	if err != nil {
		return 0, err
	}
	return aws.ToInt64(head.ContentLength), nil
}

// partLengths asks S3 for the size of every upload part of obj, Concurrency
// HEADs at a time, and checks that they make up the object.
func (c *Client) partLengths(ctx context.Context, obj Object, n int) ([]int64, error) {
	lengths := make([]int64, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.Concurrency)
	for part := range n {
		g.Go(func() error {
			length, err := c.partLength(gctx, obj, part+1)
			if err != nil {
				return fmt.Errorf("HEAD partNumber=%d: %w", part+1, err)
			}
			lengths[part] = length
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var total int64
	for part, length := range lengths {
		if (length <= 0 && n > 1) || length > obj.Size { // bounded, so the sum cannot wrap
			return nil, fmt.Errorf("part %d has %d bytes", part+1, length)
		}
		total += length
	}
	if total != obj.Size {
		return nil, fmt.Errorf("parts add up to %d bytes, the object has %d", total, obj.Size)
	}
	return lengths, nil
}

// ReadBackBuf is the read buffer of a read-back: large sequential reads
// keep it near disk speed.
const ReadBackBuf = 4 << 20

// md5Parts hashes each upload part, several at a time (MD5 is serial, so
// parallel parts are the only way to use more than one core), and returns
// the concatenated digests.
func md5Parts(ctx context.Context, r io.ReaderAt, lengths []int64) ([]byte, error) {
	offs := make([]int64, len(lengths))
	for part := 1; part < len(lengths); part++ {
		offs[part] = offs[part-1] + lengths[part-1]
	}
	sums := make([]byte, len(lengths)*md5.Size)
	err := forEachPart(ctx, len(lengths), func(part int, buf []byte) error {
		h := md5.New()
		if err := ReadRange(ctx, r, offs[part], lengths[part], buf, func(p []byte) { h.Write(p) }); err != nil {
			return fmt.Errorf("part %d: %w", part+1, err)
		}
		copy(sums[part*md5.Size:], h.Sum(nil))
		return nil
	})
	return sums, err
}

// forEachPart runs fn for parts 0..n-1 on one worker per core (at most 4),
// each with its own read buffer, and returns the first error.
func forEachPart(ctx context.Context, n int, fn func(part int, buf []byte) error) error {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	return eachPart(ctx, min(runtime.GOMAXPROCS(0), 4), ReadBackBuf, parts, func(_ context.Context, part int, buf []byte) error {
		return fn(part, buf)
	})
}

// ReadRange passes bytes [off, off+n) of r to sink through buf: a local
// copy read back to be checked (ErrCorrupt when it is short).
func ReadRange(ctx context.Context, r io.ReaderAt, off, n int64, buf []byte, sink func([]byte)) error {
	for done := int64(0); done < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		want := min(int64(len(buf)), n-done)
		got, err := r.ReadAt(buf[:want], off+done)
		sink(buf[:got])
		done += int64(got)
		if err != nil && !(err == io.EOF && int64(got) == want) {
			if err == io.EOF {
				return fmt.Errorf("%w: local copy ends at %d, want %d bytes", ErrCorrupt, off+done, off+n)
			}
			return err
		}
	}
	return nil
}

func newHash(method string) hash.Hash {
	switch method {
	case MethodCRC64NVME:
		return crc64nvme.New()
	case MethodCRC32C:
		return crc32.New(crc32.MakeTable(crc32.Castagnoli))
	case MethodCRC32:
		return crc32.NewIEEE()
	case MethodSHA256:
		return sha256.New()
	case MethodSHA1:
		return sha1.New()
	}
	return md5.New()
}

// crc64NVME is the reversed NVMe polynomial S3 uses for CRC64NVME.
const crc64NVME = 0x9a6c9329ac4bc9b5
