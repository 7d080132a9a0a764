package s3origin

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/warmfleet/warmfleet/spec"
)

// MaxObjectSize is above the largest object S3 (50 TB) or MinIO (50 TiB)
// stores. A server claiming more is broken or hostile; sizes this bounded
// also keep part counts and offsets far from overflowing int64.
const MaxObjectSize = 1 << 46

// Limits on a relative path; NAME_MAX is 255 on every Linux filesystem the
// cache may live on.
const (
	MaxRelPath     = 4096
	maxPathSegment = 255
)

// ValidRelPath reports why p cannot be used as a path under the cache
// directory, or nil. Keys come from a bucket we do not control: a key like
// "../x" or "/etc/x" must never escape the model's directory.
func ValidRelPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: empty path", ErrUnsafeKey)
	case len(p) > MaxRelPath:
		return fmt.Errorf("%w: path longer than %d bytes", ErrUnsafeKey, MaxRelPath)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: path %q is not valid UTF-8", ErrUnsafeKey, p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: path %q is absolute", ErrUnsafeKey, p)
	case strings.Contains(p, "\\"):
		return fmt.Errorf("%w: path %q contains a backslash", ErrUnsafeKey, p)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("%w: path %q contains control character %U", ErrUnsafeKey, p, r)
		}
	}
	for seg := range strings.SplitSeq(p, "/") {
		switch {
		case seg == "":
			return fmt.Errorf("%w: path %q has an empty segment", ErrUnsafeKey, p)
		case seg == "." || seg == "..":
			return fmt.Errorf("%w: path %q has a %q segment", ErrUnsafeKey, p, seg)
		case len(seg) > maxPathSegment:
			return fmt.Errorf("%w: path %q has a segment longer than %d bytes", ErrUnsafeKey, p, maxPathSegment)
		}
	}
	return nil
}

// List returns every object under src's prefix, sorted by key. It fails on
// an empty listing and on any key that is not a safe relative path, naming
// the key: a model with a file we would have to skip is not a model we can
// serve.
func (c *Client) List(ctx context.Context, src spec.S3URL) ([]Object, error) {
	what := "list " + src.String()
	var raw []types.Object
	in := &s3.ListObjectsV2Input{Bucket: aws.String(src.Bucket), Prefix: aws.String(src.Prefix)}
	// Not the SDK's paginator: it ends quietly on a truncated page without
	// a token (a partial model would look complete) and loops forever on a
	// token it was given before.
	seen := map[string]bool{}
	for {
		page, err := c.s3.ListObjectsV2(ctx, in)
		if err != nil {
			return nil, c.explain(err, what)
		}
		raw = append(raw, page.Contents...)
		next, err := nextPageToken(aws.ToBool(page.IsTruncated), aws.ToString(page.NextContinuationToken), seen)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if next == "" {
			return objectsFromListing(src, raw)
		}
		in.ContinuationToken = aws.String(next)
	}
}

// nextPageToken decides how a listing goes on after a page: "" when it is
// complete, the token of the next page, or an error when the server breaks
// the protocol. seen holds the tokens already followed.
func nextPageToken(truncated bool, token string, seen map[string]bool) (string, error) {
	switch {
	case !truncated:
		return "", nil
	case token == "":
		return "", fmt.Errorf("%w: a truncated listing page has no continuation token", ErrServer)
	case seen[token]:
		return "", fmt.Errorf("%w: the listing repeats continuation token %q", ErrServer, token)
	}
	seen[token] = true
	return token, nil
}

// objectsFromListing turns listed entries into Objects: it drops directory
// markers and rejects unsafe or clashing paths. Plain function so hostile
// listings can be tested without a server that stores hostile keys.
func objectsFromListing(src spec.S3URL, raw []types.Object) ([]Object, error) {
	objs := make([]Object, 0, len(raw))
	for _, o := range raw {
		key := aws.ToString(o.Key)
		size := aws.ToInt64(o.Size)
		if strings.HasSuffix(key, "/") && size == 0 {
			continue // "folder" created by a console; holds no data
		}
		rel, ok := strings.CutPrefix(key, src.Prefix)
		if !ok {
			return nil, fmt.Errorf("list %s: %w: key %q is outside the prefix", src, ErrUnsafeKey, key)
		}
		if size < 0 {
			return nil, fmt.Errorf("list %s: key %q has negative size %d", src, key, size)
		}
		if size > MaxObjectSize {
			return nil, fmt.Errorf("list %s: %w: key %q has size %d, more than any S3 object can have", src, ErrServer, key, size)
		}
		if err := ValidRelPath(rel); err != nil {
			return nil, fmt.Errorf("list %s: key %q: %w", src, key, err)
		}
		objs = append(objs, Object{
			Bucket:       src.Bucket,
			Key:          key,
			Path:         rel,
			Size:         size,
			ETag:         strings.Trim(aws.ToString(o.ETag), `"`),
			LastModified: aws.ToTime(o.LastModified),
		})
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("list %s: %w under %s", src, ErrEmpty, src)
	}
	if err := CheckPathClashes(objs); err != nil {
		return nil, fmt.Errorf("list %s: %w", src, err)
	}
	return objs, nil
}

// CheckPathClashes rejects a file that would also have to be a directory
// ("a" and "a/b"), which no local filesystem can hold, and a key listed
// twice, which S3 never does. It sorts objs by Path.
func CheckPathClashes(objs []Object) error {
	sort.Slice(objs, func(i, j int) bool { return objs[i].Path < objs[j].Path })
	files := make(map[string]bool, len(objs))
	for _, o := range objs {
		if files[o.Path] {
			return fmt.Errorf("%w: key %q is listed twice", ErrServer, o.Key)
		}
		files[o.Path] = true
	}
	for _, o := range objs {
		for i := strings.IndexByte(o.Path, '/'); i >= 0; {
			if dir := o.Path[:i]; files[dir] {
				return fmt.Errorf("%w: key %q needs %q to be a directory, but it is also an object", ErrUnsafeKey, o.Key, dir)
			}
			next := strings.IndexByte(o.Path[i+1:], '/')
			if next < 0 {
				break
			}
			i += 1 + next
		}
	}
	return nil
}
