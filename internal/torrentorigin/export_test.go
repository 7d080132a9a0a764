package torrentorigin

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
)

// An exported .torrent is read by a separate anacrolix client, which
// fetches every byte from the web seed it names (loopback) and checks it
// against the exported hashes.
func TestExportFetchedBackThroughWebSeed(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "org--m") // the web server's view: URL/NAME/PATH
	files := map[string][]byte{
		"model-00001.safetensors": origintest.Bytes(10, 700<<10+3),
		"config.json":             []byte(`{"a": 1}`),
		"sub/tok.json":            origintest.Bytes(11, 5000),
	}
	order := []string{"model-00001.safetensors", "config.json", "sub/tok.json"} // the revision's order, not sorted
	var want []byte
	for _, p := range order {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), files[p], 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, files[p]...)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(root)))
	defer srv.Close()
	mi, err := Export(t.Context(), dir, order, ExportOptions{Name: "org--m", WebSeeds: []string{srv.URL + "/"}, PieceLength: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := mi.Write(&buf); err != nil {
		t.Fatal(err)
	}
	// What a client reads back: the same checks a source's .torrent gets.
	back, err := ParseMetainfo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	l, err := parseInfo(back.InfoBytes)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range order {
		if l.files[i].path != p {
			t.Fatalf("file %d is %s, want %s (the revision's order)", i, l.files[i].path, p)
		}
	}
	if got := torrentseed.Fetch(t, back); !bytes.Equal(got, want) {
		t.Fatalf("fetched %d bytes through the web seed, differing from the revision's %d", len(got), len(want))
	}
}

func TestExportRejects(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for what, c := range map[string]struct {
		paths []string
		opts  ExportOptions
	}{
		"bad name":     {[]string{"a"}, ExportOptions{Name: "../x"}},
		"no files":     {nil, ExportOptions{Name: "m"}},
		"missing file": {[]string{"b"}, ExportOptions{Name: "m"}},
		"unsafe path":  {[]string{"../a"}, ExportOptions{Name: "m"}},
		"web seed":     {[]string{"a"}, ExportOptions{Name: "m", WebSeeds: []string{"ftp://x/"}}},
		"piece length": {[]string{"a"}, ExportOptions{Name: "m", PieceLength: 1000}},
	} {
		if _, err := Export(t.Context(), dir, c.paths, c.opts); err == nil {
			t.Errorf("%s: exported", what)
		}
	}
}

func TestPieceLengthFor(t *testing.T) {
	for total, want := range map[int64]int64{1 << 20: 256 << 10, 1 << 30: 1 << 20, 15 << 30: 8 << 20, 1 << 40: 16 << 20} {
		if got := PieceLengthFor(total); got != want {
			t.Errorf("PieceLengthFor(%d) = %d, want %d", total, got, want)
		}
	}
}
