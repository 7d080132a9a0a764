package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anacrolix/torrent/metainfo"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/hubserver"
	"github.com/warmfleet/warmfleet/internal/testutil/origintest"
	"github.com/warmfleet/warmfleet/internal/testutil/torrentseed"
)

// cliOn runs the client commands against the daemon at sock.
func cliOn(t *testing.T, sock string) func(args ...string) (int, string, string) {
	return func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Run(t.Context(), append(args, "--api", sock), &Env{Stdout: &out, Stderr: &errOut, Getenv: os.Getenv})
		return code, out.String(), errOut.String()
	}
}

// statusJSON is `cache status NAME -o json`, parsed.
func statusJSON(t *testing.T, cli func(args ...string) (int, string, string), name string) api.CacheStatus {
	t.Helper()
	code, stdout, stderr := cli("cache", "status", name, "-o", "json")
	if code != 0 {
		t.Fatalf("cache status: %d %s", code, stderr)
	}
	var st api.CacheStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status JSON %q: %v", stdout, err)
	}
	return st
}

// TestTorrentExportFetchedBack runs `warmfleet torrent export` against a
// daemon holding a Hub model and hands the .torrent it writes to a
// separate anacrolix client, which fetches every byte from the web seed
// named on the command line (the cached files served over HTTP, as the
// command's output says) and checks each piece against the export's
// hashes. The files are listed in the order of BEP 52's file tree (paths
// compared name by name, so "a/b" comes before "a.b", where a plain string
// sort puts it after), and a second export is byte for byte the same: two
// nodes exporting one revision publish one info hash.
func TestTorrentExportFetchedBack(t *testing.T) {
	hub := hubserver.New(t)
	files := map[string]hubserver.File{
		"model-00002.safetensors": {Data: origintest.Bytes(31, 300<<10+17), LFS: true},
		"model-00001.safetensors": {Data: origintest.Bytes(32, 500<<10+5), LFS: true},
		"a.b":                     {Data: []byte("dot")},
		"a/b.json":                {Data: []byte(`{"slash": true}`)},
		"a/c/tok.model":           {Data: origintest.Bytes(33, 4000), LFS: true},
		"Zconfig.json":            {Data: []byte(`{"upper": 1}`)},
	}
	want := []string{"Zconfig.json", "a/b.json", "a/c/tok.model", "a.b", "model-00001.safetensors", "model-00002.safetensors"}
	hub.Push("org/tiny", "main", files)
	sock := startDaemon(t, "--hf-endpoint", hub.Endpoint())
	cli := cliOn(t, sock)
	if code, _, stderr := cli("cache", "add", "org/tiny", "--source", "hf://org/tiny", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("cache add: %d %s", code, stderr)
	}
	st := statusJSON(t, cli, "org/tiny")
	// The web seed: file PATH at URL + "org--tiny/" + PATH, served from the
	// node's copy as the command tells the operator to.
	mux := http.NewServeMux()
	mux.Handle("/mirror/org--tiny/", http.StripPrefix("/mirror/org--tiny/", http.FileServer(http.Dir(st.Path))))
	seed := httptest.NewServer(mux)
	defer seed.Close()

	out := filepath.Join(t.TempDir(), "tiny.torrent")
	code, stdout, stderr := cli("torrent", "export", "org/tiny", "--web-seed", seed.URL+"/mirror/", "--out", out, "--piece-length", "256KiB")
	if code != 0 {
		t.Fatalf("torrent export: %d %s", code, stderr)
	}
	if !strings.Contains(stdout, st.Path) || !strings.Contains(stdout, "org--tiny/") {
		t.Errorf("export output %q does not say what to serve where", stdout)
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	mi, err := metainfo.Load(bytes.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	info, err := mi.UnmarshalInfo()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var all []byte
	for _, f := range info.Files {
		got = append(got, strings.Join(f.Path, "/"))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("exported files in order %q, want %q", got, want)
	}
	for _, p := range want {
		all = append(all, files[p].Data...)
	}
	if info.Name != "org--tiny" || len(mi.UrlList) != 1 || mi.UrlList[0] != seed.URL+"/mirror/" {
		t.Errorf("exported name %q, web seeds %q", info.Name, mi.UrlList)
	}
	if fetched := torrentseed.Fetch(t, mi); !bytes.Equal(fetched, all) {
		t.Fatalf("fetched %d bytes through the web seed, differing from the model's %d", len(fetched), len(all))
	}

	again := filepath.Join(t.TempDir(), "again.torrent")
	if code, _, stderr = cli("torrent", "export", "org/tiny", "--web-seed", seed.URL+"/mirror/", "--out", again, "--piece-length", "256KiB"); code != 0 {
		t.Fatalf("second torrent export: %d %s", code, stderr)
	}
	if second, err := os.ReadFile(again); err != nil || !bytes.Equal(first, second) {
		t.Fatalf("a second export of the same revision differs (%v): not one info hash per revision", err)
	}
}
