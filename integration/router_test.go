package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/router"
)

// routerReply is one answer through the router.
type routerReply struct {
	status  int
	backend string // from the debug explanation
	route   string
	body    string
}

// askRouter sends a chat completion for doc's long system prompt and a
// question, asking the router to explain its choice.
func askRouter(ctx context.Context, c *http.Client, url string, doc, question int) (routerReply, error) {
	text := strings.Repeat(fmt.Sprintf("Document %d, section after section of the same long text.\n", doc), 60)
	body, err := json.Marshal(map[string]any{"model": "sim", "max_tokens": 2, "messages": []map[string]string{
		{"role": "system", "content": text}, {"role": "user", "content": fmt.Sprintf("question %d", question)}}})
	if err != nil {
		return routerReply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return routerReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(router.DebugRequestHeader, "1")
	resp, err := c.Do(req)
	if err != nil {
		return routerReply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return routerReply{}, err
	}
	r := routerReply{status: resp.StatusCode, route: resp.Header.Get(router.RouteHeader), body: string(b)}
	r.backend = router.ParseRoute(r.route)["backend"]
	return r, nil
}

// routerState reads a router's /admin/state.
func routerState(ctx context.Context, c *http.Client, adminURL string) (router.State, error) {
	var st router.State
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/admin/state", nil)
	if err != nil {
		return st, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("admin state: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// TestRouterAcrossHosts runs, on each of three hosts, a daemon and a
// simulated inference server registered with `warmfleet endpoint add`, and
// on a fourth host a router that joins their encrypted gossip cluster. The
// router learns the endpoints from gossip and:
//   - refuses with 503 while no node has the model ready;
//   - sends traffic only to the two nodes the model was cached on, never to
//     the third, whose endpoint it knows;
//   - keeps each long shared prefix on one backend, and spreads the groups,
//     also through a second replica on a fifth host, which finds the first
//     through gossip and shares its placements (--peer-listen);
//   - loses no request when a node dies: the request that finds the dead
//     endpoint is retried on the other, and gossip then drops the endpoint.
//
// A second router with another cluster key never learns an endpoint.
func TestRouterAcrossHosts(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 5, Link: 500 * netlab.Mbit, S3: true})
	bin, simBin := warmfleetBin(t), labBin(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	model, err := lab.S3().SeedModel(ctx, "models", "sim/", 1, 1<<20, 11)
	if err != nil {
		t.Fatal(err)
	}
	key := writeKey(t, "cluster.key")
	hosts := lab.Hosts()
	nodes, routerHost, peerHost := hosts[:3], hosts[3], hosts[4]
	seed := nodes[0].Addr(7946)
	var daemons []*netlab.Daemon
	var sims []*netlab.Process
	endpoint := map[string]string{} // host name -> endpoint URL
	for i, h := range nodes {
		pool := "warm"
		if i == 2 {
			pool = "cold"
		}
		d, err := h.StartDaemon(ctx, netlab.DaemonSpec{Bin: bin, Env: lab.S3().Env(), Args: []string{
			"--reserve", "0", "--reserve-fraction", "0", "--gossip", h.Addr(7946),
			"--join", seed, "--cluster-key-file", key, "--label", "pool=" + pool,
		}})
		if err != nil {
			t.Fatal(err)
		}
		daemons = append(daemons, d)
		sim, err := h.Start(netlab.ProcSpec{Name: "llmsim", Path: simBin, Args: []string{
			"llmsim", "--listen", h.Addr(8000), "--model", "sim", "--decode-per-token", "1ms"}})
		if err != nil {
			t.Fatal(err)
		}
		sims = append(sims, sim)
		endpoint[h.Name] = "http://" + h.Addr(8000)
		if _, err := d.CLI(ctx, "endpoint", "add", "--model", "sim", "--url", endpoint[h.Name]); err != nil {
			t.Fatal(err)
		}
	}
	startRouter := func(h *netlab.Host, name string, port int, keyFile string) (api, admin string) {
		api, admin = "http://"+h.Addr(port), "http://"+h.Addr(port+100)
		if _, err := h.Start(netlab.ProcSpec{Name: name, Path: bin, Args: []string{
			"router", "--listen", h.Addr(port), "--admin-listen", h.Addr(port + 100), "--peer-listen", h.Addr(port + 1000),
			"--gossip", h.Addr(port - 100), "--join", seed, "--cluster-key-file", keyFile, "--node-name", name,
		}}); err != nil {
			t.Fatal(err)
		}
		return api, admin
	}
	routerURL, adminURL := startRouter(routerHost, "router", 8080, key)
	strangerURL, _ := startRouter(routerHost, "stranger", 8081, writeKey(t, "other.key"))
	// A second replica on its own host: the two find each other through
	// gossip and stream their placements to each other.
	peerURL, peerAdminURL := startRouter(peerHost, "router-2", 8080, key)
	client := &http.Client{Transport: &http.Transport{DialContext: routerHost.NS.DialContext}, Timeout: 30 * time.Second}
	peerClient := &http.Client{Transport: &http.Transport{DialContext: peerHost.NS.DialContext}, Timeout: 30 * time.Second}

	// Every endpoint known, none ready: refused, not sent to a cold node.
	eventually(t, ctx, "three endpoints known, none ready", func() error {
		st, err := routerState(ctx, client, adminURL)
		if err != nil {
			return err
		}
		if len(st.Backends) != 3 {
			return fmt.Errorf("%d backends", len(st.Backends))
		}
		for _, b := range st.Backends {
			if b.Ready {
				return fmt.Errorf("%s ready before any cache", b.URL)
			}
		}
		return nil
	})
	if r, err := askRouter(ctx, client, routerURL, 0, 0); err != nil || r.status != http.StatusServiceUnavailable ||
		!strings.Contains(r.body, "no_backend") {
		t.Fatalf("before any cache: %+v, %v (want 503 no_backend)", r, err)
	}

	// Cache the model on the two warm nodes only.
	if _, err := daemons[0].CLI(ctx, "cache", "add", "sim", "--source", model.Source(), "--selector", "pool=warm"); err != nil {
		t.Fatal(err)
	}
	warm := map[string]bool{endpoint[nodes[0].Name]: true, endpoint[nodes[1].Name]: true}
	eventually(t, ctx, "the two warm endpoints ready in the router", func() error {
		st, err := routerState(ctx, client, adminURL)
		if err != nil {
			return err
		}
		for _, b := range st.Backends {
			if b.Ready != warm[b.URL] {
				return fmt.Errorf("%s ready=%v", b.URL, b.Ready)
			}
		}
		return nil
	})

	// Eight long prefixes, four questions each, interleaved; the rounds
	// alternate between the two replicas, each waiting until the other's
	// placements have reached it: a group placed through one is a hit
	// through the other.
	const docs, rounds = 8, 4
	replicas := []struct {
		api, admin string
		client     *http.Client
	}{{routerURL, adminURL, client}, {peerURL, peerAdminURL, peerClient}}
	indexed := func(i int) (int, error) {
		st, err := routerState(ctx, replicas[i].client, replicas[i].admin)
		n := 0
		for _, b := range st.Backends {
			n += b.IndexBlocks
		}
		return n, err
	}
	home := map[int]string{}
	used := map[string]int{}
	for q := range rounds {
		at := replicas[q%2]
		if q > 0 {
			eventually(t, ctx, fmt.Sprintf("round %d's placements at the other replica", q-1), func() error {
				here, err := indexed(q % 2)
				there, err2 := indexed(1 - q%2)
				if err != nil || err2 != nil || here != there {
					return fmt.Errorf("%d blocks indexed here, %d there (%v, %v)", here, there, err, err2)
				}
				return nil
			})
		}
		for doc := range docs {
			r, err := askRouter(ctx, at.client, at.api, doc, q)
			if err != nil || r.status != http.StatusOK {
				t.Fatalf("doc %d q %d: %+v, %v", doc, q, r, err)
			}
			if !warm[r.backend] {
				t.Fatalf("doc %d q %d went to %s, a node without the model", doc, q, r.backend)
			}
			if q == 0 {
				home[doc] = r.backend
			} else if r.backend != home[doc] || !strings.Contains(r.route, "reason=hit") {
				t.Fatalf("doc %d q %d (replica %d) left its backend %s: %s", doc, q, q%2, home[doc], r.route)
			}
			used[r.backend]++
		}
	}
	if len(used) != 2 {
		t.Fatalf("%d prefix groups all went to one backend: %v", docs, used)
	}

	// The stranger's gossip cannot be read by the cluster, nor the
	// cluster's by it: it knows no endpoint.
	if r, err := askRouter(ctx, client, strangerURL, 0, 0); err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("router with another key: %+v, %v (want 503)", r, err)
	}

	// Node 0 dies, inference server and daemon. Every request still gets
	// an answer; then gossip drops its endpoint.
	dead := endpoint[nodes[0].Name]
	for _, p := range []*netlab.Process{sims[0], daemons[0].Process} {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for doc := range docs {
		r, err := askRouter(ctx, client, routerURL, doc, rounds)
		if err != nil || r.status != http.StatusOK || r.backend == dead {
			t.Fatalf("doc %d after node 0 died: %+v, %v", doc, r, err)
		}
	}
	eventually(t, ctx, "the dead node's endpoint gone", func() error {
		st, err := routerState(ctx, client, adminURL)
		if err != nil {
			return err
		}
		for _, b := range st.Backends {
			if b.URL == dead {
				return fmt.Errorf("still listed: %+v", b)
			}
		}
		return nil
	})
}
