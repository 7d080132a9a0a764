package daemon

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/daemon/api"
)

// decode runs decodeJSON on body as the API handlers do.
func decode(body string) (api.AddCacheRequest, error) {
	var req api.AddCacheRequest
	r := httptest.NewRequest(http.MethodPost, "/v1/caches", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	err := decodeJSON(httptest.NewRecorder(), r, &req)
	return req, err
}

func TestDecodeJSONRejectsTrailingData(t *testing.T) {
	tests := []struct {
		name, body string
		ok         bool
	}{
		{"one object", `{"name":"m","source":"s3://bkt/p/"}`, true},
		{"trailing whitespace", "{\"name\":\"m\"}\n\t ", true},
		{"second object", `{"name":"m"}{}`, false},
		{"stray brace", `{"name":"m"} }`, false},
		{"stray bracket", `{"name":"m"}]`, false},
		{"stray comma", `{"name":"m"},`, false},
		{"stray colon", `{"name":"m"}:`, false},
		{"number after", `{"name":"m"} 1`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decode(tt.body)
			if (err == nil) != tt.ok {
				t.Fatalf("decodeJSON(%q) = %v, want ok=%t", tt.body, err, tt.ok)
			}
		})
	}
}

// FuzzDecodeJSON checks that an accepted body is exactly one JSON value, so
// a truncated or garbled request is never acted on.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"name":"m","source":"s3://bkt/p/"}`, `{} }`, `{}]`, `{"targets":{"nodes":1}} `, `null`, `{"name":"a"}{`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if _, err := decode(body); err == nil && !json.Valid([]byte(body)) {
			t.Fatalf("decodeJSON accepted %q, which is not one JSON value", body)
		}
	})
}

// TestListenKeepsOtherFiles: a mistyped --api that names a file or a
// directory is an error, never a reason to delete it.
func TestListenKeepsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "state.db")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{file, empty} {
		l, err := Listen(t.Context(), api.Addr{Network: "unix", Address: p}, "")
		if err == nil {
			l.Close()
			t.Errorf("Listen on %s succeeded, want an error", p)
		}
		if _, serr := os.Stat(p); serr != nil {
			t.Errorf("Listen on %s removed it (err %v): %v", p, err, serr)
		}
	}
	if b, _ := os.ReadFile(file); string(b) != "precious" {
		t.Fatalf("file content now %q", b)
	}

	// A socket left by a dead daemon is still replaced.
	sock := filepath.Join(dir, "api.sock")
	l, err := Listen(t.Context(), api.Addr{Network: "unix", Address: sock}, "")
	if err != nil {
		t.Fatal(err)
	}
	l.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	l.Close()
	if l, err = Listen(t.Context(), api.Addr{Network: "unix", Address: sock}, ""); err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l.Close()
}
