package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testenv"
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
	var backends []string
	for range 2 {
		addr := testenv.FreeAddr(t)
		runInBackground(t, "llmsim", "--listen", addr, "--model", "sim")
		backends = append(backends, "--backend", "http://"+addr)
	}
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
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; replica a's log:\n%s", what, logA.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ask := func(api string, doc, q int) map[string]string {
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
	indexed := func(admin string) int {
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
