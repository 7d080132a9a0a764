package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router"
)

// TestRouterPeers runs two router replicas over two simulated backends,
// each streaming its decisions to the other: documents first asked through
// one replica are then routed by the other to the same backend, as hits. A
// third router with another key is refused as a peer.
func TestRouterPeers(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "hash.key")
	if err := os.WriteFile(keyFile, []byte("fleet secret for prompt hashes"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherKey := filepath.Join(dir, "other.key")
	if err := os.WriteFile(otherKey, []byte("another fleet's secret entirely"), 0o600); err != nil {
		t.Fatal(err)
	}
	backends := simBackends(t, 2)
	apiA, apiB, adminA, adminB := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	peerA, peerB := testenv.FreeAddr(t), testenv.FreeAddr(t)
	replica := func(name, api, admin, listen, to, key string) *syncBuffer {
		args := append([]string{"router", "--listen", api, "--admin-listen", admin, "--node-name", name, "--hash-key-file", key,
			"--peer-listen", listen, "--peer", "http://" + to}, backends...)
		return runInBackground(t, args...)
	}
	logA := replica("ra", apiA, adminA, peerA, peerB, keyFile)
	replica("rb", apiB, adminB, peerB, peerA, keyFile)
	replica("rc", testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t), peerA, otherKey)

	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		wait.Err(t, what, func() error {
			if cond() {
				return nil
			}
			return fmt.Errorf("not yet; replica a's log:\n%s", logA.String())
		})
	}
	ask := func(api string, doc, q int) map[string]string { return askDoc(t, api, doc, q) }
	indexed := indexedBlocks
	waitUntil("both replicas up", func() bool { return indexed(adminA) == 0 && indexed(adminB) == 0 })
	waitUntil("replica c refused by a", func() bool { return strings.Contains(logA.String(), `"peer \"rc\": wrong X-Warmfleet-Peer-Auth`) })

	placed := map[int]string{}
	for doc := range 8 {
		placed[doc] = ask(apiA, doc, 0)["backend"]
	}
	waitUntil("replica b to learn a's placements", func() bool { return indexed(adminB) == indexed(adminA) })
	for doc := range 8 {
		if r := ask(apiB, doc, 1); r["backend"] != placed[doc] || r["reason"] != "hit" {
			t.Errorf("doc %d: replica b routed it to %s (%s); replica a had placed it on %s", doc, r["backend"], r["reason"], placed[doc])
		}
	}
	if strings.Contains(logA.String(), "peer=rc remote") {
		t.Errorf("replica a took a stream from replica c, which holds another key:\n%s", logA.String())
	}
}

func TestPeerAddress(t *testing.T) {
	for _, tc := range []struct {
		explicit, listen, advertise, gossip string
		want, err                           string
	}{
		{"", "10.0.0.5:9181", "", "0.0.0.0:7947", "10.0.0.5:9181", ""},
		{"", ":9181", "10.0.0.6:7947", "0.0.0.0:7947", "10.0.0.6:9181", ""},
		{"", "0.0.0.0:9181", "", "10.0.0.7:7947", "10.0.0.7:9181", ""},
		{"", "[::]:9181", "", "[fd00::7]:7947", "[fd00::7]:9181", ""},
		{"", ":9181", "", "0.0.0.0:7947", "", ""}, // nothing routable: not advertised
		{"", "router-1.fleet:9181", "", "", "router-1.fleet:9181", ""},
		{"peers.fleet:443", ":9181", "", "", "peers.fleet:443", ""},
		{"nonsense", ":9181", "", "", "", "--peer-advertise"},
		{"", "9181", "", "", "", "--peer-listen"},
		{"", "10.0.0.5:0", "", "", "", "fixed port"},
	} {
		got, err := peerAddress(tc.explicit, tc.listen, tc.advertise, tc.gossip)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("peerAddress(%q, %q, %q, %q) = %q, %v; want %q, error containing %q", tc.explicit, tc.listen, tc.advertise, tc.gossip, got, err, tc.want, tc.err)
		}
	}
}

// TestRouterPeersFoundThroughGossip: two routers that join one fleet with
// --peer-listen and no --peer find each other through gossip and share
// their placements.
func TestRouterPeersFoundThroughGossip(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "hash.key")
	if err := os.WriteFile(keyFile, []byte("fleet secret for prompt hashes"), 0o600); err != nil {
		t.Fatal(err)
	}
	backends := simBackends(t, 2)
	gossipA, gossipB := testenv.FreeAddr(t), testenv.FreeAddr(t)
	apiA, apiB, adminA, adminB := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	start := func(name, api, admin, gossipAddr, join string) *syncBuffer {
		args := append([]string{"router", "--listen", api, "--admin-listen", admin, "--node-name", name, "--hash-key-file", keyFile,
			"--gossip", gossipAddr, "--join", join, "--insecure-gossip", "--peer-listen", testenv.FreeAddr(t)}, backends...)
		return runInBackground(t, args...)
	}
	logA := start("ra", apiA, adminA, gossipA, gossipA) // the first joins itself
	logB := start("rb", apiB, adminB, gossipB, gossipA)
	wait.Err(t, "the routers to stream to each other", func() error {
		if strings.Contains(logA.String(), "peer stream open") && strings.Contains(logB.String(), "peer stream open") {
			return nil
		}
		return fmt.Errorf("not yet; a:\n%s\nb:\n%s", logA.String(), logB.String())
	})
	routeOf := func(api string, doc, q int) map[string]string { return askDoc(t, api, doc, q) }
	placed := map[int]string{}
	for doc := range 6 {
		placed[doc] = routeOf(apiA, doc, 0)["backend"]
	}
	// b has the placements once its index holds as many blocks as a's.
	indexed := indexedBlocks
	wait.Err(t, "replica b to learn a's placements", func() error {
		if b, a := indexed(adminB), indexed(adminA); b != a {
			return fmt.Errorf("%d blocks indexed, a has %d", b, a)
		}
		return nil
	})
	for doc := range 6 {
		if r := routeOf(apiB, doc, 1); r["backend"] != placed[doc] || r["reason"] != "hit" {
			t.Errorf("doc %d: replica b routes it to %s (%s); a placed it on %s", doc, r["backend"], r["reason"], placed[doc])
		}
	}
}

// simBackends runs n llmsim backends and waits until they listen, so a
// router's first probe finds them up (a backend a probe fails is ejected
// for a while, and every request would go to the others).
func simBackends(t *testing.T, n int) []string {
	t.Helper()
	var args []string
	for range n {
		addr := testenv.FreeAddr(t)
		startSim(t, addr, "sim")
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err := testenv.WaitTCP(ctx, addr)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--backend", "http://"+addr)
	}
	return args
}

// askDoc asks a router about document doc (a long prompt shared by its
// questions), question q, and returns the router's explanation of where it
// went.
func askDoc(t *testing.T, api string, doc, q int) map[string]string {
	t.Helper()
	prompt := strings.Repeat(fmt.Sprintf("document %d is long and shared. ", doc), 80) + fmt.Sprint("question ", q)
	body, _ := json.Marshal(map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 1})
	req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/completions", bytes.NewReader(body))
	req.Header.Set(router.DebugRequestHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("doc %d through %s: status %d", doc, api, resp.StatusCode)
	}
	return router.ParseRoute(resp.Header.Get(router.RouteHeader))
}

// indexedBlocks is how many blocks a router's index holds over all its
// backends, from its admin API; -1 if it cannot be read.
func indexedBlocks(admin string) int {
	resp, err := http.Get("http://" + admin + "/admin/state")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var st router.State
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return -1
	}
	n := 0
	for _, b := range st.Backends {
		n += b.IndexBlocks
	}
	return n
}
