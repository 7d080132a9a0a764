package cli

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The Hub's endpoint and token come from the flags, else from the
// environment huggingface_hub reads; a bad token file or endpoint is a
// usage error, not a daemon that fails every hf:// fetch later.
func TestHubOptions(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("hf_fromfile\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badFile := filepath.Join(dir, "bad")
	if err := os.WriteFile(badFile, []byte("a b\nc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HF_ENDPOINT": "http://mirror.local:8080", "HF_TOKEN": "hf_fromenv", "HF_HOME": dir}
	getenv := func(k string) string { return env[k] }

	opts, err := hubOptions(&daemonFlags{}, getenv)
	if err != nil || opts.Endpoint != "http://mirror.local:8080" || opts.Token != "hf_fromenv" {
		t.Errorf("from the environment: %+v, %v", opts, err)
	}
	opts, err = hubOptions(&daemonFlags{hfEndpoint: "https://hub.example", hfTokenFile: tokenFile}, getenv)
	if err != nil || opts.Endpoint != "https://hub.example" || opts.Token != "hf_fromfile" {
		t.Errorf("flags over the environment: %+v, %v", opts, err)
	}
	if _, err := hubOptions(&daemonFlags{hfTokenFile: badFile}, getenv); !errors.Is(err, errUsage) {
		t.Errorf("a token file of two lines: %v, want a usage error", err)
	}
	if _, err := hubOptions(&daemonFlags{hfTokenFile: filepath.Join(dir, "missing")}, getenv); !errors.Is(err, errUsage) {
		t.Errorf("a missing token file named by the flag: %v, want a usage error", err)
	}

	f := &daemonFlags{s3Concurrency: 4, partSize: 1 << 20, dataDir: t.TempDir()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	o := origins{}
	o.hf.Endpoint = "ftp://hub.example"
	if _, _, err := o.build(t.Context(), log, f, func(string, int) {}); !errors.Is(err, errUsage) {
		t.Errorf("an ftp:// hub endpoint: %v, want a usage error", err)
	}
	o.hf.Endpoint = "http://127.0.0.1:1"
	mux, closeAll, err := o.build(t.Context(), log, f, func(string, int) {})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeAll() }()
	for _, src := range []string{"s3://b/p/", "hf://org/m", "magnet:?xt=urn:btih:" + strings.Repeat("0", 40), "torrent+https://example.com/m.torrent"} {
		if _, err := mux.For(src); err != nil {
			t.Errorf("no origin for %s: %v", src, err)
		}
	}
}
