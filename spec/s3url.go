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
	if len(prefix) > 900 {
		return S3URL{}, fmt.Errorf("source %q: prefix longer than 900 bytes", s)
	}
	for _, r := range prefix {
		if r < 0x20 || r == 0x7f {
			return S3URL{}, fmt.Errorf("source %q: prefix has a control character", s)
		}
	}
	if strings.HasPrefix(prefix, "/") || strings.Contains(prefix, "//") {
		return S3URL{}, fmt.Errorf("source %q: prefix has an empty path segment", s)
	}
	for _, seg := range strings.Split(strings.TrimSuffix(prefix, "/"), "/") {
		if seg == "." || seg == ".." {
			return S3URL{}, fmt.Errorf("source %q: prefix has a %q segment", s, seg)
		}
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return S3URL{Bucket: bucket, Prefix: prefix}, nil
}
