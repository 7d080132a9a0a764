package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/bg"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/origin/memorigin"
	"github.com/warmfleet/warmfleet/spec"
)

const testPartSize = 1 << 20

// fixture is an origin holding one model, and a way to build daemons
// against it: in memory (newFixture), or a real S3 server (newS3Fixture, in
// s3_test.go) for the tests that run on both.
type fixture struct {
	mem    *memorigin.Origin // nil on S3
	s3     *testenv.S3       // nil in memory
	bucket string
	files  map[string][]byte
}

// newFixture holds files in an in-memory origin (origin/memorigin, which
// passes the conformance suite the S3 client passes).
func newFixture(t *testing.T, files map[string]int) *fixture {
	t.Helper()
	fx := &fixture{mem: memorigin.New(memorigin.Options{PartSize: testPartSize}), bucket: "models"}
	fx.mem.CreateBucket(fx.bucket)
	return fx.fill(t, files)
}

// fill puts files of random bytes under llama/.
func (fx *fixture) fill(t *testing.T, files map[string]int) *fixture {
	t.Helper()
	fx.files = map[string][]byte{}
	rng := rand.New(rand.NewPCG(1, 2))
	for name, size := range files {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		fx.put(t, "llama/"+name, data)
	}
	return fx
}

// put stores an object; one under llama/ is also a file the model should
// hold.
func (fx *fixture) put(t *testing.T, key string, data []byte) {
	t.Helper()
	if fx.s3 != nil {
		fx.s3.PutObject(t, fx.bucket, key, bytes.NewReader(data), int64(len(data)))
	} else {
		fx.mem.Put(fx.bucket, key, data)
	}
	if name, ok := strings.CutPrefix(key, "llama/"); ok {
		fx.files[name] = data
	}
}

func (fx *fixture) delete(t *testing.T, key string) {
	t.Helper()
	if fx.s3 == nil {
		fx.mem.Delete(fx.bucket, key)
		return
	}
	// Error, not Fatal: origins wrapped by tests delete from their own
	// goroutines.
	if _, err := fx.s3.Client(t).DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(fx.bucket), Key: aws.String(key)}); err != nil {
		t.Error(err)
	}
}

// origin is a client of the fixture's origin counting the object bytes it
// reads with onBytes (nil: none).
func (fx *fixture) origin(t *testing.T, onBytes func(int)) Origin {
	t.Helper()
	if fx.s3 == nil {
		return fx.mem.With(memorigin.Options{PartSize: testPartSize, OnBytes: onBytes})
	}
	c, err := s3origin.New(t.Context(), s3origin.Options{
		Endpoint: fx.s3.Endpoint, Region: fx.s3.Region, PartSize: testPartSize, Concurrency: 4,
		Credentials: credentials.NewStaticCredentialsProvider(fx.s3.AccessKey, fx.s3.SecretKey, ""),
		OnBytes:     onBytes, RetryBackoff: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s3origin.AsOrigin(c)
}

func (fx *fixture) spec() spec.Spec {
	return spec.Spec{Kind: spec.KindModel, Name: "meta/llama", Source: "s3://" + fx.bucket + "/llama/"}
}

func newDaemon(t *testing.T, dir string, org Origin) *Daemon {
	t.Helper()
	return newDaemonResync(t, dir, org, 0)
}

func newDaemonResync(t *testing.T, dir string, org Origin, resync time.Duration) *Daemon {
	t.Helper()
	return newDaemonCfg(t, dir, org, func(c *Config) { c.ResyncInterval = resync })
}

// newDaemonDeps builds a daemon like newDaemon, working with deps.
func newDaemonDeps(t *testing.T, dir string, org Origin, deps Deps) *Daemon {
	t.Helper()
	return openDaemon(t, testConfig(dir), org, deps)
}

func testConfig(dir string) Config {
	return Config{
		NodeName: "n1", DataDir: dir, PartSize: testPartSize, ReconcileInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// openDaemon opens a base for cfg and builds a daemon on it.
func openDaemon(t *testing.T, cfg Config, org Origin, deps Deps) *Daemon {
	t.Helper()
	b, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The test's one origin reads whichever scheme its sources use.
	d, err := New(b, origin.Mux{"s3": org, "hf": org, "magnet": org, "torrent": org}, deps)
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	return d
}

// run starts the daemon's loop; the returned func stops it and closes it.
func run(t *testing.T, d *Daemon) func() {
	t.Helper()
	return bg.Run(t, d.Run, d.Close)
}

func status(t *testing.T, d *Daemon, name string) api.CacheStatus {
	t.Helper()
	st, _, err := d.Cache(name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func checkFiles(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s differs from the source: got %d bytes %q..., want %d bytes", name, len(got), got[:min(len(got), 40)], len(data))
		}
	}
}

func TestCache(t *testing.T) { testCache(t, newFixture) }

func testCache(t *testing.T, newFixture func(*testing.T, map[string]int) *fixture) {
	fx := newFixture(t, map[string]int{"model-00001.safetensors": 3<<20 + 17, "sub/config.json": 300, "empty.txt": 0})
	var s3Bytes atomic.Int64
	dir := t.TempDir()
	d := newDaemonResync(t, dir, fx.origin(t, func(n int) { s3Bytes.Add(int64(n)) }), 100*time.Millisecond)
	run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "ready", func() bool { return status(t, d, "meta/llama").Ready })
	st := status(t, d, "meta/llama")
	if st.State != api.StateReady || st.BytesDone != st.BytesTotal || st.Files != 3 {
		t.Fatalf("status %+v", st)
	}
	if want := filepath.Join(dir, "models", "meta--llama", st.RevisionID); st.Path != want {
		t.Fatalf("path %s, want %s", st.Path, want)
	}
	checkFiles(t, st.Path, fx.files)
	checkFiles(t, filepath.Join(dir, "models", "meta--llama", "current"), fx.files)
	if got := s3Bytes.Load(); got != st.BytesTotal {
		t.Fatalf("read %d bytes from S3 for a %d-byte model", got, st.BytesTotal)
	}
	if got := testutil.ToFloat64(d.metrics.cacheState.WithLabelValues("meta/llama", api.StateReady)); got != 1 {
		t.Fatalf("ready gauge = %v", got)
	}

	// A changed object gets a new revision; the old one is pruned.
	fx.put(t, "llama/sub/config.json", []byte(`{"changed":true}`))
	wait.For(t, "new revision", func() bool {
		s := status(t, d, "meta/llama")
		return s.Ready && s.RevisionID != st.RevisionID
	})
	st2 := status(t, d, "meta/llama")
	checkFiles(t, st2.Path, fx.files)
	wait.For(t, "old revision pruned", func() bool {
		_, err := os.Stat(st.Path)
		return errors.Is(err, os.ErrNotExist)
	})

	// Removing frees the space and forgets the cache.
	if _, err := d.RemoveCache(t.Context(), "meta/llama"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "removal", func() bool {
		_, found, _ := d.Cache("meta/llama")
		return !found
	})
	if _, err := os.Stat(filepath.Join(dir, "models", "meta--llama")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("model dir still there: %v", err)
	}
}

// stopAfter wraps an origin so that a download dies after n parts, as if the
// daemon were killed.
type stopAfter struct {
	Origin
	n      int64
	parts  atomic.Int64
	cancel context.CancelFunc
}

func (s *stopAfter) Download(ctx context.Context, obj origin.Object, dst origin.File, plan origin.Plan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inner := plan.OnPart
	plan.OnPart = func(part int, n int64) {
		inner(part, n)
		if s.parts.Add(1) >= s.n {
			cancel()
			s.cancel()
		}
	}
	return s.Origin.Download(ctx, obj, dst, plan)
}

func TestRestartResumesWithoutRefetching(t *testing.T) {
	testRestartResumesWithoutRefetching(t, newFixture)
}

func testRestartResumesWithoutRefetching(t *testing.T, newFixture func(*testing.T, map[string]int) *fixture) {
	const size = 12 << 20
	fx := newFixture(t, map[string]int{"model.safetensors": size})
	dir := t.TempDir()

	var first atomic.Int64
	killed := make(chan struct{})
	var once atomic.Bool
	org := &stopAfter{Origin: fx.origin(t, func(n int) { first.Add(int64(n)) }), n: 4, cancel: func() {
		if !once.Swap(true) {
			close(killed)
		}
	}}
	d := newDaemon(t, dir, org)
	stop := run(t, d)
	if err := d.AddCache(t.Context(), fx.spec()); err != nil {
		t.Fatal(err)
	}
	<-killed
	stop()

	var second atomic.Int64
	d2 := newDaemon(t, dir, fx.origin(t, func(n int) { second.Add(int64(n)) }))
	if st := status(t, d2, "meta/llama"); st.Ready {
		t.Fatalf("partial download reported ready after restart: %+v", st)
	}
	run(t, d2)
	wait.For(t, "ready after restart", func() bool { return status(t, d2, "meta/llama").Ready })
	checkFiles(t, status(t, d2, "meta/llama").Path, fx.files)
	if got, max := second.Load(), int64(size-4*testPartSize); got > max {
		t.Fatalf("after restart read %d bytes from S3, want at most %d (finished parts fetched again)", got, max)
	}
	t.Logf("first run read %d bytes, second %d of %d", first.Load(), second.Load(), size)
}

func TestFailuresAreReportedNotReady(t *testing.T) {
	fx := newFixture(t, map[string]int{"model.safetensors": 1 << 20})
	d := newDaemon(t, t.TempDir(), fx.origin(t, nil))
	run(t, d)
	missing := spec.Spec{Kind: spec.KindModel, Name: "missing", Source: "s3://no-such-bucket/x/"}
	empty := spec.Spec{Kind: spec.KindModel, Name: "empty", Source: "s3://" + fx.bucket + "/nothing-here/"}
	for _, s := range []spec.Spec{missing, empty} {
		if err := d.AddCache(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"missing", "empty"} {
		wait.For(t, name+" failed", func() bool { return status(t, d, name).State == api.StateFailed })
		st := status(t, d, name)
		if st.Ready || st.Error == "" || st.Path != "" {
			t.Fatalf("%s: %+v", name, st)
		}
		t.Logf("%s: %s", name, st.Error)
	}
	if st := status(t, d, "missing"); !strings.Contains(st.Error, "bucket") {
		t.Fatalf("missing bucket error does not say so: %q", st.Error)
	}
}

func TestAPI(t *testing.T) {
	d := newDaemon(t, t.TempDir(), nil)
	t.Cleanup(func() { d.Close() })
	srv := httptest.NewServer(d.Handler("secret-token-123456"))
	defer srv.Close()
	do := func(method, path, body string, auth bool) (int, string) {
		token := ""
		if auth {
			token = "secret-token-123456"
		}
		return httpDo(t, method, srv.URL+path, body, token)
	}
	tests := []struct {
		name, method, path, body string
		auth                     bool
		code                     int
		contains                 string
	}{
		{"no token", "GET", "/v1/caches", "", false, 401, "bearer token"},
		{"list empty", "GET", "/v1/caches", "", true, 200, "[]"},
		{"bad json", "POST", "/v1/caches", "{", true, 400, "bad JSON"},
		{"unknown field", "POST", "/v1/caches", `{"name":"m","source":"s3://bkt/p/","evil":1}`, true, 400, "unknown field"},
		{"two values", "POST", "/v1/caches", `{"name":"m","source":"s3://bkt/p/"}{}`, true, 400, "more than one"},
		{"oversize", "POST", "/v1/caches", `{"name":"` + strings.Repeat("a", maxBodyBytes) + `"}`, true, 400, "larger than"},
		{"bad source", "POST", "/v1/caches", `{"name":"m","source":"ftp://x"}`, true, 400, "s3://"},
		{"hostile name", "POST", "/v1/caches", `{"name":"../etc","source":"s3://bkt/p/"}`, true, 400, "model name"},
		{"add", "POST", "/v1/caches", `{"name":"org/m","source":"s3://bkt/p/"}`, true, 202, `"state": "pending"`},
		{"get org name", "GET", "/v1/caches/org/m", "", true, 200, `"ready": false`},
		{"add pinned", "POST", "/v1/caches", `{"name":"p","source":"s3://bkt/p/","pin":true,"priority":7}`, true, 202, `"priority": 7`},
		{"priority out of range", "POST", "/v1/caches", `{"name":"p","source":"s3://bkt/p/","priority":1001}`, true, 400, "priority 1001"},
		{"get missing", "GET", "/v1/caches/nope", "", true, 404, "not in the cache"},
		{"rm missing", "DELETE", "/v1/caches/nope", "", true, 404, "not a desired cache"},
		{"verify not fetched", "POST", "/v1/verify/org/m", "", true, 404, "not in the cache"},
		{"verify no token", "POST", "/v1/verify/org/m", "", false, 401, "bearer token"},
		{"rm", "DELETE", "/v1/caches/org/m", "", true, 204, ""},
		{"node", "GET", "/v1/node", "", true, 200, `"data_dir"`},
		{"metrics", "GET", "/metrics", "", true, 200, "warmfleet_s3_bytes_total"},
		{"healthz", "GET", "/healthz", "", true, 200, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(tt.method, tt.path, tt.body, tt.auth)
			if code != tt.code || !strings.Contains(body, tt.contains) {
				t.Fatalf("%s %s = %d %q, want %d containing %q", tt.method, tt.path, code, body, tt.code, tt.contains)
			}
		})
	}
}

// httpDo sends one request (with a bearer token, if not empty) and
// returns the answer's code and body.
func httpDo(t *testing.T, method, url, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStateMigratesPieces opens a state file from before the pieces bucket
// was a migration (schema 3, which p2p.NewBoltCompletion filled in only when
// the swarm started) and checks that opening brings it to the current schema
// with the buckets of the later migrations in place (pieces, shards), and
// the older buckets' records kept.
func TestStateMigratesPieces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		for _, m := range migrations[:3] {
			if err := m(tx); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketCaches).Put([]byte("m"), []byte(`{"state":"ready"}`)); err != nil {
			return err
		}
		return meta.Put(keySchema, []byte{0, 0, 0, 0, 0, 0, 0, 3})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	st, err := openState(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	if err := st.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{[]byte(bucketPieces), bucketShards} {
			if tx.Bucket(b) == nil {
				return fmt.Errorf("no %s bucket after migration", b)
			}
		}
		if v := tx.Bucket(bucketMeta).Get(keySchema); !bytes.Equal(v, []byte{0, 0, 0, 0, 0, 0, 0, 5}) || SchemaVersion() != 5 {
			return fmt.Errorf("schema = %x, SchemaVersion() = %d, want 5", v, SchemaVersion())
		}
		if tx.Bucket(bucketCaches).Get([]byte("m")) == nil {
			return errors.New("cache record lost in migration")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestStateSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := openState(path)
	if err != nil {
		t.Fatal(err)
	}
	bm := bitmap(nil).with(0).with(9)
	if err := st.putParts("m", "r1", "f", bm); err != nil {
		t.Fatal(err)
	}
	if err := st.putParts("m", "r2", "f", bm); err != nil {
		t.Fatal(err)
	}
	if err := st.deleteParts("m", "r2"); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.parts("m", "r1", "f"); got.count() != 0 {
		t.Fatal("other revision's parts survived")
	}
	if got, _ := st.parts("m", "r2", "f"); !got.has(0) || !got.has(9) || got.has(1) || got.count() != 2 {
		t.Fatalf("kept parts = %v", got)
	}
	st.close()
	// Reopening is idempotent; a newer schema is refused.
	st, err = openState(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, []byte{0, 0, 0, 0, 0, 0, 0, 99})
	}); err != nil {
		t.Fatal(err)
	}
	st.close()
	if _, err := openState(path); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open newer schema = %v", err)
	}
}
