package spec

import (
	"fmt"
	"regexp"
	"strings"
)

// S3URL is a parsed s3://bucket/prefix/ source.
type S3URL struct {
	Bucket string
	// Prefix is the key prefix, empty or ending in "/".
	Prefix string
}

func (u S3URL) String() string { return "s3://" + u.Bucket + "/" + u.Prefix }

// bucketRE follows S3's bucket naming rules (3-63 characters, lower case,
// digits, dots and hyphens, starting and ending with a letter or digit).
var bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// ParseS3URL parses s3://bucket/prefix. A prefix that does not end in "/" gets
// one: a source names a folder of files, never a single object.
func ParseS3URL(s string) (S3URL, error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		return S3URL{}, fmt.Errorf("source %q: want s3://bucket/prefix/", s)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	if !bucketRE.MatchString(bucket) || strings.Contains(bucket, "..") {
		return S3URL{}, fmt.Errorf("source %q: bucket %q is not a valid S3 bucket name", s, bucket)
	}
	if prefix != "" {
		if err := checkFolder(strings.TrimSuffix(prefix, "/"), ""); err != nil {
			return S3URL{}, fmt.Errorf("source %q: prefix %q: %w", s, prefix, err)
		}
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return S3URL{Bucket: bucket, Prefix: prefix}, nil
}

// checkFolder checks the folder part of a source URL (without its trailing
// '/'), which becomes part of the requests made and of the prefix every
// listed name must carry: at most 900 bytes, no control character nor any
// rune of bad, and no empty, '.' or '..' segment.
func checkFolder(p, bad string) error {
	if len(p) > 900 {
		return fmt.Errorf("longer than 900 bytes")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(bad, r) {
			return fmt.Errorf("has character %q", r)
		}
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("has an empty, '.' or '..' segment")
		}
	}
	return nil
}
