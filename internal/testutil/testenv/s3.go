package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/s3put"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// S3 is a running versitygw gateway (a real S3 server) with a posix backend.
type S3 struct {
	// Endpoint is the base URL, for example http://127.0.0.1:41234.
	Endpoint string
	// Addr is the host:port the gateway listens on.
	Addr      string
	AccessKey string
	SecretKey string
	Region    string
	// Dir is the posix backend's root: one sub-directory per bucket.
	Dir string
}

// S3 credentials of the root account. They only protect a loopback gateway
// that lives as long as one test or benchmark.
const (
	s3AccessKey = "warmfleettestkey"
	s3SecretKey = "warmfleettestsecret0123456789abcdef"
	s3Region    = "us-east-1"
)

// StartS3 starts versitygw on a free loopback port with its backend in a
// temporary directory and stops it when the test ends.
func StartS3(tb testing.TB) *S3 {
	tb.Helper()
	Bin(tb, "versitygw") // skip, or fail in CI, when it is missing
	dir := tb.TempDir()
	return startForTest(tb, "versitygw", 30*time.Second, func(ctx context.Context) (*S3, func() error, error) {
		return StartS3Process(ctx, dir, "")
	})
}

// VersitygwPath finds the versitygw binary in the repository's bin/ or PATH.
func VersitygwPath() (string, error) {
	return ToolPath("versitygw", "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0")
}

// StartS3Process starts versitygw serving dir (created if missing) on addr
// (host:port; empty picks a free loopback port) and waits until it answers
// HTTP or ctx ends. ctx bounds only the start: the gateway runs until stop,
// which also removes nothing from dir. It is for benchmarks and commands;
// tests use StartS3.
func StartS3Process(ctx context.Context, dir, addr string) (*S3, func() error, error) {
	bin, err := VersitygwPath()
	if err != nil {
		return nil, nil, err
	}
	return StartVersitygw(ctx, bin, dir, addr)
}

// StartVersitygw is StartS3Process with the versitygw binary given: a
// command built with -trimpath cannot find the repository's bin/.
func StartVersitygw(ctx context.Context, bin, dir, addr string) (*S3, func() error, error) {
	var err error
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("versitygw backend dir: %w", err)
	}
	// A port picked by us may be taken by someone else before the gateway
	// binds it; try a few fresh ones rather than fail a test on that race.
	attempts := 1
	if addr == "" {
		attempts = 3
	}
	var lastErr error
	for range attempts {
		a := addr
		if a == "" {
			if a, err = PickFreeAddr(); err != nil {
				return nil, nil, err
			}
		}
		s, stop, err := startVersitygw(ctx, bin, dir, a)
		if err == nil {
			return s, stop, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, nil, lastErr
}

func startVersitygw(ctx context.Context, bin, dir, addr string) (*S3, func() error, error) {
	s := &S3{
		Endpoint:  "http://" + addr,
		Addr:      addr,
		AccessKey: s3AccessKey,
		SecretKey: s3SecretKey,
		Region:    s3Region,
		Dir:       dir,
	}
	cmd := exec.Command(bin,
		"--port", addr,
		"--access", s.AccessKey,
		"--secret", s.SecretKey,
		"--region", s.Region,
		"--quiet",
		"posix", dir)
	// Only the flags configure it: VGW_* or ROOT_* variables of the caller
	// must not leak in.
	cmd.Env = filteredEnv(os.Environ(), "VGW_", "ROOT_")
	svc, err := startService(cmd, 8<<10)
	if err != nil {
		return nil, nil, err
	}
	// versitygw waits for clients' idle keep-alive connections; a test
	// fixture need not shut down gracefully, so a kill is no error.
	stop := func() error { svc.stop(2 * time.Second); return nil }
	if err := WaitHTTP(ctx, nil, s.Endpoint+"/", svc.exited); err != nil {
		return nil, nil, svc.startFailed("versitygw on "+addr, err)
	}
	return s, stop, nil
}

func filteredEnv(env []string, dropPrefixes ...string) []string {
	out := env[:0:0]
next:
	for _, kv := range env {
		for _, p := range dropPrefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// tailBuffer keeps the last max bytes written, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// Env returns AWS_* variables that point a child process (or
// config.LoadDefaultConfig after t.Setenv) at this gateway.
func (s *S3) Env() []string {
	return AWSEnv(s.Endpoint, s.AccessKey, s.SecretKey, s.Region)
}

// AWSEnv returns the AWS_* variables that point an SDK client at the S3
// server at endpoint with static keys. IMDS is disabled so nothing tries to
// reach 169.254.169.254.
func AWSEnv(endpoint, accessKey, secretKey, region string) []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + accessKey,
		"AWS_SECRET_ACCESS_KEY=" + secretKey,
		"AWS_REGION=" + region,
		"AWS_DEFAULT_REGION=" + region,
		"AWS_ENDPOINT_URL_S3=" + endpoint,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// SetEnv sets Env's variables for the duration of the test (not parallel
// safe, as with every t.Setenv). It also clears AWS_PROFILE and a session
// token so the static keys are the ones used.
func (s *S3) SetEnv(t *testing.T) {
	t.Helper()
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_SESSION_TOKEN", "")
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// NewClient returns a path-style S3 client for the gateway.
func (s *S3) NewClient() *s3.Client {
	return s3.New(s3.Options{
		Region:       s.Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient:   awshttp.NewBuildableClient(),
		// The test helpers upload streams over plain HTTP: only then does
		// the SDK accept a body it cannot rewind.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
	})
}

// Client is NewClient for tests.
func (s *S3) Client(tb testing.TB) *s3.Client {
	tb.Helper()
	return s.NewClient()
}

// CreateBucket creates a bucket or fails the test.
func (s *S3) CreateBucket(tb testing.TB, name string) {
	tb.Helper()
	if err := s.MakeBucket(context.Background(), name); err != nil {
		tb.Fatal(err)
	}
}

// Access is the gateway's host:port and the credentials to use: for code
// that takes an S3 server through an interface.
func (s *S3) Access() (addr, accessKey, secretKey, region string) {
	return s.Addr, s.AccessKey, s.SecretKey, s.Region
}

// MakeBucket creates a bucket.
func (s *S3) MakeBucket(ctx context.Context, name string) error {
	return s3put.MakeBucket(ctx, s.NewClient(), name)
}

// PutObject uploads size bytes of body as bucket/key or fails the test.
func (s *S3) PutObject(tb testing.TB, bucket, key string, body io.Reader, size int64) {
	tb.Helper()
	if err := s.Put(context.Background(), bucket, key, body, size); err != nil {
		tb.Fatal(err)
	}
}

// Put uploads size bytes of body as bucket/key in one request, streaming.
func (s *S3) Put(ctx context.Context, bucket, key string, body io.Reader, size int64) error {
	return s3put.Put(ctx, s.NewClient(), bucket, key, body, size)
}

// PutMultipart uploads body as bucket/key in parts of partSize bytes (the
// last may be shorter) or fails the test. S3 then reports a "<md5>-N" ETag.
func (s *S3) PutMultipart(tb testing.TB, bucket, key string, body io.Reader, size, partSize int64) {
	tb.Helper()
	if err := s.PutParts(context.Background(), bucket, key, body, size, partSize); err != nil {
		tb.Fatal(err)
	}
}

// PutParts is PutMultipart for non-test callers. Each part is buffered in
// memory, so keep partSize modest.
func (s *S3) PutParts(ctx context.Context, bucket, key string, body io.Reader, size, partSize int64) error {
	if partSize <= 0 || size < 0 {
		return fmt.Errorf("put multipart s3://%s/%s: size %d, part size %d", bucket, key, size, partSize)
	}
	c := s.NewClient()
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return fmt.Errorf("create multipart upload s3://%s/%s: %w", bucket, key, err)
	}
	abort := func(err error) error {
		_, _ = c.AbortMultipartUpload(context.WithoutCancel(ctx), &s3.AbortMultipartUploadInput{
			Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
		})
		return fmt.Errorf("put multipart s3://%s/%s: %w", bucket, key, err)
	}
	var parts []types.CompletedPart
	buf := make([]byte, partSize)
	for n, off := int32(1), int64(0); off < size || n == 1; n++ {
		chunk := buf[:min(partSize, size-off)]
		if _, err := io.ReadFull(body, chunk); err != nil {
			return abort(fmt.Errorf("read part %d: %w", n, err))
		}
		out, err := c.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
			PartNumber: aws.Int32(n), Body: bytes.NewReader(chunk), ContentLength: aws.Int64(int64(len(chunk))),
		})
		if err != nil {
			return abort(fmt.Errorf("upload part %d: %w", n, err))
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n)})
		off += int64(len(chunk))
		if size == 0 {
			break
		}
	}
	_, err = c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		return abort(fmt.Errorf("complete: %w", err))
	}
	return nil
}
