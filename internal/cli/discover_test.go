package cli

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func TestPlanDiscovery(t *testing.T) {
	const a, b, c = "http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"
	urls := []string{a, b, c}
	misses := map[string]int{}
	// a answers with a new model, b was registered and answers the same,
	// c was registered and does not answer.
	reg := map[string]string{b: "m", c: "m"}
	ch := planDiscovery(reg, map[string]string{a: "x", b: "m"}, urls, misses)
	if len(ch.add) != 1 || ch.add[0] != (api.Endpoint{Model: "x", URL: a}) || len(ch.remove) != 0 {
		t.Fatalf("round 1: %+v, want a added and c kept after one miss", ch)
	}
	// c misses again: removed. b now lists nothing: one miss only.
	reg[a] = "x"
	ch = planDiscovery(reg, map[string]string{a: "x", b: ""}, urls, misses)
	if len(ch.add) != 0 || !slices.Equal(ch.remove, []string{c}) {
		t.Fatalf("round 2: %+v, want c removed", ch)
	}
	// b answers again with another model: changed, its misses reset.
	ch = planDiscovery(reg, map[string]string{a: "x", b: "n"}, urls, misses)
	if len(ch.add) != 1 || ch.add[0] != (api.Endpoint{Model: "n", URL: b}) || misses[b] != 0 {
		t.Fatalf("round 3: %+v (misses %v), want b changed to n", ch, misses)
	}
	// A server never registered that does not answer is nothing to remove.
	if ch := planDiscovery(map[string]string{}, nil, []string{a}, map[string]int{a: 5}); len(ch.remove)+len(ch.add) != 0 {
		t.Fatalf("unregistered, not answering: %+v", ch)
	}
}

func TestPickModel(t *testing.T) {
	if got := pickModel([]string{"z", "b", "a"}, map[string]bool{"b": true, "z": true}); got != "b" {
		t.Errorf("pickModel = %q, want the first ready model, b", got)
	}
	if got := pickModel([]string{"z", "a"}, nil); got != "z" {
		t.Errorf("pickModel with none ready = %q, want the first listed, z", got)
	}
	if got := pickModel(nil, nil); got != "" {
		t.Errorf("pickModel of nothing = %q", got)
	}
}

// TestProbeModelsBadAnswers: what a server answers is outside input: an
// error, garbage, an endless body or names the fleet cannot hold give an
// error or are left out, never a crash or an unbounded read.
func TestProbeModelsBadAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		want    []string
		wantErr string
	}{
		{"good", 200, `{"data":[{"id":"a"},{"id":"b"},{"id":"a"}]}`, []string{"a", "b"}, ""},
		{"bad names left out", 200, `{"data":[{"id":"../../etc"},{"id":""},{"id":"ok"}]}`, []string{"ok"}, ""},
		{"server error", 500, `oops`, nil, "500"},
		{"not json", 200, `<html>`, nil, "/v1/models"},
		{"endless", 200, `{"data":[{"id":"` + strings.Repeat("a", 2<<20), nil, "/v1/models"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/models" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			got, err := probeModels(t.Context(), srv.Client(), srv.URL)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("probeModels = %v, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("probeModels = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestParseDiscoverURLs(t *testing.T) {
	got, err := parseDiscoverURLs([]string{"http://127.0.0.1:8000/", "http://127.0.0.1:8000", "https://h:1/base"})
	if err != nil || !slices.Equal(got, []string{"http://127.0.0.1:8000", "https://h:1/base"}) {
		t.Errorf("parseDiscoverURLs = %v, %v", got, err)
	}
	for _, bad := range []string{"127.0.0.1:8000", "ftp://h:1", "http://user:pw@h:1", "http://h:1/?q=1"} {
		if _, err := parseDiscoverURLs([]string{bad}); err == nil {
			t.Errorf("parseDiscoverURLs(%q): no error", bad)
		}
	}
}

// TestDiscoveredEndpointsRouted runs a daemon with --discover-endpoints
// naming two llmsim servers and a router joined to it: the server of the
// model the node caches gets traffic with no `endpoint add`; the one that
// claims a model the node does not hold is registered but never routed;
// a server that stops answering is removed, the other kept.
func TestDiscoveredEndpointsRouted(t *testing.T) {
	s3 := testenv.StartS3(t)
	s3.SetEnv(t)
	s3.CreateBucket(t, "models")
	s3.PutObject(t, "models", "sim/weights.safetensors", strings.NewReader("weights"), 7)
	simAddr, liarAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	stopSim := startSim(t, simAddr, "sim")
	startSim(t, liarAddr, "liar")

	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "api.sock")
	gossipAddr := testenv.FreeAddr(t)
	runInBackground(t, "daemon", "--data-dir", filepath.Join(dir, "data"), "--api", sock, "--node-name", "n1",
		"--gossip", gossipAddr, "--insecure-gossip", "--reserve", "0", "--reserve-fraction", "0", "--containerd", "off",
		"--discover-endpoints", "http://"+simAddr+"/,http://"+liarAddr, "--discover-interval", "100ms")
	routerAddr := testenv.FreeAddr(t)
	routerLog := runInBackground(t, "router", "--listen", routerAddr, "--admin-listen", "", "--join", gossipAddr,
		"--gossip", testenv.FreeAddr(t), "--insecure-gossip", "--node-name", "r1")
	cli := func(args ...string) (int, string) {
		var out bytes.Buffer
		code := Run(t.Context(), append(args, "--api", sock), &Env{Stdout: &out, Stderr: &out, Getenv: os.Getenv})
		return code, out.String()
	}
	endpoints := func() string {
		_, out := cli("endpoint", "ls")
		return out
	}
	wait.For(t, "both servers registered", func() bool {
		out := endpoints()
		return strings.Contains(out, "http://"+simAddr) && strings.Contains(out, "http://"+liarAddr) && strings.Contains(out, "liar")
	})
	if code, out := cli("cache", "add", "sim", "--source", "s3://models/sim/", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("cache add: exit %d: %s", code, out)
	}
	wait.Err(t, "a request for sim served through the discovered endpoint", func() error {
		if code, body := complete(routerAddr, "sim"); code != http.StatusOK {
			return fmt.Errorf("status %d: %s; router log:\n%s", code, body, routerLog)
		}
		return nil
	})
	// The liar's endpoint is known to the router's fleet view by now (it
	// was registered before sim's): it must still get nothing.
	if code, body := complete(routerAddr, "liar"); code == http.StatusOK {
		t.Fatalf("request for liar routed to a server whose model the node does not hold: %s", body)
	}

	stopSim()
	wait.For(t, "the stopped server's endpoint removed", func() bool {
		out := endpoints()
		return !strings.Contains(out, "http://"+simAddr) && strings.Contains(out, "http://"+liarAddr)
	})
}
