package testenv

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

func TestStartS3PutAndGet(t *testing.T) {
	s := StartS3(t)
	s.CreateBucket(t, "models")
	ctx := context.Background()
	c := s.Client(t)

	data := make([]byte, 11<<20+123)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(data)

	// A plain reader (not seekable) must stream.
	s.PutObject(t, "models", "single/blob.bin", io.MultiReader(bytes.NewReader(data)), int64(len(data)))
	s.PutMultipart(t, "models", "multi/blob.bin", bytes.NewReader(data), int64(len(data)), 5<<20)

	sum := md5.Sum(data)
	tests := []struct {
		key      string
		wantETag string
	}{
		{"single/blob.bin", hex.EncodeToString(sum[:])},
		{"multi/blob.bin", multipartETag(data, 5<<20)},
	}
	for _, tt := range tests {
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("models"), Key: aws.String(tt.key)})
		if err != nil {
			t.Fatalf("get %s: %v", tt.key, err)
		}
		got, err := io.ReadAll(out.Body)
		_ = out.Body.Close()
		if err != nil {
			t.Fatalf("read %s: %v", tt.key, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: content differs (%d bytes, want %d)", tt.key, len(got), len(data))
		}
		if etag := strings.Trim(aws.ToString(out.ETag), `"`); etag != tt.wantETag {
			t.Errorf("%s: etag %s, want %s", tt.key, etag, tt.wantETag)
		}
	}
}

func multipartETag(data []byte, partSize int) string {
	var sums []byte
	n := 0
	for off := 0; off < len(data); off += partSize {
		s := md5.Sum(data[off:min(off+partSize, len(data))])
		sums = append(sums, s[:]...)
		n++
	}
	s := md5.Sum(sums)
	return hex.EncodeToString(s[:]) + "-" + strconv.Itoa(n)
}

func TestS3EnvPointsAtGateway(t *testing.T) {
	s := &S3{Endpoint: "http://127.0.0.1:1", AccessKey: "a", SecretKey: "b", Region: "r"}
	env := strings.Join(s.Env(), "\n")
	for _, want := range []string{"AWS_ENDPOINT_URL_S3=http://127.0.0.1:1", "AWS_ACCESS_KEY_ID=a", "AWS_SECRET_ACCESS_KEY=b", "AWS_REGION=r"} {
		if !strings.Contains(env, want) {
			t.Errorf("Env() lacks %s:\n%s", want, env)
		}
	}
}

func TestStartS3ProcessStopAndTakenPort(t *testing.T) {
	if _, err := VersitygwPath(); err != nil {
		Missing(t, "%v", err)
	}
	ctx := context.Background()
	s, stop, err := StartS3Process(ctx, t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	stopTwice(t, stop)
	if err := WaitTCP(canceledSoon(t), s.Addr); err == nil {
		t.Errorf("gateway still accepts connections on %s after stop", s.Addr)
	}
	// The port is now taken by a listener of ours: start must fail clearly.
	l := listen(t)
	_, _, err = StartS3Process(ctx, t.TempDir(), l)
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("start on a taken port %s: %v, want the gateway's bind error", l, err)
	}
}

func canceledSoon(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func listen(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l.Addr().String()
}

// stopTwice calls a service's stop function twice: the second call, after
// the service is gone, must succeed too.
func stopTwice(t *testing.T, stop func() error) {
	t.Helper()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}
