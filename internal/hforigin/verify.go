package hforigin

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strconv"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/origin"
)

// MethodGitBlob is the Verification method of a file kept in git (not
// LFS): its git blob id, sha1("blob <size>\x00" + content).
const MethodGitBlob = "git-blob-sha1"

// digestOf returns the hash to check obj with and its method: sha256 for
// an LFS file, the git blob id (primed with its header) for the others.
func digestOf(obj s3origin.Object) (hash.Hash, string) {
	if sha256RE.MatchString(obj.ETag) {
		return sha256.New(), s3origin.MethodSHA256
	}
	h := sha1.New()
	h.Write([]byte("blob " + strconv.FormatInt(obj.Size, 10) + "\x00"))
	return h, MethodGitBlob
}

// Verify checks r (a local copy of obj) against the digest the listing
// gave for obj at its commit: the sha256 of an LFS file or the git blob id
// of a small one. It needs no request: a commit's files never change. It
// returns ErrCorrupt when they differ.
func (c *Client) Verify(ctx context.Context, obj s3origin.Object, r io.ReaderAt) (s3origin.Verification, error) {
	if err := checkObject(obj); err != nil {
		return s3origin.Verification{}, fmt.Errorf("verify %w", err)
	}
	h, method := digestOf(obj)
	buf := make([]byte, min(s3origin.ReadBackBuf, max(obj.Size, 1)))
	if err := s3origin.ReadRange(ctx, r, 0, obj.Size, buf, func(p []byte) { h.Write(p) }); err != nil {
		return s3origin.Verification{}, fmt.Errorf("verify %s: %w", URL(obj), err)
	}
	return compareDigest(obj, method, h, "read back")
}

// compareDigest compares the digest h holds with the one listed for obj.
func compareDigest(obj s3origin.Object, method string, h hash.Hash, how string) (s3origin.Verification, error) {
	if got := hex.EncodeToString(h.Sum(nil)); got != obj.ETag {
		return s3origin.Verification{}, fmt.Errorf("verify %s: %w: %s of the local copy is %s, the Hub lists %s",
			URL(obj), s3origin.ErrCorrupt, method, got, obj.ETag)
	}
	return s3origin.Verification{Verified: true, Method: method, Detail: method + " " + obj.ETag + " at commit " + obj.VersionID + ", " + how}, nil
}

// NewRangeCheck returns nil: a Hub file's digest (sha256 or git blob id)
// is not a CRC whose ranges combine, so a copy filled piece by piece is
// checked by Verify reading it back. It still refuses an Object that did
// not come from List.
func (c *Client) NewRangeCheck(_ context.Context, obj s3origin.Object) (origin.RangeCheck, error) {
	if err := checkObject(obj); err != nil {
		return nil, fmt.Errorf("range check %w", err)
	}
	return nil, nil
}
