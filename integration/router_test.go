package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
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

// adminToken is the bearer token the tests' routers on lab hosts require on
// their admin listener: one reachable from other hosts needs one.
const adminToken = "integration-admin-token-0123456789"

// adminTokenFile writes adminToken to a file for --admin-token-file.
func adminTokenFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(path, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// routerState reads a router's /admin/state, with adminToken (a router
// without a token ignores it).
func routerState(ctx context.Context, c *http.Client, adminURL string) (router.State, error) {
	var st router.State
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/admin/state", nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
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
	tokenFile := adminTokenFile(t)
	startRouter := func(h *netlab.Host, name string, port int, keyFile string) (api, admin string) {
		api, admin = "http://"+h.Addr(port), "http://"+h.Addr(port+100)
		if _, err := h.Start(netlab.ProcSpec{Name: name, Path: bin, Args: []string{
			"router", "--listen", h.Addr(port), "--admin-listen", h.Addr(port + 100), "--admin-token-file", tokenFile, "--peer-listen", h.Addr(port + 1000),
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
	wait.Err(t, "three endpoints known, none ready", func() error {
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
	}, wait.Context(ctx))
	if r, err := askRouter(ctx, client, routerURL, 0, 0); err != nil || r.status != http.StatusServiceUnavailable ||
		!strings.Contains(r.body, "no_backend") || !strings.Contains(r.body, "is ready: 3 known, all still loading the model") {
		t.Fatalf("before any cache: %+v, %v (want 503 no_backend saying no endpoint is ready)", r, err)
	}

	// Cache the model on the two warm nodes only.
	if _, err := daemons[0].CLI(ctx, "cache", "add", "sim", "--source", model.Source(), "--selector", "pool=warm"); err != nil {
		t.Fatal(err)
	}
	warm := map[string]bool{endpoint[nodes[0].Name]: true, endpoint[nodes[1].Name]: true}
	wait.Err(t, "the two warm endpoints ready in the router", func() error {
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
	}, wait.Context(ctx))

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
			wait.Err(t, fmt.Sprintf("round %d's placements at the other replica", q-1), func() error {
				here, err := indexed(q % 2)
				there, err2 := indexed(1 - q%2)
				if err != nil || err2 != nil || here != there {
					return fmt.Errorf("%d blocks indexed here, %d there (%v, %v)", here, there, err, err2)
				}
				return nil
			}, wait.Context(ctx))
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
	wait.Err(t, "the dead node's endpoint gone", func() error {
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
	}, wait.Context(ctx))
}

// proc is a warmfleet process started by a test, on loopback.
type proc struct {
	cmd   *exec.Cmd
	addrs chan string // each "listening" address it logs, in order
}

// startWarmfleet runs `warmfleet ARGS` until the test ends and returns it
// once it has logged want listening addresses.
func startWarmfleet(t *testing.T, bin string, want int, args ...string) (*proc, []string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, addrs: make(chan string, 8)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var log syncLog
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			log.add(line)
			if _, rest, ok := strings.Cut(line, ` addr=`); ok && strings.Contains(line, "listening") {
				p.addrs <- strings.Fields(rest)[0]
			}
		}
		close(p.addrs)
	}()
	var addrs []string
	started := time.NewTimer(time.Minute)
	defer started.Stop()
	for len(addrs) < want {
		select {
		case <-started.C:
			t.Fatalf("warmfleet %v did not listen within a minute:\n%s", args, log.String())
		case a, ok := <-p.addrs:
			if !ok {
				t.Fatalf("warmfleet %v exited before listening:\n%s", args, log.String())
			}
			addrs = append(addrs, "http://"+a)
		case <-t.Context().Done():
			t.Fatal("test ended before warmfleet listened")
		}
	}
	return p, addrs
}

type syncLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *syncLog) add(s string) { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }
func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// startRouter runs a router over backends with the YAML config extra and
// returns its API and admin URLs.
func startRouter(t *testing.T, bin, extra string, backends ...string) (api, admin string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(cfg, []byte(extra), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"router", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--config", cfg, "--strategy", "random"}
	for _, b := range backends {
		args = append(args, "--backend", b)
	}
	_, addrs := startWarmfleet(t, bin, 2, args...)
	return addrs[0], addrs[1]
}

// metric reads one series' value from a router's admin /metrics (0 if absent).
func metric(t *testing.T, admin, series string) float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	return 0
}

func streamRequest(t *testing.T, url string, maxTokens int) *http.Request {
	t.Helper()
	body := fmt.Sprintf(`{"model":"sim","stream":true,"max_tokens":%d,"prompt":"tell a long story"}`, maxTokens)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(router.DebugRequestHeader, "1")
	return req
}

// TestRouterBackendDiesMidStream kills a real engine process in the middle
// of a streamed answer: the client must see a broken stream (an error
// event, then a connection that does not end cleanly), never a complete
// 200, and the router counts the backend's failure.
func TestRouterBackendDiesMidStream(t *testing.T) {
	bin := warmfleetBin(t)
	sim, simAddr := startWarmfleet(t, labBin(t), 1, "llmsim", "--listen", "127.0.0.1:0", "--decode-per-token", "20ms")
	api, admin := startRouter(t, bin, "probe_interval: -1s\n", simAddr[0])

	resp, err := http.DefaultClient.Do(streamRequest(t, api, 2000))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if first, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(first, "data: {") {
		t.Fatalf("first line %q, %v", first, err)
	}
	if err := sim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err == nil {
		t.Fatalf("the stream ended cleanly after the backend died (status %d, %d more bytes, [DONE]: %v)",
			resp.StatusCode, len(rest), strings.Contains(string(rest), "[DONE]"))
	}
	if strings.Contains(string(rest), "[DONE]") || !strings.Contains(string(rest), `data: {"error":`) {
		t.Fatalf("want an error event and no [DONE] before the break; got tail %q", tail(string(rest), 300))
	}
	wait.For(t, "the router to count the backend's failure", func() bool {
		return metric(t, admin, fmt.Sprintf(`warmfleet_router_backend_failures_total{backend=%q,kind="broken_stream"}`, simAddr[0])) == 1
	})
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// staller is a backend that answers its health checks (every GET) and
// accepts every POST without ever answering it.
type staller struct {
	url     string
	stalled atomic.Int64 // requests accepted and left unanswered
}

func startStaller(t *testing.T) *staller {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &staller{url: "http://" + l.Addr().String()}
	done := make(chan struct{})
	var conns sync.WaitGroup
	t.Cleanup(func() { close(done); l.Close(); conns.Wait() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				go func() { <-done; c.Close() }()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if req.Method == http.MethodPost {
						s.stalled.Add(1)
						<-done
						return
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") // probes pass
				}
			})
		}
	}()
	return s
}

// TestRouterStalledBackend puts a backend that accepts requests and never
// answers them (while its /health passes) beside a real engine: every
// request still completes, the ones that tried the stalled backend after
// its first-byte timeout, and the stalled backend is ejected.
func TestRouterStalledBackend(t *testing.T) {
	bin := warmfleetBin(t)
	_, simAddr := startWarmfleet(t, labBin(t), 1, "llmsim", "--listen", "127.0.0.1:0")
	st := startStaller(t)
	api, admin := startRouter(t, bin, "first_byte_timeout: 1s\nprobe_interval: 200ms\neject_base: 1m\neject_max: 1m\n", simAddr[0], st.url)
	client := &http.Client{Timeout: 30 * time.Second} // a request hanging this long has failed
	retried := 0
	wait.For(t, "a request to try the stalled backend", func() bool {
		resp, err := client.Do(streamRequest(t, api, 4))
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("status %d, err %v, body %q", resp.StatusCode, err, tail(string(b), 300))
		}
		if router.ParseRoute(resp.Header.Get(router.RouteHeader))["attempts"] == "2" {
			retried++
		}
		return st.stalled.Load() > 0
	})
	if retried != 1 {
		t.Fatalf("%d requests were retried, want the 1 that found the stalled backend", retried)
	}
	if n := metric(t, admin, fmt.Sprintf(`warmfleet_router_backend_failures_total{backend=%q,kind="first_byte_timeout"}`, st.url)); n != 1 {
		t.Fatalf("first-byte timeouts counted: %v, want 1", n)
	}
	// Probes pass but must not readmit it: more requests all go to the engine.
	for range 10 {
		resp, err := client.Do(streamRequest(t, api, 2))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := router.ParseRoute(resp.Header.Get(router.RouteHeader))["backend"]; got != simAddr[0] {
			t.Fatalf("request went to %s while the stalled backend was ejected", got)
		}
	}
}

// TestRouterSlowBodies trickles request bodies into a real router, one
// byte at a time: each is answered (408) within body_timeout, and beyond
// max_slow_bodies they are cut off as soon as they count as slow.
func TestRouterSlowBodies(t *testing.T) {
	bin := warmfleetBin(t)
	_, simAddr := startWarmfleet(t, labBin(t), 1, "llmsim", "--listen", "127.0.0.1:0")
	api, _ := startRouter(t, bin, "body_timeout: 4s\nmax_slow_bodies: 2\nprobe_interval: -1s\n", simAddr[0])
	const clients = 5
	codes := make(chan string, clients)
	for range clients {
		c, err := net.Dial("tcp", strings.TrimPrefix(api, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		answered := make(chan struct{})
		go func() { // a byte every 100ms, until answered
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-answered:
					return
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
		go func() {
			defer close(answered)
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // far beyond body_timeout: a hang
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				codes <- "no answer: " + err.Error()
				return
			}
			defer resp.Body.Close()
			var e struct{ Error struct{ Code string } }
			_ = json.NewDecoder(resp.Body).Decode(&e)
			codes <- fmt.Sprintf("%d %s close=%v", resp.StatusCode, e.Error.Code, resp.Close)
		}()
	}
	got := map[string]int{}
	for range clients {
		got[<-codes]++
	}
	want := map[string]int{"408 body_too_slow close=true": clients - 2, "408 body_timeout close=true": 2}
	if !maps.Equal(got, want) {
		t.Fatalf("answers %v, want %v", got, want)
	}
}
