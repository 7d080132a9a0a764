package s3origin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/warmfleet/warmfleet/spec"
)

func TestValidRelPath(t *testing.T) {
	tests := []struct {
		path    string
		wantErr string // substring; empty means valid
	}{
		{"config.json", ""},
		{"a/b/c.safetensors", ""},
		{"sub dir/ü.bin", ""},
		{"..a/b..", ""}, // dots inside names are fine
		{".hidden", ""},
		{"", "empty path"},
		{"/abs", "absolute"},
		{"../x", `".." segment`},
		{"a/../../x", `".." segment`},
		{"a/..", `".." segment`},
		{"./a", `"." segment`},
		{"a/./b", `"." segment`},
		{"a//b", "empty segment"},
		{"a/", "empty segment"},
		{`a\b`, "backslash"},
		{`..\x`, "backslash"},
		{"a\x00b", "control character"},
		{"a\nb", "control character"},
		{"a\x7fb", "control character"},
		{"a\u0085b", "control character"},
		{"a\xffb", "UTF-8"},
		{strings.Repeat("a/", 2048) + "b", "longer than 4096"},
		{strings.Repeat("x", 256), "segment longer than 255"},
		{strings.Repeat("x", 255), ""},
	}
	for _, tt := range tests {
		err := ValidRelPath(tt.path)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ValidRelPath(%q) = %v, want nil", tt.path, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ValidRelPath(%q) = %v, want error containing %q", tt.path, err, tt.wantErr)
		case err != nil && !errors.Is(err, ErrUnsafeKey):
			t.Errorf("ValidRelPath(%q) = %v, want ErrUnsafeKey", tt.path, err)
		}
	}
}

func FuzzValidRelPath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../x", "a//b", "/abs", `a\b`, "a/./b", "a\x00", "..", "."} {
		f.Add(s)
	}
	root := "/cache/model"
	f.Fuzz(func(t *testing.T, p string) {
		if ValidRelPath(p) != nil {
			return
		}
		// Whatever passes must stay inside the directory it is joined to
		// and name exactly itself there.
		if !filepath.IsLocal(p) {
			t.Fatalf("accepted non-local path %q", p)
		}
		joined := filepath.Join(root, p)
		if !strings.HasPrefix(joined, root+"/") || joined != root+"/"+p {
			t.Fatalf("accepted %q, which joins to %q", p, joined)
		}
		if strings.ContainsAny(p, "\\\x00") {
			t.Fatalf("accepted %q", p)
		}
	})
}

func obj(key string, size int64) types.Object {
	return types.Object{Key: aws.String(key), Size: aws.Int64(size), ETag: aws.String(`"0123456789abcdef0123456789abcdef"`),
		LastModified: aws.Time(time.Unix(1700000000, 0))}
}

func TestObjectsFromListing(t *testing.T) {
	src := spec.S3URL{Bucket: "b", Prefix: "models/llama/"}
	tests := []struct {
		name      string
		listing   []types.Object
		wantPaths []string
		wantErr   string
	}{
		{
			name:      "nested files sorted, markers skipped",
			listing:   []types.Object{obj("models/llama/z.bin", 3), obj("models/llama/", 0), obj("models/llama/sub/", 0), obj("models/llama/sub/a.bin", 1), obj("models/llama/config.json", 2)},
			wantPaths: []string{"config.json", "sub/a.bin", "z.bin"},
		},
		{name: "only markers", listing: []types.Object{obj("models/llama/", 0), obj("models/llama/x/", 0)}, wantErr: "no objects under s3://b/models/llama/"},
		{name: "empty", wantErr: "no objects under s3://b/models/llama/"},
		{name: "dot dot", listing: []types.Object{obj("models/llama/ok", 1), obj("models/llama/../x", 1)}, wantErr: `key "models/llama/../x"`},
		{name: "double slash", listing: []types.Object{obj("models/llama/a//b", 1)}, wantErr: `key "models/llama/a//b"`},
		{name: "absolute after prefix", listing: []types.Object{obj("models/llama//abs", 1)}, wantErr: "absolute"},
		{name: "marker with data", listing: []types.Object{obj("models/llama/dir/", 5)}, wantErr: "empty segment"},
		{name: "backslash", listing: []types.Object{obj(`models/llama/a\b`, 1)}, wantErr: "backslash"},
		{name: "outside prefix", listing: []types.Object{obj("other/x", 1)}, wantErr: "outside the prefix"},
		{name: "file and directory", listing: []types.Object{obj("models/llama/a", 1), obj("models/llama/a/b/c", 1)}, wantErr: `needs "a" to be a directory`},
		{name: "negative size", listing: []types.Object{obj("models/llama/a", -1)}, wantErr: "negative size"},
		// Two downloads into one file would mix their bytes, each verified
		// against the CRC of its own stream.
		{name: "key listed twice", listing: []types.Object{obj("models/llama/a", 1), obj("models/llama/b", 1), obj("models/llama/a", 2)}, wantErr: `"models/llama/a" is listed twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := objectsFromListing(src, tt.listing)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, o := range objs {
				paths = append(paths, o.Path)
				if o.Bucket != "b" || o.Key != src.Prefix+o.Path || o.ETag != "0123456789abcdef0123456789abcdef" {
					t.Errorf("object %+v", o)
				}
			}
			if fmt.Sprint(paths) != fmt.Sprint(tt.wantPaths) {
				t.Errorf("paths %v, want %v", paths, tt.wantPaths)
			}
		})
	}
}

func TestPartsAndRanges(t *testing.T) {
	tests := []struct {
		size, partSize int64
		want           int
		lastOff, lastN int64
	}{
		{0, 16, 0, 0, 0},
		{1, 16, 1, 0, 1},
		{16, 16, 1, 0, 16},
		{17, 16, 2, 16, 1},
		{32, 16, 2, 16, 16},
		{5<<30 + 7, 16 << 20, 321, 5 << 30, 7},
		{10, 0, 0, 0, 0},
		{-5, 16, 0, 0, 0},
	}
	for _, tt := range tests {
		n := Parts(tt.size, tt.partSize)
		if n != tt.want {
			t.Errorf("Parts(%d, %d) = %d, want %d", tt.size, tt.partSize, n, tt.want)
			continue
		}
		if n == 0 {
			continue
		}
		off, ln := PartRange(n-1, tt.size, tt.partSize)
		if off != tt.lastOff || ln != tt.lastN {
			t.Errorf("PartRange(last) of (%d, %d) = %d,%d want %d,%d", tt.size, tt.partSize, off, ln, tt.lastOff, tt.lastN)
		}
		// Parts tile the object exactly.
		var total int64
		for p := range n {
			o, l := PartRange(p, tt.size, tt.partSize)
			if o != total || l <= 0 {
				t.Fatalf("part %d at %d+%d, want offset %d", p, o, l, total)
			}
			total += l
		}
		if total != tt.size {
			t.Errorf("parts cover %d bytes of %d", total, tt.size)
		}
		if o, l := PartRange(n, tt.size, tt.partSize); o != 0 || l != 0 {
			t.Errorf("PartRange past the end = %d,%d", o, l)
		}
	}
}

func TestBackoff(t *testing.T) {
	base := 100 * time.Millisecond
	tests := []struct {
		attempt int
		r       float64
		want    time.Duration
	}{
		{1, 0, 50 * time.Millisecond},
		{1, 0.999999, 99999950 * time.Nanosecond},
		{2, 0, 100 * time.Millisecond},
		{3, 0.5, 300 * time.Millisecond},
		{7, 0, 3200 * time.Millisecond},
		{50, 0, 3200 * time.Millisecond}, // capped at 64x
		{0, 0, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Backoff(tt.attempt, base, tt.r); got != tt.want {
			t.Errorf("Backoff(%d, %v, %v) = %v, want %v", tt.attempt, base, tt.r, got, tt.want)
		}
	}
}

func TestParseContentRange(t *testing.T) {
	tests := []struct {
		in                 string
		first, last, total int64
		ok                 bool
	}{
		{"bytes 0-9/10", 0, 9, 10, true},
		{"bytes 16-31/100", 16, 31, 100, true},
		{"bytes 16-31/*", 16, 31, -1, true},
		{"bytes 5-4/10", 0, 0, 0, false},
		{"bytes 0-10/10", 0, 0, 0, false},
		{"bytes -1-4/10", 0, 0, 0, false},
		{"items 0-9/10", 0, 0, 0, false},
		{"bytes 0-9", 0, 0, 0, false},
		{"bytes a-9/10", 0, 0, 0, false},
		{"", 0, 0, 0, false},
	}
	for _, tt := range tests {
		f, l, tot, err := parseContentRange(tt.in)
		if (err == nil) != tt.ok || (tt.ok && (f != tt.first || l != tt.last || tot != tt.total)) {
			t.Errorf("parseContentRange(%q) = %d,%d,%d,%v", tt.in, f, l, tot, err)
		}
	}
}

func FuzzParseContentRange(f *testing.F) {
	f.Add("bytes 0-9/10")
	f.Add("bytes 1-2/*")
	f.Fuzz(func(t *testing.T, s string) {
		first, last, total, err := parseContentRange(s)
		if err != nil {
			return
		}
		if first < 0 || last < first || (total != -1 && total <= last) {
			t.Fatalf("%q parsed to %d-%d/%d", s, first, last, total)
		}
	})
}

func TestCheckRange(t *testing.T) {
	o := Object{Bucket: "b", Key: "k", Size: 100, ETag: "abc"}
	tests := []struct {
		name       string
		off, end   int64
		etag, cr   string
		length     int64
		wantErr    error
		wantSubstr string
	}{
		{"ok", 10, 20, `"abc"`, "bytes 10-19/100", 10, nil, ""},
		{"ok without etag", 10, 20, "", "bytes 10-19/100", 10, nil, ""},
		{"whole object without range header", 0, 100, `"abc"`, "", 100, nil, ""},
		{"etag changed", 10, 20, `"def"`, "bytes 10-19/100", 10, ErrSourceChanged, "ETag is now"},
		{"size changed", 10, 20, `"abc"`, "bytes 10-19/200", 10, ErrSourceChanged, "size is now 200"},
		{"range ignored", 10, 20, `"abc"`, "", 100, ErrServer, "Range ignored"},
		{"wrong range", 10, 20, `"abc"`, "bytes 0-9/100", 10, ErrServer, "asked for bytes 10-19"},
		{"wrong length", 10, 20, `"abc"`, "bytes 10-19/100", 11, ErrServer, "Content-Length 11"},
		{"garbage range", 10, 20, `"abc"`, "bytes x", 10, ErrServer, "bad Content-Range"},
	}
	for _, tt := range tests {
		err := CheckRange(o, tt.off, tt.end, tt.etag, tt.cr, tt.length)
		if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) ||
			(err != nil && !strings.Contains(err.Error(), tt.wantSubstr)) {
			t.Errorf("%s: err %v, want %v containing %q", tt.name, err, tt.wantErr, tt.wantSubstr)
		}
	}
}

func TestChooseCheck(t *testing.T) {
	md5etag := "0123456789abcdef0123456789abcdef"
	tests := []struct {
		name  string
		facts objectFacts
		want  check
	}{
		{"single part md5", objectFacts{ETag: md5etag}, check{method: MethodMD5, expected: md5etag}},
		{"upper case etag", objectFacts{ETag: strings.ToUpper(md5etag)}, check{method: MethodMD5, expected: md5etag}},
		{"multipart", objectFacts{ETag: md5etag + "-12"}, check{method: MethodMD5Multipart, expected: md5etag, parts: 12}},
		{"full object crc64 preferred", objectFacts{ETag: md5etag + "-3", ChecksumType: types.ChecksumTypeFullObject,
			Checksums: map[string]string{MethodCRC64NVME: "AAAAAAAAAAA=", MethodSHA256: "x"}}, check{method: MethodCRC64NVME, expected: "AAAAAAAAAAA="}},
		{"single part sha256 without type", objectFacts{ETag: md5etag, Checksums: map[string]string{MethodSHA256: "c2hh"}},
			check{method: MethodSHA256, expected: "c2hh"}},
		{"composite checksum ignored", objectFacts{ETag: md5etag + "-2", ChecksumType: types.ChecksumTypeComposite,
			Checksums: map[string]string{MethodCRC32C: "abcd-2"}}, check{method: MethodMD5Multipart, expected: md5etag, parts: 2}},
		{"composite value without type ignored", objectFacts{ETag: md5etag, Checksums: map[string]string{MethodCRC32: "abcd-2"}},
			check{method: MethodMD5, expected: md5etag}},
		{"kms etag is not md5", objectFacts{ETag: md5etag, Encrypted: "aws:kms"}, check{method: MethodNone}},
		{"kms with checksum", objectFacts{ETag: md5etag, Encrypted: "aws:kms", ChecksumType: types.ChecksumTypeFullObject,
			Checksums: map[string]string{MethodCRC32C: "q"}}, check{method: MethodCRC32C, expected: "q"}},
		{"odd etag", objectFacts{ETag: "abc"}, check{method: MethodNone}},
		{"too many parts", objectFacts{ETag: md5etag + "-10001"}, check{method: MethodNone}},
		{"zero parts", objectFacts{ETag: md5etag + "-0"}, check{method: MethodNone}},
	}
	for _, tt := range tests {
		got := chooseCheck(tt.facts)
		if got.method != tt.want.method || got.expected != tt.want.expected || got.parts != tt.want.parts {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
		if got.method == MethodNone && got.reason == "" {
			t.Errorf("%s: no reason given for not verifying", tt.name)
		}
	}
}

func TestMultipartLayoutOK(t *testing.T) {
	tests := []struct {
		size, partSize int64
		n              int
		want           bool
	}{
		{12 << 20, 5 << 20, 3, true},
		{10 << 20, 5 << 20, 2, true},
		{10 << 20, 5 << 20, 3, false}, // parts were not equal
		{12 << 20, 8 << 20, 3, false},
		{12 << 20, 0, 3, false},
		{1, 5 << 20, 1, true},
	}
	for _, tt := range tests {
		if got := multipartLayoutOK(tt.size, tt.partSize, tt.n); got != tt.want {
			t.Errorf("multipartLayoutOK(%d, %d, %d) = %v", tt.size, tt.partSize, tt.n, got)
		}
	}
}

func apiErr(code string, status int) error {
	return &smithy.OperationError{ServiceID: "S3", OperationName: "GetObject", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err: &smithy.GenericAPIError{Code: code, Message: "m"}},
	}}
}

func TestRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"slow down", apiErr("SlowDown", 503), true},
		{"internal error", apiErr("InternalError", 500), true},
		{"request timeout", apiErr("RequestTimeout", 400), true},
		{"bad gateway", apiErr("", 502), true},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"short body", fmt.Errorf("x: %w", ErrShortBody), true},
		{"reset", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{"stall", &awshttp.ResponseTimeoutError{TimeoutDur: time.Second}, true},
		{"precondition", apiErr("PreconditionFailed", 412), false},
		{"changed", fmt.Errorf("x: %w", ErrSourceChanged), false},
		{"access denied", apiErr("AccessDenied", 403), false},
		{"no such key", apiErr("NoSuchKey", 404), false},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), false},
		{"local write", LocalError{fmt.Errorf("write: %w", syscall.EPIPE)}, false},
		{"server misbehaved", fmt.Errorf("%w: range ignored", ErrServer), false},
	}
	for _, tt := range tests {
		if got := retryable(tt.err); got != tt.want {
			t.Errorf("%s: retryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestExplain(t *testing.T) {
	c := &Client{endpoint: "http://127.0.0.1:9"}
	tests := []struct {
		err  error
		kind error
		text string
	}{
		{apiErr("InvalidAccessKeyId", 403), ErrCredentials, "credentials"},
		{apiErr("SignatureDoesNotMatch", 403), ErrCredentials, "AWS_SECRET_ACCESS_KEY"},
		{apiErr("NoSuchBucket", 404), ErrNoSuchBucket, "no such bucket"},
		{apiErr("AccessDenied", 403), ErrAccessDenied, "lack permission"},
		{apiErr("", 403), nil, "op"}, // a bare 403 with no code says nothing more
		{apiErr("PreconditionFailed", 412), ErrSourceChanged, "changed"},
		{apiErr("NoSuchKey", 404), ErrNotFound, "not found"},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, ErrUnreachable, "cannot connect to http://127.0.0.1:9"},
	}
	for _, tt := range tests {
		err := c.explain(tt.err, "op")
		if (tt.kind != nil && !errors.Is(err, tt.kind)) || !strings.Contains(err.Error(), tt.text) || !strings.HasPrefix(err.Error(), "op: ") {
			t.Errorf("explain(%v) = %v, want %v mentioning %q", tt.err, err, tt.kind, tt.text)
		}
	}
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		opts    Options
		wantErr string
	}{
		{Options{}, ""},
		{Options{PartSize: MinPartSize - 1}, "part size"},
		{Options{PartSize: MaxPartSize + 1}, "part size"},
		{Options{Concurrency: -1}, "concurrency"},
		{Options{Concurrency: 1000}, "concurrency"},
		{Options{MaxAttempts: -2}, "max attempts"},
	}
	for _, tt := range tests {
		o, err := tt.opts.withDefaults()
		if tt.wantErr == "" {
			if err != nil || o.Concurrency != DefaultConcurrency || o.PartSize != DefaultPartSize || o.Region != DefaultRegion {
				t.Errorf("defaults: %+v, %v", o, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%+v: err %v, want %q", tt.opts, err, tt.wantErr)
		}
	}
}

// Parts counts whole parts for any size, including ones where size +
// partSize would overflow.
func TestPartsNearMaxInt64(t *testing.T) {
	for _, partSize := range []int64{MinPartSize, DefaultPartSize, MaxPartSize} {
		n := Parts(math.MaxInt64, partSize)
		off, length := PartRange(n-1, math.MaxInt64, partSize)
		if n <= 0 || length <= 0 || off+length != math.MaxInt64 {
			t.Errorf("Parts(MaxInt64, %d) = %d, last part %d+%d", partSize, n, off, length)
		}
	}
}

// A range whose end overflows int64 is out of bounds, not an empty stream.
func TestOpenRangeBounds(t *testing.T) {
	o := Object{Bucket: "b", Key: "k", Size: 100, ETag: "e"}
	for _, r := range []struct{ off, n int64 }{{10, math.MaxInt64}, {math.MaxInt64, 1}, {-1, 5}, {5, -1}, {99, 2}} {
		if rc, err := (&Client{}).OpenRange(context.Background(), o, r.off, r.n); err == nil {
			rc.Close()
			t.Errorf("OpenRange(%d, %d) of %d bytes accepted", r.off, r.n, o.Size)
		}
	}
}
