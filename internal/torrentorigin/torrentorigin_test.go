package torrentorigin

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anacrolix/torrent/bencode"
	"github.com/anacrolix/torrent/metainfo"

	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
	"github.com/warmfleet/warmfleet/origin"
)

// newOrigin is an origin on loopback counting the bytes it hands out.
func newOrigin(t *testing.T, opts Options) (*Origin, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	opts.Dir = cmpStr(opts.Dir, t.TempDir())
	opts.Listen = cmpStr(opts.Listen, "127.0.0.1:0")
	opts.OnBytes = func(k int) { n.Add(int64(k)) }
	o, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := o.Close(); err != nil {
			t.Error(err)
		}
	})
	return o, &n
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func TestConformance(t *testing.T) {
	origintest.Run(t, func(t *testing.T) origintest.Fixture {
		seeder := torrentseed.Start(t)
		o, n := newOrigin(t, Options{PartSize: 64 << 10, Concurrency: 3})
		var mu sync.Mutex
		files := map[string][]byte{}
		return origintest.Fixture{
			Origin: o, Bucket: "seed", Missing: "none", PartSize: 64 << 10, Immutable: true,
			Put: func(t *testing.T, key string, data []byte) {
				mu.Lock()
				defer mu.Unlock()
				files[key] = data
			},
			Delete: func(t *testing.T, key string) { t.Fatal("an immutable source deletes nothing") },
			Bytes:  n.Load,
			Source: func(prefix string) string {
				mu.Lock()
				defer mu.Unlock()
				var fs []torrentseed.File
				for _, k := range slices.Sorted(func(yield func(string) bool) {
					for k := range files {
						if !yield(k) {
							return
						}
					}
				}) {
					if rel, ok := strings.CutPrefix(k, prefix); ok && rel != "" && !strings.HasSuffix(k, "/") {
						fs = append(fs, torrentseed.File{Path: rel, Data: files[k]})
					}
				}
				_, magnet := seeder.Add(t, strings.TrimSuffix(prefix, "/"), fs, 32<<10)
				return magnet
			},
		}
	})
}

// model is a torrent of three files whose boundaries fall inside pieces.
func model() []torrentseed.File {
	return []torrentseed.File{
		{Path: "config.json", Data: []byte(`{"layers": 2}`)},
		{Path: "model-00001.safetensors", Data: origintest.Bytes(1, 300<<10+17)},
		{Path: "sub/model-00002.safetensors", Data: origintest.Bytes(2, 200<<10+5)},
	}
}

func TestMagnetFetchesEveryFileVerified(t *testing.T) {
	seeder := torrentseed.Start(t)
	mi, magnet := seeder.Add(t, "tiny", model(), 64<<10)
	o, n := newOrigin(t, Options{PartSize: 100 << 10})
	objs, err := o.List(t.Context(), magnet)
	if err != nil {
		t.Fatal(err)
	}
	ih := mi.HashInfoBytes().HexString()
	var total int64
	for i, f := range model() {
		obj := objs[i]
		if obj.Path != f.Path || obj.Key != "tiny/"+f.Path || obj.Size != int64(len(f.Data)) || obj.VersionID != ih {
			t.Fatalf("object %d = %+v", i, obj)
		}
		dst := tempFile(t)
		var v origin.Verification
		if err := o.Download(t.Context(), obj, dst, origin.Plan{OnVerify: func(x origin.Verification) { v = x }}); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(dst.Name()); !bytes.Equal(got, f.Data) {
			t.Fatalf("%s: copy differs", f.Path)
		}
		// Every piece, those shared with a neighbour too: this node
		// holds the neighbours' parts, verified.
		if !v.Verified {
			t.Errorf("%s: %+v, want verified", f.Path, v)
		}
		total += obj.Size
	}
	if n.Load() != total {
		t.Errorf("counted %d origin bytes, want %d", n.Load(), total)
	}
	// The metadata is kept: a second origin on the same dir lists the
	// magnet without any peer.
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o2, _ := newOrigin(t, Options{Dir: o.opts.Dir})
	again, err := o2.List(t.Context(), "magnet:?xt=urn:btih:"+ih)
	if err != nil || !slices.Equal(again, objs) {
		t.Fatalf("listed again %+v, %v; want %+v", again, err, objs)
	}
}

func TestCorruptSeederNeverServesBadBytes(t *testing.T) {
	seeder := torrentseed.Start(t, torrentseed.Corrupt())
	_, magnet := seeder.Add(t, "bad", []torrentseed.File{{Data: origintest.Bytes(3, 200<<10)}}, 64<<10)
	// The download fails once the seeder, banned for its first bad piece,
	// was the last peer: well before the default stall timeout, which is
	// left for a seeder slow to send that piece under CI's load.
	o, n := newOrigin(t, Options{})
	objs, err := o.List(t.Context(), magnet)
	if err != nil {
		t.Fatal(err)
	}
	dst := tempFile(t)
	err = o.Download(t.Context(), objs[0], dst, origin.Plan{})
	// Banned, the seeder was the last peer: the read ends there, not at
	// the stall timeout.
	if !errors.Is(err, origin.ErrCorrupt) || !strings.Contains(err.Error(), "SHA-1") || !strings.Contains(err.Error(), "none other is left") {
		t.Fatalf("download from a corrupting seeder: %v, want ErrCorrupt naming the hash check and the banned peers", err)
	}
	if n.Load() != 0 {
		t.Errorf("handed out %d bytes from a seeder whose every piece is bad", n.Load())
	}
}

func TestMagnetWithoutPeersFailsClearly(t *testing.T) {
	o, _ := newOrigin(t, Options{MetadataTimeout: 500 * time.Millisecond})
	_, err := o.List(t.Context(), "magnet:?xt=urn:btih:"+strings.Repeat("ab", 20))
	if !errors.Is(err, origin.ErrUnreachable) || !strings.Contains(err.Error(), "DHT off") || !strings.HasPrefix(err.Error(), "list magnet:") {
		t.Fatalf("List of a magnet nobody seeds: %v", err)
	}
}

func TestTorrentFileSources(t *testing.T) {
	seeder := torrentseed.Start(t)
	mi, _ := seeder.Add(t, "one.bin", []torrentseed.File{{Data: origintest.Bytes(4, 100<<10)}}, 32<<10)
	path := filepath.Join(t.TempDir(), "one.torrent")
	torrentseed.Write(t, mi, path)
	body, _ := os.ReadFile(path)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/one.torrent" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	o, _ := newOrigin(t, Options{Peers: []string{seeder.Addr()}})
	for _, src := range []string{"torrent+file://" + path, "torrent+" + srv.URL + "/one.torrent"} {
		objs, err := o.List(t.Context(), src)
		if err != nil || len(objs) != 1 || objs[0].Path != "one.bin" || objs[0].VersionID != mi.HashInfoBytes().HexString() {
			t.Fatalf("List(%s) = %+v, %v", src, objs, err)
		}
		dst := tempFile(t)
		if err := o.Download(t.Context(), objs[0], dst, origin.Plan{}); err != nil {
			t.Fatal(err)
		}
	}
	for src, want := range map[string]error{
		"torrent+" + srv.URL + "/gone.torrent":            origin.ErrNotFound,
		"torrent+file://" + path + ".missing":             origin.ErrNotFound,
		"torrent+s3://bucket/models/x.torrent":            origin.ErrNoOrigin,
		"torrent+file:///etc/../etc/x.torrent":            nil,
		"magnet:?xt=urn:btih:123":                         nil,
		"magnet:?xt=urn:btih:" + strings.Repeat("zz", 20): nil,
	} {
		_, err := o.List(t.Context(), src)
		if err == nil || want != nil && !errors.Is(err, want) || !strings.HasPrefix(err.Error(), "list ") {
			t.Errorf("List(%s) = %v, want an error (%v) naming the listing", src, err, want)
		}
	}
	notTorrent := filepath.Join(t.TempDir(), "x.torrent")
	if err := os.WriteFile(notTorrent, []byte("<html>not found</html>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := o.List(t.Context(), "torrent+file://"+notTorrent); err == nil || !strings.Contains(err.Error(), "not a .torrent file") {
		t.Errorf("List of an HTML page: %v", err)
	}
}

// info encodes a metainfo.Info after mod changed a good one.
func info(t *testing.T, mod func(*metainfo.Info)) []byte {
	t.Helper()
	in := metainfo.Info{Name: "m", PieceLength: 16 << 10, Files: []metainfo.FileInfo{{Path: []string{"a"}, Length: 20 << 10}, {Path: []string{"b"}, Length: 1}}}
	in.Pieces = make([]byte, 40)
	mod(&in)
	b, err := bencode.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseInfoRejectsBadTorrents(t *testing.T) {
	if _, err := parseInfo(info(t, func(*metainfo.Info) {})); err != nil {
		t.Fatalf("good info: %v", err)
	}
	for what, mod := range map[string]func(*metainfo.Info){
		"piece length":       func(i *metainfo.Info) { i.PieceLength = 100 },
		"piece hashes":       func(i *metainfo.Info) { i.Pieces = make([]byte, 60) },
		"not a multiple":     func(i *metainfo.Info) { i.Pieces = make([]byte, 41) },
		"unsafe object key":  func(i *metainfo.Info) { i.Files[0].Path = []string{"..", "etc"} },
		"name is not a safe": func(i *metainfo.Info) { i.Name = "../x" },
		"listed twice":       func(i *metainfo.Info) { i.Files[1].Path = []string{"a"} },
		"no v1":              func(i *metainfo.Info) { i.Pieces = nil },
		"no bytes": func(i *metainfo.Info) {
			i.Files = []metainfo.FileInfo{{Path: []string{"a"}}}
			i.Pieces = make([]byte, 20)
		},
	} {
		if _, err := parseInfo(info(t, mod)); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("%s: %v", what, err)
		}
	}
}

func TestDropNow(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	o := Options{IdleDrop: 10 * time.Minute, SeedRatio: 1, SeedTime: time.Hour}
	seed := o
	seed.Seed = true
	idle := useState{Added: t0, Used: t0, Length: 100}
	for _, c := range []struct {
		name string
		s    useState
		now  time.Time
		o    Options
		want bool
	}{
		{"idle long enough", idle, t0.Add(10 * time.Minute), o, true},
		{"idle not long enough", idle, t0.Add(9 * time.Minute), o, false},
		{"being read", useState{Active: 1, Added: t0, Used: t0}, t0.Add(time.Hour), o, false},
		{"seeding below ratio and time", idle, t0.Add(30 * time.Minute), seed, false},
		{"seeded its ratio", useState{Added: t0, Used: t0, Length: 100, Uploaded: 100}, t0.Add(30 * time.Minute), seed, true},
		{"seeded its time", idle, t0.Add(time.Hour), seed, true},
	} {
		if got := dropNow(c.s, c.now, c.o); got != c.want {
			t.Errorf("%s: dropNow = %v, want %v", c.name, got, c.want)
		}
	}
}

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "copy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
