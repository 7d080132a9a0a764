package hforigin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warmfleet/warmfleet/internal/s3origin"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
	"github.com/warmfleet/warmfleet/internal/testutil/pipenet"
	"github.com/warmfleet/warmfleet/spec"
)

// sleeps records the delays a client asked for instead of waiting them.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d = append(s.d, d)
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

func newClient(t *testing.T, hub *hubserver.Server, opts Options) (*Client, *sleeps) {
	t.Helper()
	opts.Endpoint = hub.Endpoint()
	if opts.PartSize == 0 {
		opts.PartSize = s3origin.MinPartSize
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := &sleeps{}
	c.sleep = s.sleep
	return c, s
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func mustParse(t *testing.T, s string) spec.HFURL {
	t.Helper()
	u, err := spec.ParseHFURL(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readAll(t *testing.T, f *os.File) []byte {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func find(t *testing.T, objs []s3origin.Object, p string) s3origin.Object {
	t.Helper()
	for _, o := range objs {
		if o.Path == p {
			return o
		}
	}
	t.Fatalf("%s not listed in %+v", p, objs)
	return s3origin.Object{}
}

func TestListPinsTheRevisionToACommit(t *testing.T) {
	hub := hubserver.New(t)
	hub.PageSize = 2 // several pages
	weights := randBytes(1, 3000)
	c1 := hub.Push("org/m", "main", map[string]hubserver.File{
		"config.json":             {Data: []byte(`{"a":1}`)},
		"model.safetensors":       {Data: weights, LFS: true},
		"onnx/model.onnx":         {Data: []byte("onnx"), LFS: true},
		"onnx/sub/tokenizer.json": {Data: []byte("{}")},
	})
	hub.Tag("org/m", "v1", c1)
	c2 := hub.Push("org/m", "main", map[string]hubserver.File{"config.json": {Data: []byte(`{"a":2}`)}})
	c, _ := newClient(t, hub, Options{})

	objs, err := c.List(t.Context(), "hf://org/m@v1")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, o := range objs {
		paths = append(paths, o.Path)
		if o.VersionID != c1 || o.Bucket != "org/m" {
			t.Errorf("%s: VersionID %s Bucket %s, want commit %s of org/m", o.Path, o.VersionID, o.Bucket, c1)
		}
	}
	if got := strings.Join(paths, ","); got != "config.json,model.safetensors,onnx/model.onnx,onnx/sub/tokenizer.json" {
		t.Errorf("paths %s", got)
	}
	if o := find(t, objs, "model.safetensors"); o.ETag != hubserver.SHA256(weights) || o.Size != 3000 {
		t.Errorf("LFS file listed as %+v, want its sha256 and size", o)
	}
	if o := find(t, objs, "config.json"); o.ETag != hubserver.GitBlobID([]byte(`{"a":1}`)) {
		t.Errorf("small file listed as %+v, want its git blob id", o)
	}

	objs, err = c.List(t.Context(), "hf://org/m/onnx")
	if err == nil || !errors.Is(err, s3origin.ErrNotFound) {
		t.Errorf("subdir missing at main's commit: got %v, %v", objs, err)
	}
	objs, err = c.List(t.Context(), "hf://org/m@"+c1+"/onnx")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].Path != "model.onnx" || objs[0].Key != "onnx/model.onnx" || objs[1].Path != "sub/tokenizer.json" {
		t.Errorf("subdir listing %+v", objs)
	}
	got, err := c.ResolveRevision(t.Context(), mustParse(t, "hf://org/m"))
	if err != nil || got != c2 {
		t.Errorf("main resolves to %s, %v; want %s", got, err, c2)
	}
	if _, err := c.List(t.Context(), "hf://org/m@nope"); !errors.Is(err, s3origin.ErrNotFound) || !strings.Contains(err.Error(), "RevisionNotFound") {
		t.Errorf("unknown revision: %v", err)
	}
}

// TestListErrorsNameTheListing: every List error begins "list SOURCE",
// as origin.Origin promises: the daemon shows it without naming the listing
// again. A revision the Hub does not have fails while it is resolved,
// before the listing proper.
func TestListErrorsNameTheListing(t *testing.T) {
	hub := hubserver.New(t)
	hub.Push("org/m", "main", map[string]hubserver.File{"config.json": {Data: []byte("{}")}})
	c, _ := newClient(t, hub, Options{})
	for _, source := range []string{"hf://org/m@nope", "hf://org/missing", "hf://org/m/absent", "hf://not a repo"} {
		_, err := c.List(t.Context(), source)
		if err == nil || !strings.HasPrefix(err.Error(), "list ") {
			t.Errorf("List(%s) = %v, want an error that begins \"list SOURCE\"", source, err)
		}
	}
}

func TestDownloadKeepsReadingThePinnedCommitWhenTheBranchMoves(t *testing.T) {
	hub := hubserver.New(t)
	old := randBytes(2, 3<<20+123)
	hub.Push("org/m", "main", map[string]hubserver.File{"w.safetensors": {Data: old, LFS: true}})
	c, _ := newClient(t, hub, Options{Concurrency: 1})
	objs, err := c.List(t.Context(), "hf://org/m")
	if err != nil {
		t.Fatal(err)
	}
	dst := tempFile(t)
	var v s3origin.Verification
	var moved string
	plan := s3origin.Plan{
		OnPart: func(part int, _ int64) {
			if part == 0 { // the branch moves after the first part arrived
				moved = hub.Push("org/m", "main", map[string]hubserver.File{"w.safetensors": {Data: randBytes(3, len(old)), LFS: true}})
				hub.ExpireCDN(1) // and the next range has to ask the Hub again
			}
		},
		OnVerify: func(got s3origin.Verification) { v = got },
	}
	if err := c.Download(t.Context(), objs[0], dst, plan); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, dst), old) {
		t.Fatal("the download mixed two commits")
	}
	if !v.Verified || v.Method != s3origin.MethodSHA256 {
		t.Errorf("verification %+v, want sha256", v)
	}
	again, err := c.List(t.Context(), "hf://org/m")
	if err != nil || again[0].VersionID != moved || again[0].ETag == objs[0].ETag {
		t.Errorf("a new List after the move: %+v, %v; want commit %s", again, err, moved)
	}
}

func TestDownloadRefusesBytesThatDoNotMatchTheirDigest(t *testing.T) {
	hub := hubserver.New(t)
	good := randBytes(4, 2<<20)
	small := []byte(`{"architectures":["X"]}`)
	hub.Push("org/m", "main", map[string]hubserver.File{"w.bin": {Data: good, LFS: true}, "config.json": {Data: small}})
	c, _ := newClient(t, hub, Options{})
	objs, err := c.List(t.Context(), "hf://org/m")
	if err != nil {
		t.Fatal(err)
	}
	cfg := find(t, objs, "config.json")
	dst := tempFile(t)
	var v s3origin.Verification
	if err := c.Download(t.Context(), cfg, dst, s3origin.Plan{OnVerify: func(got s3origin.Verification) { v = got }}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, dst), small) || !v.Verified || v.Method != MethodGitBlob {
		t.Errorf("small file: %q, %+v", readAll(t, dst), v)
	}

	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 1
	hub.CorruptCDN(hubserver.SHA256(good), bad)
	w := find(t, objs, "w.bin")
	err = c.Download(t.Context(), w, tempFile(t), s3origin.Plan{OnVerify: func(s3origin.Verification) { t.Error("a corrupt copy reached OnVerify") }})
	if !errors.Is(err, s3origin.ErrCorrupt) {
		t.Fatalf("corrupt CDN bytes: %v, want ErrCorrupt", err)
	}
	if _, err := c.Verify(t.Context(), cfg, bytes.NewReader(bytes.ReplaceAll(small, []byte("X"), []byte("Y")))); !errors.Is(err, s3origin.ErrCorrupt) {
		t.Errorf("Verify of a changed small file: %v", err)
	}
}

func TestTokenGoesToTheHubOnlyNeverToTheCDN(t *testing.T) {
	hub := hubserver.New(t)
	data := randBytes(5, 2<<20+7)
	hub.Push("org/gated", "main", map[string]hubserver.File{"w.bin": {Data: data, LFS: true}, "config.json": {Data: []byte("{}")}})
	hub.Gate("org/gated", "hf_secret")

	anon, _ := newClient(t, hub, Options{})
	_, err := anon.List(t.Context(), "hf://org/gated")
	if !errors.Is(err, s3origin.ErrAccessDenied) || !strings.Contains(err.Error(), "org/gated") || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Errorf("no token: %v; want access denied naming the repo and HF_TOKEN", err)
	}
	wrong, _ := newClient(t, hub, Options{Token: "hf_other"})
	if _, err = wrong.List(t.Context(), "hf://org/gated"); !errors.Is(err, s3origin.ErrAccessDenied) || !strings.Contains(err.Error(), "403") {
		t.Errorf("wrong token: %v", err)
	}

	c, _ := newClient(t, hub, Options{Token: "hf_secret"})
	objs, err := c.List(t.Context(), "hf://org/gated")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		dst := tempFile(t)
		if err := c.Download(t.Context(), o, dst, s3origin.Plan{}); err != nil {
			t.Fatal(err)
		}
	}
	st := hub.Stats()
	if st.CDNGets == 0 || st.CDNAuthorized != 0 {
		t.Errorf("CDN saw %d requests, %d with Authorization; want some, none", st.CDNGets, st.CDNAuthorized)
	}
	r, err := c.OpenRange(t.Context(), find(t, objs, "w.bin"), 100, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, data[100:100+1<<20]) {
		t.Errorf("OpenRange: %d bytes, %v", len(got), err)
	}
	if st := hub.Stats(); st.CDNAuthorized != 0 {
		t.Errorf("OpenRange sent the token to the CDN")
	}
}

func TestIncludeExclude(t *testing.T) {
	hub := hubserver.New(t)
	hub.Push("org/m", "main", map[string]hubserver.File{
		"a.safetensors": {Data: []byte("a"), LFS: true}, "sub/b.safetensors": {Data: []byte("b"), LFS: true},
		"config.json": {Data: []byte("{}")}, "sub/extra.json": {Data: []byte("{}")},
		"pytorch_model.bin": {Data: []byte("p"), LFS: true}, "README.md": {Data: []byte("r")},
	})
	for _, tc := range []struct {
		include, exclude []string
		want             string
	}{
		{nil, nil, "README.md,a.safetensors,config.json,pytorch_model.bin,sub/b.safetensors,sub/extra.json"},
		{[]string{"*.safetensors", "*.json"}, nil, "a.safetensors,config.json,sub/b.safetensors,sub/extra.json"},
		{[]string{"*.safetensors", "*.json"}, []string{"sub/*"}, "a.safetensors,config.json"},
		{nil, []string{"*.bin", "*.md"}, "a.safetensors,config.json,sub/b.safetensors,sub/extra.json"},
	} {
		c, _ := newClient(t, hub, Options{Include: tc.include, Exclude: tc.exclude})
		objs, err := c.List(t.Context(), "hf://org/m")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, o := range objs {
			got = append(got, o.Path)
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("include %q exclude %q: %s, want %s", tc.include, tc.exclude, strings.Join(got, ","), tc.want)
		}
	}
	c, _ := newClient(t, hub, Options{Include: []string{"*.gguf"}})
	if _, err := c.List(t.Context(), "hf://org/m"); !errors.Is(err, s3origin.ErrEmpty) {
		t.Errorf("nothing kept: %v, want ErrEmpty", err)
	}
	if _, err := New(Options{Include: []string{"[x"}}); err == nil {
		t.Error("a bad pattern was accepted")
	}
}

func TestHostileListingIsRefused(t *testing.T) {
	for _, p := range []string{"../evil", "a/../../etc/passwd", "/etc/passwd", "a//b", "a\\b", "x/\x00y"} {
		hub := hubserver.New(t)
		hub.Push("org/m", "main", map[string]hubserver.File{"ok.json": {Data: []byte("{}")}, p: {Data: []byte("x"), LFS: true}})
		c, _ := newClient(t, hub, Options{})
		objs, err := c.List(t.Context(), "hf://org/m")
		if !errors.Is(err, s3origin.ErrUnsafeKey) {
			t.Errorf("listing holding %q: %+v, %v; want ErrUnsafeKey", p, objs, err)
		}
	}
	src := mustParse(t, "hf://org/m/sub")
	blob := strings.Repeat("a", 40)
	for name, entries := range map[string][]treeEntry{
		"outside the subdir": {{Type: "file", Path: "other/x", OID: blob}},
		"prefix trick":       {{Type: "file", Path: "subx/y", OID: blob}},
		"file and dir":       {{Type: "file", Path: "sub/a", OID: blob}, {Type: "file", Path: "sub/a/b", OID: blob}},
		"listed twice":       {{Type: "file", Path: "sub/a", OID: blob}, {Type: "file", Path: "sub/a", OID: blob}},
		"unknown type":       {{Type: "symlink", Path: "sub/a", OID: blob}},
		"bad oid":            {{Type: "file", Path: "sub/a", OID: "zz"}},
		"lfs size mismatch": {{Type: "file", Path: "sub/a", OID: blob, Size: 5, LFS: &struct {
			OID  string `json:"oid"`
			Size int64  `json:"size"`
		}{OID: strings.Repeat("b", 64), Size: 6}}},
		"negative size": {{Type: "file", Path: "sub/a", OID: blob, Size: -1}},
		"huge size":     {{Type: "file", Path: "sub/a", OID: blob, Size: s3origin.MaxObjectSize + 1}},
	} {
		if objs, err := objectsFromTree(src, strings.Repeat("c", 40), entries, nil, nil); err == nil {
			t.Errorf("%s: accepted %+v", name, objs)
		}
	}
}

func TestThrottlingIsRetriedHonouringRetryAfter(t *testing.T) {
	hub := hubserver.New(t)
	data := randBytes(6, 1<<20+5)
	hub.Push("org/m", "main", map[string]hubserver.File{"w.bin": {Data: data, LFS: true}})
	c, slept := newClient(t, hub, Options{})
	hub.Throttle(2, "7")
	objs, err := c.List(t.Context(), "hf://org/m")
	if err != nil {
		t.Fatal(err)
	}
	if d := slept.all(); len(d) != 2 || d[0] < 7*time.Second || d[1] < 7*time.Second {
		t.Errorf("delays %v; want two of at least the 7s Retry-After", d)
	}
	hub.Throttle(1, "") // the resolve of the download
	hub.ExpireCDN(1)    // and the CDN address expires once
	dst := tempFile(t)
	if err := c.Download(t.Context(), objs[0], dst, s3origin.Plan{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, dst), data) {
		t.Error("wrong bytes after retries")
	}
	if st := hub.Stats(); st.Resolves != 3 { // 429, then the address, then again after it expired
		t.Errorf("%d resolves, want 3", st.Resolves)
	}

	hub.Throttle(100, "3600")
	c2, slept2 := newClient(t, hub, Options{MaxAttempts: 3, MaxRetryAfter: time.Minute})
	if _, err := c2.List(t.Context(), "hf://org/m"); err == nil || !strings.Contains(err.Error(), "429") {
		t.Errorf("throttled for good: %v", err)
	}
	for _, d := range slept2.all() {
		if d > time.Minute {
			t.Errorf("waited %v, more than MaxRetryAfter", d)
		}
	}
}

func TestRetryAfterAndDelay(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"": 0, "5": 5 * time.Second, "-1": 0, "x": 0, "99999999": 24 * time.Hour,
		"Thu, 01 Jan 2026 00:00:30 GMT": 30 * time.Second, "Wed, 31 Dec 2025 00:00:00 GMT": 0,
	} {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
	base := 100 * time.Millisecond
	if d := retryDelay(errors.New("x"), 1, base, time.Minute, 0); d != 50*time.Millisecond {
		t.Errorf("first delay %v", d)
	}
	if d := retryDelay(errors.New("x"), 20, base, time.Minute, 0.999); d > 64*base {
		t.Errorf("delay %v above the cap", d)
	}
	if d := retryDelay(&statusError{status: 429, retryAfter: time.Hour}, 1, base, time.Minute, 0); d != time.Minute {
		t.Errorf("Retry-After capped: %v", d)
	}
}

func TestFromEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HF_ENDPOINT", "http://mirror.local:8080/")
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_HOME", dir)
	t.Setenv("HF_TOKEN_PATH", "")
	o, err := Options{}.FromEnv()
	if err != nil || o.Endpoint != "http://mirror.local:8080/" || o.Token != "" {
		t.Errorf("no token anywhere: %+v, %v", o, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("hf_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, _ := (Options{}).FromEnv(); o.Token != "hf_file" {
		t.Errorf("token from $HF_HOME/token: %q", o.Token)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("hf_a hf_b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HF_TOKEN_PATH", other)
	if _, err := (Options{}).FromEnv(); err == nil {
		t.Error("a token file with two tokens was accepted")
	}
	t.Setenv("HF_TOKEN", "hf_env")
	if o, _ := (Options{Endpoint: "https://x"}).FromEnv(); o.Token != "hf_env" || o.Endpoint != "https://x" {
		t.Errorf("HF_TOKEN and an explicit endpoint: %+v", o)
	}
	c, err := New(Options{Endpoint: "http://mirror.local:8080/"})
	if err != nil || c.Endpoint() != "http://mirror.local:8080" {
		t.Errorf("endpoint %v, %v", c, err)
	}
	if _, err := New(Options{Endpoint: "ftp://x"}); err == nil {
		t.Error("ftp endpoint accepted")
	}
}

func TestObjectsNotFromListAreRefused(t *testing.T) {
	c, _ := newClient(t, hubserver.New(t), Options{})
	ok := s3origin.Object{Bucket: "org/m", Key: "a", Path: "a", Size: 1, ETag: strings.Repeat("a", 40), VersionID: strings.Repeat("b", 40)}
	for name, obj := range map[string]s3origin.Object{
		"no commit": func() s3origin.Object { o := ok; o.VersionID = "main"; return o }(),
		"no digest": func() s3origin.Object { o := ok; o.ETag = "abc"; return o }(),
		"bad key":   func() s3origin.Object { o := ok; o.Key = "../a"; return o }(),
	} {
		if err := c.Download(t.Context(), obj, tempFile(t), s3origin.Plan{}); err == nil {
			t.Errorf("%s: Download accepted %+v", name, obj)
		}
		if _, err := c.OpenRange(t.Context(), obj, 0, 1); err == nil {
			t.Errorf("%s: OpenRange accepted it", name)
		}
		if _, err := c.NewRangeCheck(t.Context(), obj); err == nil {
			t.Errorf("%s: NewRangeCheck accepted it", name)
		}
	}
}

func TestDownloadResumesAndChecksPartsFromAnEarlierRun(t *testing.T) {
	hub := hubserver.New(t)
	data := randBytes(7, 3<<20+9)
	hub.Push("org/m", "main", map[string]hubserver.File{"w.bin": {Data: data, LFS: true}})
	c, _ := newClient(t, hub, Options{})
	objs, err := c.List(t.Context(), "hf://org/m")
	if err != nil {
		t.Fatal(err)
	}
	for _, earlier := range [][]byte{data[1<<20 : 2<<20], make([]byte, 1<<20)} { // part 1 good, then part 1 zeros
		dst := tempFile(t)
		if _, err := dst.WriteAt(earlier, 1<<20); err != nil {
			t.Fatal(err)
		}
		var fetched []int
		var mu sync.Mutex
		plan := s3origin.Plan{
			Done:   func(part int) bool { return part == 1 },
			OnPart: func(part int, _ int64) { mu.Lock(); fetched = append(fetched, part); mu.Unlock() },
		}
		err := c.Download(t.Context(), objs[0], dst, plan)
		good := bytes.Equal(earlier, data[1<<20:2<<20])
		switch {
		case good && (err != nil || !bytes.Equal(readAll(t, dst), data)):
			t.Errorf("resume over a good part: %v", err)
		case !good && !errors.Is(err, s3origin.ErrCorrupt):
			t.Errorf("resume over a bad part: %v, want ErrCorrupt", err)
		}
		if len(fetched) != 3 || slices.Contains(fetched, 1) {
			t.Errorf("fetched parts %v, want 0, 2, 3", fetched)
		}
	}
}

// A body that keeps delivering, however slowly, is no stall: the stall
// timer restarts at every read, not every copy buffer (1 MiB, which this
// body takes 64 StallTimeouts to fill). Run in a synctest bubble against
// a real http.Server over pipenet, so the minutes pass at once.
func TestSlowSteadyBodyIsNoStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = time.Minute
		data := randBytes(9, 1<<20)
		sum := sha256.Sum256(data)
		obj := s3origin.Object{Bucket: "org/m", Key: "w.bin", Path: "w.bin", Size: int64(len(data)),
			ETag: hex.EncodeToString(sum[:]), VersionID: strings.Repeat("a", 40)}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodHead {
				return
			}
			var first, last int
			if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &first, &last); err != nil || first > last || last >= len(data) {
				http.Error(w, "bad range", http.StatusRequestedRangeNotSatisfiable)
				return
			}
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, len(data)))
			w.Header().Set("Content-Length", strconv.Itoa(last-first+1))
			w.WriteHeader(http.StatusPartialContent)
			for b := data[first : last+1]; len(b) > 0; b = b[min(4<<10, len(b)):] {
				select {
				case <-time.After(stall / 4):
				case <-r.Context().Done():
					return
				}
				_, _ = w.Write(b[:min(4<<10, len(b))])
				w.(http.Flusher).Flush()
			}
		})}
		l := pipenet.Listen()
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		tr := &http.Transport{DialContext: l.Dial}
		defer tr.CloseIdleConnections()
		c, err := New(Options{Endpoint: "http://hub.test", Transport: tr, StallTimeout: stall, PartSize: s3origin.MinPartSize})
		if err != nil {
			t.Fatal(err)
		}
		s := &sleeps{}
		c.sleep = s.sleep
		if err := c.Download(t.Context(), obj, tempFile(t), s3origin.Plan{}); err != nil {
			t.Fatal(err)
		}
		if d := s.all(); len(d) != 0 {
			t.Errorf("%d retries: a body that keeps delivering was taken for a stall", len(d))
		}
	})
}

// ErrUnreachable means the Hub could not be reached (s3origin's meaning),
// not that an open connection broke.
func TestUnreachableMeansNoConnection(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	c, _ := New(Options{Endpoint: gone.URL, MaxAttempts: 1})
	if _, err := c.List(t.Context(), "hf://org/m"); !errors.Is(err, s3origin.ErrUnreachable) {
		t.Errorf("List from a closed port: %v, want ErrUnreachable", err)
	}
	broken := c.explain(fmt.Errorf("giving up: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), "org/m", "get hf://org/m")
	if errors.Is(broken, s3origin.ErrUnreachable) {
		t.Errorf("a connection reset mid-body explained as %v", broken)
	}
}

// A tree page is refused at the first entry past the listing's limit,
// before the rest is decoded: a page of MaxAPIBody bytes of tiny entries
// would otherwise cost dozens of bytes of Go memory per byte read.
func TestTreePageStopsAtTheLimit(t *testing.T) {
	body := []byte("[" + strings.Repeat(`{},`, 200_000) + `{}]`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := decodeTreePage(body, 5, 10)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, s3origin.ErrServer) || !strings.Contains(err.Error(), "more than 10 entries") {
		t.Errorf("decodeTreePage past the limit: %v", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > uint64(len(body)) {
		t.Errorf("refusing the page at entry 6 allocated %d bytes, more than the %d-byte page", n, len(body))
	}
	if got, err := decodeTreePage([]byte(`[{"type":"file"},{"type":"directory"}]`), 8, 10); err != nil || len(got) != 2 {
		t.Errorf("a page at the limit: %v, %v", got, err)
	}
}

// A swarm origin reads a file piece by piece through OpenRange: the file
// is resolved once for all its pieces, not once per piece (the Hub rate
// limits its resolver), and asked again only when the CDN refuses the
// address it gave.
func TestOpenRangeResolvesAFileOnce(t *testing.T) {
	hub := hubserver.New(t)
	data := randBytes(9, 4<<20)
	hub.Push("org/m", "main", map[string]hubserver.File{"w.bin": {Data: data, LFS: true}})
	c, _ := newClient(t, hub, Options{})
	objs, err := c.List(t.Context(), "hf://org/m")
	if err != nil {
		t.Fatal(err)
	}
	obj := find(t, objs, "w.bin")
	read := func(off, n int64) {
		t.Helper()
		r, err := c.OpenRange(t.Context(), obj, off, n)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, data[off:off+n]) {
			t.Fatalf("OpenRange(%d, %d): %d bytes, %v", off, n, len(got), err)
		}
	}
	before := hub.Stats().Resolves
	const piece = 256 << 10
	for off := int64(0); off < int64(len(data)); off += piece {
		read(off, piece)
	}
	if n := hub.Stats().Resolves - before; n != 1 {
		t.Errorf("%d pieces resolved the file %d times, want once", len(data)/piece, n)
	}
	hub.ExpireCDN(1)
	read(0, piece)
	if n := hub.Stats().Resolves - before; n != 2 {
		t.Errorf("after the CDN refused the address: %d resolves in all, want 2", n)
	}
}
