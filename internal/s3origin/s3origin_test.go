package s3origin

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/warmfleet/warmfleet/integration/netlab/s3fault"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/spec"
)

// These tests run against a real S3 server (versitygw) on loopback.

const bucket = "models"

func randomBytes(seed byte, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// testOrigin is a Client for endpoint with the gateway's keys, fast retries and
// a byte counter.
type testOrigin struct {
	*Client
	bytes atomic.Int64
}

func newOrigin(t *testing.T, s *testenv.S3, endpoint string, opts Options) *testOrigin {
	t.Helper()
	o := &testOrigin{}
	opts.Endpoint = endpoint
	if opts.Credentials == nil {
		opts.Credentials = credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, "")
	}
	if opts.RetryBackoff == 0 {
		opts.RetryBackoff = 2 * time.Millisecond
	}
	if opts.PartSize == 0 {
		opts.PartSize = MinPartSize
	}
	opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	opts.OnBytes = func(n int) { o.bytes.Add(int64(n)) }
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	o.Client = c
	return o
}

func listOne(t *testing.T, c *Client, key string) Object {
	t.Helper()
	dir, _ := filepath.Split(key)
	objs, err := c.List(context.Background(), spec.S3URL{Bucket: bucket, Prefix: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Key == key {
			return o
		}
	}
	t.Fatalf("%s not listed in %+v", key, objs)
	return Object{}
}

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func assertContent(t *testing.T, f *os.File, want []byte) {
	t.Helper()
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("downloaded %d bytes differ from the %d-byte object", len(got), len(want))
	}
}

func TestListWithEnvironmentConfig(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	for _, k := range []string{"llama/config.json", "llama/weights/model-00001.safetensors", "llama/weights/deep/x.bin", "llama-other/y", "other/z"} {
		s.PutObject(t, bucket, k, strings.NewReader(k), int64(len(k)))
	}
	s.PutObject(t, bucket, "llama/empty-dir/", strings.NewReader(""), 0)
	// Only the environment says where S3 is: AWS_ENDPOINT_URL_S3 must be
	// honoured and addressing must be path-style (a virtual-hosted
	// "models.127.0.0.1" would not resolve).
	s.SetEnv(t)
	c, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint() != s.Endpoint {
		t.Errorf("endpoint %q, want %q from AWS_ENDPOINT_URL_S3", c.Endpoint(), s.Endpoint)
	}
	objs, err := c.List(context.Background(), spec.S3URL{Bucket: bucket, Prefix: "llama/"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, fmt.Sprintf("%s:%d", o.Path, o.Size))
		if len(o.ETag) != 32 || strings.Contains(o.ETag, `"`) || o.LastModified.IsZero() || o.Key != "llama/"+o.Path {
			t.Errorf("object %+v", o)
		}
	}
	want := "[config.json:17 weights/deep/x.bin:24 weights/model-00001.safetensors:37]"
	if fmt.Sprint(got) != want {
		t.Errorf("listed %v, want %s", got, want)
	}
}

// versitygw (and the SDK's URL handling) normalise "../x", "a//b" and
// "/abs" on PUT, so such keys cannot be stored there; objectsFromListing's
// table test covers them. A backslash survives, so it is tested here.
func TestListRejectsUnsafeKeyFromServer(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	s.PutObject(t, bucket, "m/ok.bin", strings.NewReader("x"), 1)
	s.PutObject(t, bucket, `m/..\evil`, strings.NewReader("x"), 1)
	c := newOrigin(t, s, s.Endpoint, Options{})
	_, err := c.List(context.Background(), spec.S3URL{Bucket: bucket, Prefix: "m/"})
	if !errors.Is(err, ErrUnsafeKey) || !strings.Contains(err.Error(), `m/..\\evil`) {
		t.Fatalf("List = %v, want ErrUnsafeKey naming the key", err)
	}
}

func TestListErrors(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	s.PutObject(t, bucket, "m/a", strings.NewReader("x"), 1)
	ctx := context.Background()
	tests := []struct {
		name     string
		endpoint string
		creds    credentials.StaticCredentialsProvider
		src      spec.S3URL
		kind     error
		text     string
	}{
		{"missing bucket", s.Endpoint, credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
			spec.S3URL{Bucket: "nope", Prefix: "m/"}, ErrNoSuchBucket, "no such bucket at " + s.Endpoint},
		{"wrong access key", s.Endpoint, credentials.NewStaticCredentialsProvider("wrongkey", s.SecretKey, ""),
			spec.S3URL{Bucket: bucket, Prefix: "m/"}, ErrCredentials, "rejected the credentials"},
		{"wrong secret", s.Endpoint, credentials.NewStaticCredentialsProvider(s.AccessKey, "wrongsecret", ""),
			spec.S3URL{Bucket: bucket, Prefix: "m/"}, ErrCredentials, "SignatureDoesNotMatch"},
		{"unreachable", "http://" + testenv.FreeAddr(t), credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
			spec.S3URL{Bucket: bucket, Prefix: "m/"}, ErrUnreachable, "cannot connect to http://127.0.0.1:"},
		{"empty prefix", s.Endpoint, credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
			spec.S3URL{Bucket: bucket, Prefix: "nothing/"}, ErrEmpty, "no objects under s3://models/nothing/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newOrigin(t, s, tt.endpoint, Options{Credentials: tt.creds, MaxAttempts: 2})
			_, err := c.List(ctx, tt.src)
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("List = %v\nwant %v containing %q", err, tt.kind, tt.text)
			}
		})
	}
}

func TestDownloadAndVerify(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	single := randomBytes(1, 3<<20+5)
	multi := randomBytes(2, 12<<20+7)
	s.PutObject(t, bucket, "m/single.bin", bytes.NewReader(single), int64(len(single)))
	s.PutMultipart(t, bucket, "m/multi.bin", bytes.NewReader(multi), int64(len(multi)), 5<<20)
	s.PutObject(t, bucket, "m/empty.bin", bytes.NewReader(nil), 0)

	tests := []struct {
		key             string
		data            []byte
		ignoreChecksums bool
		method          string
	}{
		// versitygw stores a full-object CRC64NVME for every object.
		{"m/single.bin", single, false, MethodCRC64NVME},
		{"m/multi.bin", multi, false, MethodCRC64NVME},
		{"m/single.bin", single, true, MethodMD5},
		{"m/multi.bin", multi, true, MethodMD5Multipart},
		{"m/empty.bin", nil, true, MethodMD5},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s", tt.key, tt.method), func(t *testing.T) {
			c := newOrigin(t, s, s.Endpoint, Options{Concurrency: 3})
			c.ignoreChecksums = tt.ignoreChecksums
			o := listOne(t, c.Client, tt.key)
			f := tempFile(t)
			var mu sync.Mutex
			partBytes := map[int]int64{}
			var v Verification
			err := c.Download(context.Background(), o, f, Plan{
				OnPart: func(part int, n int64) {
					mu.Lock()
					defer mu.Unlock()
					partBytes[part] += n
				},
				OnVerify: func(got Verification) { v = got },
			})
			if err != nil {
				t.Fatal(err)
			}
			assertContent(t, f, tt.data)
			if !v.Verified || v.Method != tt.method {
				t.Errorf("verification %+v, want verified by %s", v, tt.method)
			}
			if got := c.bytes.Load(); got != int64(len(tt.data)) {
				t.Errorf("OnBytes counted %d, want %d", got, len(tt.data))
			}
			if len(partBytes) != Parts(o.Size, MinPartSize) {
				t.Errorf("OnPart saw %d parts, want %d", len(partBytes), Parts(o.Size, MinPartSize))
			}
			for part, n := range partBytes {
				if _, want := PartRange(part, o.Size, MinPartSize); n != want {
					t.Errorf("part %d reported %d bytes (maybe twice), want %d", part, n, want)
				}
			}

			if len(tt.data) == 0 {
				return
			}
			// Flip one byte on disk: Verify must notice.
			off := int64(len(tt.data)) - 3
			if _, err := f.WriteAt([]byte{tt.data[off] ^ 0x40}, off); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Verify(context.Background(), o, f); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Verify of a corrupted copy = %v, want ErrCorrupt", err)
			}
			// A truncated copy too.
			if err := f.Truncate(off); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Verify(context.Background(), o, f); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Verify of a truncated copy = %v, want ErrCorrupt", err)
			}
		})
	}
}

// failingFile fails every write once failAfter bytes have been written.
type failingFile struct {
	*os.File
	left atomic.Int64
}

var errDiskFull = errors.New("disk full (injected)")

func (f *failingFile) WriteAt(p []byte, off int64) (int, error) {
	if f.left.Add(-int64(len(p))) < 0 {
		return 0, errDiskFull
	}
	return f.File.WriteAt(p, off)
}

func TestDownloadResumesFromDoneParts(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(3, 6<<20+123) // 7 parts of 1 MiB
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	c := newOrigin(t, s, s.Endpoint, Options{Concurrency: 2})
	o := listOne(t, c.Client, "m/w.bin")

	// First run: the disk "fills up" after 2.5 MiB. The write error is
	// final (not retried) and the parts reported so far stay valid.
	f := tempFile(t)
	ff := &failingFile{File: f}
	ff.left.Store(5 << 19)
	var mu sync.Mutex
	done := map[int]bool{}
	err := c.Download(context.Background(), o, ff, Plan{OnPart: func(part int, n int64) {
		mu.Lock()
		defer mu.Unlock()
		done[part] = true
	}})
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("first run: %v, want the injected write error", err)
	}
	if len(done) == 0 || len(done) >= Parts(o.Size, MinPartSize) {
		t.Fatalf("first run finished %d parts; the test needs some but not all", len(done))
	}

	// Second run skips them and fetches only the rest.
	c.bytes.Store(0)
	var want int64
	for part := range Parts(o.Size, MinPartSize) {
		if !done[part] {
			_, n := PartRange(part, o.Size, MinPartSize)
			want += n
		}
	}
	var fetched []int
	var v Verification
	err = c.Download(context.Background(), o, f, Plan{
		Done:     func(part int) bool { return done[part] },
		OnPart:   func(part int, _ int64) { mu.Lock(); fetched = append(fetched, part); mu.Unlock() },
		OnVerify: func(got Verification) { v = got },
	})
	if err != nil {
		t.Fatal(err)
	}
	// Fetched parts were checked as they streamed; only the earlier run's
	// parts were read back.
	wantDetail := fmt.Sprintf("%d of %d parts read back", len(done), Parts(o.Size, MinPartSize))
	if !v.Verified || v.Method != MethodCRC64NVME || !strings.Contains(v.Detail, wantDetail) {
		t.Errorf("verification %+v, want crc64nvme with %q", v, wantDetail)
	}
	assertContent(t, f, data)
	if got := c.bytes.Load(); got != want {
		t.Errorf("second run fetched %d bytes, want %d (only the missing parts)", got, want)
	}
	for _, p := range fetched {
		if done[p] {
			t.Errorf("part %d fetched again although Done", p)
		}
	}
}

// changingFile replaces the object in S3 the first time it is written to.
type changingFile struct {
	*os.File
	once   sync.Once
	change func()
}

func (f *changingFile) WriteAt(p []byte, off int64) (int, error) {
	f.once.Do(f.change)
	return f.File.WriteAt(p, off)
}

func TestDownloadFailsWhenSourceChanges(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(4, 6<<20)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	c := newOrigin(t, s, s.Endpoint, Options{Concurrency: 1})
	o := listOne(t, c.Client, "m/w.bin")

	newData := randomBytes(5, 6<<20)
	f := &changingFile{File: tempFile(t), change: func() {
		s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(newData), int64(len(newData)))
	}}
	err := c.Download(context.Background(), o, f, Plan{})
	if !errors.Is(err, ErrSourceChanged) || !strings.Contains(err.Error(), "s3://models/m/w.bin") {
		t.Fatalf("Download = %v, want ErrSourceChanged naming the object", err)
	}
}

func TestDownloadRetriesThroughFaults(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(6, 5<<20+17)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	proxy := s3fault.Start(t, s.Endpoint)
	c := newOrigin(t, s, proxy.URL(), Options{Concurrency: 3})
	o := listOne(t, c.Client, "m/w.bin")
	f := tempFile(t)

	before := proxy.Stats()
	proxy.SlowDown(3)            // the first is the HEAD, retried by the SDK
	proxy.ResetAfter(300<<10, 4) // each cut part resumes at byte 300 KiB
	if err := c.Download(context.Background(), o, f, Plan{}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, f, data)
	st := proxy.Stats()
	if st.SlowDowns-before.SlowDowns != 3 || st.Resets-before.Resets != 4 {
		t.Errorf("faults fired: %+v (before %+v), want 3 slow downs and 4 resets", st, before)
	}
	// Resuming, not restarting: every broken body is followed by a GET
	// that starts inside its part, and each byte is counted once.
	resumed := 0
	for _, line := range proxy.Log() {
		var first, last int64
		if _, err := fmt.Sscanf(line, "GET /models/m/w.bin bytes=%d-%d", &first, &last); err == nil && first%MinPartSize != 0 {
			resumed++
		}
	}
	if resumed != 4 {
		t.Errorf("%d GETs resumed inside a part, want 4 (one per reset); requests:\n%s", resumed, strings.Join(proxy.Log(), "\n"))
	}
	if got := c.bytes.Load(); got != int64(len(data)) {
		t.Errorf("OnBytes counted %d, want %d", got, len(data))
	}
}

func TestDownloadGivesUpOnPersistentThrottling(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	s.PutObject(t, bucket, "m/w.bin", strings.NewReader("payload"), 7)
	proxy := s3fault.Start(t, s.Endpoint)
	c := newOrigin(t, s, proxy.URL(), Options{MaxAttempts: 3})
	o := listOne(t, c.Client, "m/w.bin")
	proxy.SlowDownGETs(1000)
	err := c.Download(context.Background(), o, tempFile(t), Plan{})
	if err == nil || !strings.Contains(err.Error(), "giving up after 3 attempts") || !strings.Contains(err.Error(), "SlowDown") {
		t.Fatalf("Download = %v, want giving up after 3 SlowDowns", err)
	}
}

func TestDownloadStopsOnCancel(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(7, 8<<20)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	c := newOrigin(t, s, s.Endpoint, Options{Concurrency: 2})
	o := listOne(t, c.Client, "m/w.bin")
	ctx, cancel := context.WithCancel(context.Background())
	var parts atomic.Int32
	err := c.Download(ctx, o, tempFile(t), Plan{OnPart: func(int, int64) {
		parts.Add(1)
		cancel()
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Download = %v, want context.Canceled", err)
	}
	if n := parts.Load(); n >= int32(Parts(o.Size, MinPartSize)) {
		t.Errorf("all %d parts finished despite cancel", n)
	}
}

func TestPlainCopyBaseline(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(8, 3<<20+1)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	dst := filepath.Join(t.TempDir(), "out")
	if err := PlainCopy(context.Background(), s.Client(t), bucket, "m/w.bin", dst, 4, 1<<20); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if sum, want := md5.Sum(got), md5.Sum(data); sum != want {
		t.Errorf("plain copy md5 %s, want %s", hex.EncodeToString(sum[:]), hex.EncodeToString(want[:]))
	}
	if err := PlainCopy(context.Background(), s.Client(t), bucket, "m/missing", dst, 4, 1<<20); err == nil {
		t.Error("plain copy of a missing key succeeded")
	}
}

// A part an earlier run claims but that holds garbage (a torn write, a bad
// disk) must fail the download, not be served.
func TestDownloadCatchesCorruptDonePart(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, bucket)
	data := randomBytes(9, 3<<20)
	s.PutObject(t, bucket, "m/w.bin", bytes.NewReader(data), int64(len(data)))
	for _, ignoreChecksums := range []bool{false, true} {
		c := newOrigin(t, s, s.Endpoint, Options{})
		c.ignoreChecksums = ignoreChecksums
		o := listOne(t, c.Client, "m/w.bin")
		f := tempFile(t)
		bad := append([]byte(nil), data[1<<20:2<<20]...)
		bad[12345] ^= 1
		if _, err := f.WriteAt(bad, 1<<20); err != nil {
			t.Fatal(err)
		}
		err := c.Download(context.Background(), o, f, Plan{Done: func(part int) bool { return part == 1 }})
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("ignoreChecksums=%v: Download over a corrupt done part = %v, want ErrCorrupt", ignoreChecksums, err)
		}
	}
}

func TestOpenRangeStreamsThroughResets(t *testing.T) {
	s := testenv.StartS3(t)
	s.CreateBucket(t, "rng")
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	s.PutObject(t, "rng", "m/f", bytes.NewReader(data), int64(len(data)))
	proxy := s3fault.Start(t, s.Endpoint)
	proxy.ResetAfter(100_000, 1)
	c, err := New(t.Context(), Options{Endpoint: proxy.URL(), Region: s.Region, RetryBackoff: time.Millisecond,
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := c.List(t.Context(), spec.S3URL{Bucket: "rng", Prefix: "m/"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.OpenRange(t.Context(), objs[0], 1000, 500_000)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, data[1000:501_000]) {
		t.Fatalf("OpenRange read %d bytes, err %v; content equal: %v", len(got), err, bytes.Equal(got, data[1000:501_000]))
	}
	if _, err := c.OpenRange(t.Context(), objs[0], int64(len(data))-1, 2); err == nil {
		t.Fatal("out-of-bounds range accepted")
	}
}
