package s3embed

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/spec"
)

func start(t *testing.T) *Server {
	t.Helper()
	s, err := Start(context.Background(), "127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func seed(t *testing.T, s *Server, files map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateBucket(ctx, "demo"); err != nil {
		t.Fatal(err)
	}
	for k, v := range files {
		if err := s.PutObject(ctx, "demo", k, bytes.NewReader(v), int64(len(v))); err != nil {
			t.Fatal(err)
		}
	}
}

func randomBytes(seed byte, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// The demo's path: s3origin configured only through the environment lists
// and downloads (ranged GETs, 1 MiB parts) from the embedded server.
func TestS3OriginListsAndDownloads(t *testing.T) {
	s := start(t)
	weights := randomBytes(1, 3<<20+77)
	seed(t, s, map[string][]byte{
		"m/config.json":          []byte(`{"a":1}`),
		"m/model.safetensors":    weights,
		"m/nested/tokenizer.bin": []byte("tok"),
	})
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_PROFILE", "")
	ctx := context.Background()
	c, err := s3origin.New(ctx, s3origin.Options{PartSize: s3origin.MinPartSize, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := c.List(ctx, spec.S3URL{Bucket: "demo", Prefix: "m/"})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, o := range objs {
		paths = append(paths, o.Path)
	}
	if got := strings.Join(paths, ","); got != "config.json,model.safetensors,nested/tokenizer.bin" {
		t.Fatalf("listed %s", got)
	}
	o := objs[1]
	f, err := os.Create(filepath.Join(t.TempDir(), "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var v s3origin.Verification
	var parts sync.Map
	err = c.Download(ctx, o, f, s3origin.Plan{
		OnPart:   func(p int, _ int64) { parts.Store(p, true) },
		OnVerify: func(got s3origin.Verification) { v = got },
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(f.Name())
	if !bytes.Equal(got, weights) {
		t.Fatalf("downloaded %d bytes differ from the object", len(got))
	}
	n := 0
	parts.Range(func(any, any) bool { n++; return true })
	if n != 4 {
		t.Errorf("%d parts downloaded, want 4 ranged GETs of 1 MiB", n)
	}
	// gofakes3 stores no checksum, so the MD5 ETag is what is checked.
	if !v.Verified || v.Method != s3origin.MethodMD5 {
		t.Errorf("verification %+v, want md5", v)
	}
}

// gofakes3 ignores If-Match; s3origin must still refuse to mix versions.
func TestSourceChangeDetectedDespiteIgnoredIfMatch(t *testing.T) {
	s := start(t)
	seed(t, s, map[string][]byte{"m/w": randomBytes(2, 4<<20)})
	ctx := context.Background()
	c, err := s3origin.New(ctx, s3origin.Options{Endpoint: s.Endpoint(), Credentials: s.Credentials(),
		PartSize: s3origin.MinPartSize, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := c.List(ctx, spec.S3URL{Bucket: "demo", Prefix: "m/"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = c.Download(ctx, objs[0], f, s3origin.Plan{OnPart: func(p int, _ int64) {
		if p == 0 {
			v2 := randomBytes(3, 4<<20)
			if err := s.PutObject(ctx, "demo", "m/w", bytes.NewReader(v2), int64(len(v2))); err != nil {
				t.Error(err)
			}
		}
	}})
	if !errors.Is(err, s3origin.ErrSourceChanged) || !strings.Contains(err.Error(), "ETag is now") {
		t.Fatalf("Download = %v, want ErrSourceChanged from the response's ETag", err)
	}
}

func TestStartRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "example.com:0", "nonsense"} {
		if s, err := Start(context.Background(), addr, Options{}); err == nil {
			_ = s.Close()
			t.Errorf("Start(%q) succeeded", addr)
		}
	}
}

func TestStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Start(ctx, "127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.s3.Addr
	cancel()
	// Close is idempotent and waits for the server; after it, nobody
	// listens.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Errorf("still listening on %s after the context ended", addr)
	}
}

// TestSeedBeforeServing: a client that connects while Seed runs gets its
// answer only once Seed is done, so it never lists half of what Seed puts;
// a Seed that fails fails Start and frees the address.
func TestSeedBeforeServing(t *testing.T) {
	addr := testenv.FreeAddr(t)
	listed := make(chan string, 1)
	put := func(ctx context.Context, s *Server, key string) error {
		return s.PutObject(ctx, "demo", key, strings.NewReader(key), int64(len(key)))
	}
	s, err := Start(t.Context(), addr, Options{Seed: func(ctx context.Context, s *Server) error {
		if err := s.CreateBucket(ctx, "demo"); err != nil {
			return err
		}
		if err := put(ctx, s, "m/a"); err != nil {
			return err
		}
		go func() {
			resp, err := http.Get("http://" + addr + "/demo?list-type=2")
			if err != nil {
				listed <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			listed <- string(b)
		}()
		return put(ctx, s, "m/b")
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Endpoint() != "http://"+addr {
		t.Errorf("endpoint %s, want http://%s", s.Endpoint(), addr)
	}
	got := <-listed
	if !strings.Contains(got, "<Key>m/a</Key>") || !strings.Contains(got, "<Key>m/b</Key>") {
		t.Errorf("a listing sent while Seed ran does not show everything Seed put:\n%s", got)
	}

	addr = testenv.FreeAddr(t)
	_, err = Start(t.Context(), addr, Options{Seed: func(context.Context, *Server) error { return errors.New("no model") }})
	if err == nil || !strings.Contains(err.Error(), "no model") {
		t.Fatalf("Start with a failing Seed: %v, want its error", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address of a Start that failed is still taken: %v", err)
	}
	ln.Close()
}
