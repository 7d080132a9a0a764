package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// get fetches url with method and an optional bearer token, returning the
// status and body.
func get(t *testing.T, method, url, token string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// launchDaemon runs `warmfleet daemon args` in-process until the test ends
// and returns its output so far, on demand.
func launchDaemon(t *testing.T, getenv func(string) string, args ...string) *syncBuffer {
	t.Helper()
	return runInBackgroundEnv(t, getenv, append([]string{"daemon"}, args...)...)
}

// TestMetricsListenerProbes: the metrics listener answers before the
// daemon's state is loaded and says what it waits for, needs no token
// while the API does, is ready only once a fleet member joined, and serves
// nothing that changes state.
func TestMetricsListenerProbes(t *testing.T) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Another process holding the state's lock keeps the daemon loading.
	held, err := bolt.Open(filepath.Join(dataDir, "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	const token = "metrics-test-token-0123456789"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	apiAddr, metricsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	gossipAddr, peerAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	out := launchDaemon(t, noEnv, "--data-dir", dataDir, "--api", apiAddr, "--api-token-file", tokenFile,
		"--metrics-listen", metricsAddr, "--containerd", "off", "--reserve", "0", "--reserve-fraction", "0",
		"--node-name", "node-a", "--gossip", gossipAddr, "--insecure-gossip", "--join", peerAddr)
	metrics := "http://" + metricsAddr

	wait.For(t, "/readyz 503 while the state is locked", func() bool {
		code, body, err := get(t, "GET", metrics+"/readyz", "")
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "state: not loaded yet")
	})
	if code, _, err := get(t, "GET", metrics+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz while loading: %d, %v", code, err)
	}
	if code, body, err := get(t, "GET", metrics+"/ui/fleet.json", ""); err != nil || code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "state not loaded yet") {
		t.Fatalf("/ui/fleet.json while loading: %d %q, %v; want 503 saying why", code, body, err)
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}

	var body string
	wait.For(t, "/readyz to wait for a fleet member", func() bool {
		var code int
		code, body, err = get(t, "GET", metrics+"/readyz", "")
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "fleet: no other member joined yet")
	})
	// The API answers by now: readiness names only what is still missing.
	if code, _, err := get(t, "GET", "http://"+apiAddr+"/v1/node", token); err != nil || code != http.StatusOK {
		t.Fatalf("API /v1/node with the token: %d, %v; daemon log:\n%s", code, err, out.String())
	}
	if code, _, err := get(t, "GET", "http://"+apiAddr+"/metrics", ""); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("API /metrics without a token: %d, %v; want 401", code, err)
	}
	code, body, err := get(t, "GET", metrics+"/metrics", "")
	if err != nil || code != http.StatusOK || !strings.Contains(body, "warmfleet_cache_available_bytes") {
		t.Fatalf("metrics listener /metrics without a token: %d, %v:\n%.500s", code, err, body)
	}
	code, body, err = get(t, "GET", metrics+"/ui/fleet.json", "")
	if err != nil || code != http.StatusOK || !strings.Contains(body, `"name":"node-a"`) || !strings.Contains(body, `"clustered":true`) {
		t.Fatalf("metrics listener /ui/fleet.json without a token: %d, %v:\n%.500s", code, err, body)
	}
	if code, body, err := get(t, "GET", metrics+"/ui", ""); err != nil || code != http.StatusOK || !strings.Contains(body, `content="ui/fleet.json"`) {
		t.Fatalf("metrics listener /ui: %d, %v:\n%.300s", code, err, body)
	}
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"POST", "/readyz", http.StatusMethodNotAllowed},
		{"PUT", "/metrics", http.StatusMethodNotAllowed},
		{"DELETE", "/healthz", http.StatusMethodNotAllowed},
		{"POST", "/v1/caches", http.StatusNotFound},
		{"GET", "/v1/node", http.StatusNotFound},
		{"DELETE", "/v1/caches/x", http.StatusNotFound},
		{"POST", "/ui", http.StatusMethodNotAllowed},
		{"POST", "/ui/fleet.json", http.StatusMethodNotAllowed},
		{"DELETE", "/ui/fleet.json", http.StatusMethodNotAllowed},
		{"GET", "/ui/", http.StatusNotFound},
	} {
		if code, body, err := get(t, tc.method, metrics+tc.path, ""); err != nil || code != tc.want {
			t.Errorf("%s %s on the metrics listener: %d %v %q; want %d", tc.method, tc.path, code, err, body, tc.want)
		}
	}

	peer, err := gossip.Start(t.Context(), gossip.Config{NodeName: "node-b", BindAddr: peerAddr, Insecure: true, Join: []string{gossipAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close(context.WithoutCancel(t.Context()))
	wait.For(t, "/readyz 200 once a member joined", func() bool {
		code, body, err = get(t, "GET", metrics+"/readyz", "")
		return err == nil && code == http.StatusOK
	})
}

// TestMetricsListenerBusyAddress: a metrics address already taken stops
// the daemon with the error before it opens its state or serves its API.
func TestMetricsListenerBusyAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	var out syncBuffer
	code := Run(t.Context(), []string{"daemon", "--data-dir", filepath.Join(dir, "data"), "--api", "unix://" + sock,
		"--metrics-listen", busy.Addr().String(), "--containerd", "off"},
		&Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }})
	if code == 0 || !strings.Contains(out.String(), "metrics listener") || !strings.Contains(out.String(), "address already in use") {
		t.Fatalf("daemon exited %d: %s; want an error naming the busy metrics address", code, out.String())
	}
	for _, p := range []string{sock, filepath.Join(dir, "data")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists (%v): the daemon started before failing on the metrics address", p, err)
		}
	}
}

// TestMetricsListenEnv: the flag comes from WARMFLEET_METRICS_LISTEN like
// every daemon flag.
func TestMetricsListenEnv(t *testing.T) {
	fs := newFlagSet(&Env{Stderr: io.Discard}, "daemon")
	var f daemonFlags
	f.register(fs)
	env := func(k string) string {
		if k == "WARMFLEET_METRICS_LISTEN" {
			return "127.0.0.1:9464"
		}
		return ""
	}
	if err := parseFlags(fs, &Env{Stderr: io.Discard, Getenv: env}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if f.metricsListen != "127.0.0.1:9464" {
		t.Fatalf("metrics listen %q from the environment", f.metricsListen)
	}
}

// noEnv is an environment with nothing set.
func noEnv(string) string { return "" }
