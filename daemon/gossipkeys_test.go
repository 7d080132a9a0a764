package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/internal/testutil/memnet"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// gossipFleet starts n encrypted gossip nodes on an in-memory network and
// returns them with their cluster key.
func gossipFleet(t *testing.T, n int) ([]*gossip.Node, []byte) {
	t.Helper()
	key, err := gossip.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	mnet := &memnet.Network{}
	var trs []*memnet.Transport
	for i := range n {
		trs = append(trs, mnet.NewTransport(fmt.Sprintf("g%d", i)))
	}
	var nodes []*gossip.Node
	for i, tr := range trs {
		cfg := gossip.Config{
			NodeName: fmt.Sprintf("g%d", i), Keyring: [][]byte{key}, Transport: tr,
			Tuning: gossip.Tuning{GossipInterval: 20 * time.Millisecond, ProbeInterval: 200 * time.Millisecond,
				PushPullInterval: 300 * time.Millisecond, TCPTimeout: 2 * time.Second},
		}
		if i > 0 {
			cfg.Join = []string{trs[0].Addr()}
		}
		node, err := gossip.Start(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, node)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, node := range nodes {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_ = node.Close(ctx)
			})
		}
		wg.Wait()
	})
	for _, node := range nodes {
		wait.For(t, node.LocalName()+" sees the fleet", func() bool {
			alive := 0
			for _, m := range node.Members() {
				if m.State == gossip.MemberAlive {
					alive++
				}
			}
			return alive == n
		})
	}
	return nodes, key
}

func TestGossipKeysAPI(t *testing.T) {
	nodes, oldKey := gossipFleet(t, 3)
	d := newDaemonDeps(t, t.TempDir(), nil, Deps{Fleet: nodes[0]})
	t.Cleanup(func() { d.Close() })
	const token = "secret-token-123456"
	srv := httptest.NewServer(d.Handler(token))
	defer srv.Close()
	cl, err := api.NewClient(strings.TrimPrefix(srv.URL, "http://"), token)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	newKey, _ := gossip.GenerateKey()
	oldFP, newFP := gossip.Fingerprint(oldKey), gossip.Fingerprint(newKey)

	// Without the token nothing is listed, let alone changed.
	resp, err := http.Post(srv.URL+"/v1/gossip/keys", "application/json",
		strings.NewReader(`{"op":"install","key":"`+gossip.EncodeKey(newKey)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("install without token: HTTP %d", resp.StatusCode)
	}

	check := func(step string, r api.GossipKeysResponse, err error, want ...string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if r.Failed != 0 || len(r.Members) != 3 {
			t.Fatalf("%s: %+v", step, r)
		}
		for _, m := range r.Members {
			if !m.OK || strings.Join(m.Keys, ",") != strings.Join(want, ",") {
				t.Fatalf("%s: member %+v, want keys %v", step, m, want)
			}
		}
	}
	r, err := cl.GossipKeys(ctx)
	check("list", r, err, oldFP)
	r, err = cl.GossipKeyOp(ctx, api.GossipKeyRequest{Op: api.GossipKeyInstall, Key: gossip.EncodeKey(newKey)})
	check("install", r, err, oldFP, newFP)
	_, err = cl.GossipKeyOp(ctx, api.GossipKeyRequest{Op: api.GossipKeyRemove, Fingerprint: oldFP})
	if se := (*api.StatusError)(nil); !errors.As(err, &se) || se.Code != http.StatusConflict {
		t.Fatalf("removing the key in use: %v, want HTTP 409", err)
	}
	r, err = cl.GossipKeyOp(ctx, api.GossipKeyRequest{Op: api.GossipKeyUse, Fingerprint: newFP})
	check("use", r, err, newFP, oldFP)
	r, err = cl.GossipKeyOp(ctx, api.GossipKeyRequest{Op: api.GossipKeyRemove, Fingerprint: oldFP})
	check("remove", r, err, newFP)

	// Listing shows fingerprints, never key material.
	body := get(t, srv.URL+"/v1/gossip/keys", token)
	for _, k := range [][]byte{oldKey, newKey} {
		if strings.Contains(body, gossip.EncodeKey(k)) {
			t.Fatal("the key list carries a key")
		}
	}
}

func get(t *testing.T, url, token string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestGossipKeysAPIBadRequests(t *testing.T) {
	nodes, key := gossipFleet(t, 1)
	k64 := gossip.EncodeKey(key)
	other, _ := gossip.GenerateKey()
	for _, tc := range []struct {
		name, body, remote string
		kr                 GossipKeyring
		code               int
		contains           string
	}{
		{"not json", `{`, "", nodes[0], 400, "bad JSON"},
		{"two values", `{"op":"use","fingerprint":"sha256:0011223344556677"}{}`, "", nodes[0], 400, "more than one"},
		{"unknown field", `{"op":"install","key":"` + k64 + `","evil":1}`, "", nodes[0], 400, "unknown field"},
		{"oversize", `{"op":"` + strings.Repeat("a", maxBodyBytes) + `"}`, "", nodes[0], 400, "larger than"},
		{"unknown op", `{"op":"delete"}`, "", nodes[0], 400, "want list, install"},
		{"list by post", `{"op":"list"}`, "", nodes[0], 400, "GET"},
		{"install without key", `{"op":"install"}`, "", nodes[0], 400, "takes the key"},
		{"install not base64", `{"op":"install","key":"!!"}`, "", nodes[0], 400, "base64"},
		{"install short key", `{"op":"install","key":"AAAA"}`, "", nodes[0], 400, "want 32"},
		{"install with fingerprint", `{"op":"install","key":"` + k64 + `","fingerprint":"sha256:0011223344556677"}`, "", nodes[0], 400, "no fingerprint"},
		{"use without key", `{"op":"use"}`, "", nodes[0], 400, "fingerprint"},
		{"bad fingerprint", `{"op":"use","fingerprint":"sha256:xyz"}`, "", nodes[0], 400, "16 hex"},
		{"mismatch", `{"op":"use","key":"` + k64 + `","fingerprint":"` + gossip.Fingerprint(other) + `"}`, "", nodes[0], 400, "do not match"},
		{"unknown key", `{"op":"use","fingerprint":"` + gossip.Fingerprint(other) + `"}`, "", nodes[0], 404, "no installed key"},
		{"remove primary", `{"op":"remove","fingerprint":"` + gossip.Fingerprint(key) + `"}`, "", nodes[0], 409, "in use"},
		{"key from the network", `{"op":"install","key":"` + gossip.EncodeKey(other) + `"}`, "192.0.2.7:40000", nodes[0], 403, "only accepted from this host"},
		{"no gossip", `{"op":"use","fingerprint":"sha256:0011223344556677"}`, "", nil, 503, "without gossip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/gossip/keys", strings.NewReader(tc.body))
			req.RemoteAddr = "127.0.0.1:5555"
			if tc.remote != "" {
				req.RemoteAddr = tc.remote
			}
			w := httptest.NewRecorder()
			serveGossipKeyOp(w, req, tc.kr)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.contains) {
				t.Fatalf("HTTP %d %s, want %d containing %q", w.Code, w.Body.String(), tc.code, tc.contains)
			}
		})
	}
	if ks := nodes[0].KeyFingerprints(); len(ks) != 1 || ks[0] != gossip.Fingerprint(key) {
		t.Fatalf("a rejected request changed the keyring: %v", ks)
	}
}

// TestLocalClient checks what the server sees of unix socket and TCP peers.
func TestLocalClient(t *testing.T) {
	for _, tc := range []struct {
		remote string
		local  bool
	}{
		{"127.0.0.1:80", true}, {"[::1]:80", true}, {"@", true}, {"", true},
		{"10.0.0.1:80", false}, {"[2001:db8::1]:80", false}, {"localhost:80", false},
	} {
		if got := localClient(tc.remote); got != tc.local {
			t.Errorf("localClient(%q) = %v", tc.remote, got)
		}
	}
	// A real unix socket peer.
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.RemoteAddr })}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", l.Addr().String())
	}}}
	resp, err := c.Get("http://warmfleet/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if r := <-seen; !localClient(r) {
		t.Fatalf("a unix socket peer (%q) is not local", r)
	}
}
