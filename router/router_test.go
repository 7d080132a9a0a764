package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/prefix"
)

type harness struct {
	rt       *Router
	srv      *httptest.Server
	reg      *prometheus.Registry
	src      *StaticSource
	handling sync.WaitGroup // requests the router is still handling
}

// settle waits until the router has finished every request a client has
// seen the answer to: it records a request's duration and time to first
// byte as its handler returns, which can be after the client has read the
// whole answer.
func (h *harness) settle() { h.handling.Wait() }

func newHarness(t *testing.T, cfg Config, opts Options, urls ...string) *harness {
	t.Helper()
	// No probes and no engine metrics reads: the test backends count and
	// answer only the requests a test sends.
	cfg.ProbeInterval, cfg.EngineMetricsInterval = -1, -1
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, BackendConfig{URL: u})
	}
	src := NewStaticSource(StaticEndpoints(&cfg), opts.Now)
	reg := prometheus.NewRegistry()
	opts.Source, opts.Registry = src, reg
	opts.HashKey = prefix.KeyFromBytes([]byte("test fleet"))
	rt, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = rt.Run(ctx); close(done) }()
	h := &harness{rt: rt, reg: reg, src: src}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.handling.Add(1)
		defer h.handling.Done()
		rt.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { h.srv.Close(); cancel(); <-done })
	return h
}

func post(t *testing.T, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type apiErr struct {
	Error struct {
		Message, Type, Code string
	}
}

func readErr(t *testing.T, resp *http.Response) apiErr {
	t.Helper()
	defer resp.Body.Close()
	var e apiErr
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("status %d: body is not an OpenAI error: %v", resp.StatusCode, err)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("incomplete error %+v", e)
	}
	return e
}

// TestStreamingPassthrough: SSE bytes arrive unchanged and each event is
// delivered before the backend writes the next (no added buffering).
func TestStreamingPassthrough(t *testing.T) {
	events := []string{"data: {\"choices\":[{\"text\":\"h\\u00e9\"}]}\n\n", ": keep-alive\r\n\r\n", "data: [DONE]\n\n"}
	next := make(chan struct{})
	var gotBody []byte
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotBody, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Backend", "b1")
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
			<-next
		}
	}))
	defer backend.Close()
	h := newHarness(t, Defaults(), Options{}, backend.URL)
	body := "{\"model\":\"m\",  \"stream\":true,\"prompt\":\"caf\\u00e9 \\\"q\\\"\",\n\"x\":[1,2.50]}"
	resp := post(t, h.srv.URL+"/v1/completions", body)
	defer resp.Body.Close()
	if resp.Header.Get("X-Backend") != "b1" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("headers not passed: %v", resp.Header)
	}
	var all []byte
	for _, e := range events {
		buf := make([]byte, len(e))
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatalf("reading event %q before the next was written: %v", e, err)
		}
		all = append(all, buf...)
		next <- struct{}{}
	}
	rest, _ := io.ReadAll(resp.Body)
	all = append(all, rest...)
	if string(all) != strings.Join(events, "") {
		t.Fatalf("stream changed:\n%q\nwant\n%q", all, strings.Join(events, ""))
	}
	if string(gotBody) != body {
		t.Fatalf("body changed: %q", gotBody)
	}
}

// deadURL is an address nothing listens on: port 1 (tcpmux) on a loopback
// address of its own, so a port freed by one test cannot be taken by another.
func deadURL(t *testing.T, i int) string {
	t.Helper()
	u := fmt.Sprintf("http://127.0.9.%d:1", i)
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(u, "http://"), time.Second); err == nil {
		c.Close()
		t.Skipf("something listens on %s", u)
	}
	return u
}

func okBackend(t *testing.T, name string, hits *atomic.Int64) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hits != nil {
			hits.Add(1)
		}
		w.Header().Set("X-Backend", name)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestRetryOnConnectError(t *testing.T) {
	live := okBackend(t, "live", nil)
	cfg := Defaults()
	cfg.Strategy = balance.Random
	// Rand 0 makes random pick the first candidate: the dead backend.
	h := newHarness(t, cfg, Options{Rand: func() uint64 { return 0 }}, deadURL(t, 1), live.URL)
	resp := post(t, h.srv.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, DebugRequestHeader, "1")
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Backend") != "live" {
		t.Fatalf("status %d backend %q", resp.StatusCode, resp.Header.Get("X-Backend"))
	}
	route := resp.Header.Get(RouteHeader)
	if !strings.Contains(route, "reason=retry") || !strings.Contains(route, "attempts=2") {
		t.Fatalf("route header %q", route)
	}
	if n := testutil.ToFloat64(h.rt.metrics.ejections); n != 1 {
		t.Fatalf("ejections %v, want 1", n)
	}
	// The dead backend is ejected now: the next request goes straight to the live one.
	resp = post(t, h.srv.URL+"/v1/chat/completions", `{"model":"m","messages":[]}`, DebugRequestHeader, "1")
	resp.Body.Close()
	if !strings.Contains(resp.Header.Get(RouteHeader), "attempts=1") {
		t.Fatalf("ejected backend tried again: %q", resp.Header.Get(RouteHeader))
	}
}

func TestAllBackendsDown(t *testing.T) {
	h := newHarness(t, Defaults(), Options{}, deadURL(t, 2), deadURL(t, 3))
	// Both attempts fail to connect; both backends are ejected, nothing is left.
	resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d", resp.StatusCode)
	}
	readErr(t, resp)
	resp = post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d retry-after %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	readErr(t, resp)
}

func TestQueueThen429(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "done")
	}))
	defer backend.Close()
	cfg := Defaults()
	cfg.MaxInflight = 1
	cfg.QueueTimeout = 30 * time.Second
	h := newHarness(t, cfg, Options{}, backend.URL)
	body := `{"model":"m","prompt":"x"}`
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Go(func() {
			resp := post(t, h.srv.URL+"/v1/completions", body)
			codes[i] = resp.StatusCode
			resp.Body.Close()
		})
		<-started // the second only starts once the first finished: it waited in the queue
		if i == 0 {
			waitQueued(t, h.rt, 0)
			go func() { waitQueued(t, h.rt, 1); release <- struct{}{} }()
		} else {
			release <- struct{}{}
		}
	}
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("codes %v", codes)
	}
	// With a short wait and the only backend busy: 429 with Retry-After.
	cfg.QueueTimeout = time.Millisecond
	if err := h.rt.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	go func() { resp := post(t, h.srv.URL+"/v1/completions", body); resp.Body.Close() }()
	<-started
	resp := post(t, h.srv.URL+"/v1/completions", body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d retry-after %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := readErr(t, resp); e.Error.Type != "rate_limit_error" {
		t.Fatalf("error %+v", e)
	}
	release <- struct{}{}
}

func waitQueued(t *testing.T, rt *Router, n int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d requests queued", n), func() bool { return rt.Snapshot().Queued == n })
}

func TestBadInput(t *testing.T) {
	var hits atomic.Int64
	b := okBackend(t, "b", &hits)
	cfg := Defaults()
	cfg.MaxBodyBytes = 1024
	h := newHarness(t, cfg, Options{}, b.URL)
	tests := []struct {
		name, path, method, body string
		status                   int
		code                     string
	}{
		{"invalid json", "/v1/chat/completions", "POST", `{"model":"m",`, 400, "invalid_request"},
		{"wrong type", "/v1/chat/completions", "POST", `{"model":"m","messages":"hi"}`, 400, "invalid_request"},
		{"missing model", "/v1/completions", "POST", `{"prompt":"x"}`, 400, "missing_model"},
		{"empty body", "/v1/completions", "POST", ``, 400, "invalid_request"},
		{"oversize", "/v1/completions", "POST", `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "request_too_large"},
		{"oversize passthrough", "/v1/embeddings", "POST", strings.Repeat("x", 2000), 413, "request_too_large"},
		{"get completions", "/v1/completions", "GET", ``, 405, "method_not_allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, h.srv.URL+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if e := readErr(t, resp); e.Error.Code != tc.code {
				t.Fatalf("code %q, want %q", e.Error.Code, tc.code)
			}
		})
	}
	// A chunked oversize body (no Content-Length) is cut off too.
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, `{"model":"m","prompt":"`+strings.Repeat("y", 4096))
		pw.Close()
	}()
	resp, err := http.Post(h.srv.URL+"/v1/completions", "application/json", pr)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 413 {
		t.Fatalf("chunked oversize: %d", resp.StatusCode)
	}
	resp.Body.Close()
	if hits.Load() != 0 {
		t.Fatalf("bad requests reached the backend %d times", hits.Load())
	}
}

// TestPrefixAffinity: requests sharing a long document go to one backend;
// different documents spread over several.
func TestPrefixAffinity(t *testing.T) {
	var urls []string
	for i := range 4 {
		urls = append(urls, okBackend(t, fmt.Sprint("b", i), nil).URL)
	}
	h := newHarness(t, Defaults(), Options{}, urls...)
	byDoc := map[int]map[string]int{}
	used := map[string]bool{}
	for q := range 6 {
		for doc := range 12 {
			text := strings.Repeat(fmt.Sprintf("document %d says something long. ", doc), 200)
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, text, q)
			resp := post(t, h.srv.URL+"/v1/chat/completions", body, DebugRequestHeader, "1")
			resp.Body.Close()
			name := resp.Header.Get("X-Backend")
			if byDoc[doc] == nil {
				byDoc[doc] = map[string]int{}
			}
			byDoc[doc][name]++
			used[name] = true
			if q > 0 && !strings.Contains(resp.Header.Get(RouteHeader), "reason=hit") {
				t.Fatalf("doc %d q %d: %s", doc, q, resp.Header.Get(RouteHeader))
			}
		}
	}
	for doc, m := range byDoc {
		if len(m) != 1 {
			t.Fatalf("doc %d spread over %v", doc, m)
		}
	}
	if len(used) < 3 {
		t.Fatalf("12 documents used only %d of 4 backends", len(used))
	}
	if v := testutil.ToFloat64(h.rt.metrics.decisions.WithLabelValues(string(Defaults().Strategy), "hit", "other")); v != 60 {
		t.Fatalf("hit decisions %v, want 60", v)
	}
}

// TestReplicasAgreeByID: two routers that reach the same backends by
// different URLs send each new prefix group to the same backend when the
// backends carry the same IDs: rendezvous hashes the ID, not the address.
func TestReplicasAgreeByID(t *testing.T) {
	var byIP, byName []BackendConfig
	for i := range 4 {
		u := okBackend(t, fmt.Sprint("b", i), nil).URL
		id := fmt.Sprint("gpu-", i)
		byIP = append(byIP, BackendConfig{URL: u, ID: id})
		byName = append(byName, BackendConfig{URL: strings.Replace(u, "127.0.0.1", "localhost", 1), ID: id})
	}
	pick := func(backends []BackendConfig) []string {
		cfg := Defaults()
		cfg.Backends = backends
		h := newHarness(t, cfg, Options{})
		var names []string
		for doc := range 16 {
			text := strings.Repeat(fmt.Sprintf("document %d says something long. ", doc), 50)
			resp := post(t, h.srv.URL+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q}`, text))
			resp.Body.Close()
			names = append(names, resp.Header.Get("X-Backend"))
		}
		return names
	}
	a, b := pick(byIP), pick(byName)
	if !slices.Equal(a, b) {
		t.Fatalf("replicas disagree:\n%v\n%v", a, b)
	}
	if used := len(slices.Compact(slices.Sorted(slices.Values(a)))); used < 2 {
		t.Fatalf("16 groups went to %d backend(s): %v", used, a)
	}
}

// TestHotPromptDoesNotPin: with the load, wait and traffic bounds relaxed
// (a cache-first setup), a system prompt every request starts with makes
// the first backend that saw it look like the best place for every request,
// unless hot_share treats the prompt as common once it is in most requests.
func TestHotPromptDoesNotPin(t *testing.T) {
	var urls []string
	for i := range 4 {
		urls = append(urls, okBackend(t, fmt.Sprint("b", i), nil).URL)
	}
	system := strings.Repeat("You are a helpful assistant who answers at length. ", 200)
	for _, tc := range []struct {
		hot     float64
		minUsed int
		maxUsed int
	}{{hot: 0, minUsed: 1, maxUsed: 1}, {hot: 1, minUsed: 3, maxUsed: 4}} {
		cfg := Defaults()
		cfg.Strategy = balance.PrefixAware // its hot_share rule
		cfg.LoadFactor, cfg.Slack, cfg.BalanceSlack, cfg.ShareFactor, cfg.HotShare = 100, 100, 100, 100, tc.hot
		h := newHarness(t, cfg, Options{}, urls...)
		// Every backend has served something else first: a backend
		// holding nothing does not make the prompt distinctive.
		seen := map[string]bool{}
		for q := 0; len(seen) < len(urls); q++ {
			resp := post(t, h.srv.URL+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat(fmt.Sprintf("warm-up %d. ", q), 100)))
			resp.Body.Close()
			seen[resp.Header.Get("X-Backend")] = true
			if q > 100 {
				t.Fatalf("warm-up reached only %v", seen)
			}
		}
		used := map[string]int{}
		for q := range 32 {
			user := strings.Repeat(fmt.Sprintf("question %d about something else entirely. ", q), 40)
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
			resp := post(t, h.srv.URL+"/v1/chat/completions", body)
			resp.Body.Close()
			used[resp.Header.Get("X-Backend")]++
		}
		if len(used) < tc.minUsed || len(used) > tc.maxUsed {
			t.Errorf("hot_share %v: 32 requests went to %v, want %d-%d backends", tc.hot, used, tc.minUsed, tc.maxUsed)
		}
	}
}

// TestEmptyBackendsTakeASharedPrompt: on fresh backends, requests that
// share a system prompt but nothing else are cold while some backend holds
// nothing: the prompt is not a reason to prefer the backends that saw it
// first (one backend sat idle for seconds of the multi-turn workload when
// it was), and the requests spread over the fleet.
func TestEmptyBackendsTakeASharedPrompt(t *testing.T) {
	var urls []string
	for i := range 4 {
		urls = append(urls, okBackend(t, fmt.Sprint("b", i), nil).URL)
	}
	system := strings.Repeat("You are a helpful assistant who answers at length. ", 40)
	h := newHarness(t, Defaults(), Options{}, urls...)
	used := map[string]bool{}
	for q := range 4 {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, fmt.Sprintf("question %d", q))
		got, err := h.rt.Route(t.Context(), []byte(body), "")
		if err != nil {
			t.Fatal(err)
		}
		if got.Reason != balance.Cold {
			t.Errorf("request %d: %+v, want cold while a backend holds nothing", q, got)
		}
		used[got.Backend] = true
	}
	if len(used) != len(urls) {
		t.Errorf("4 requests sharing a system prompt went to %v, want one per backend", used)
	}
}

func TestStrategySwitchAndAdmin(t *testing.T) {
	b := okBackend(t, "b", nil)
	h := newHarness(t, Defaults(), Options{}, b.URL)
	admin := httptest.NewServer(h.rt.AdminHandler(h.reg, nil, ""))
	defer admin.Close()
	req, _ := http.NewRequest(http.MethodPut, admin.URL+"/admin/strategy", strings.NewReader(`{"model":"m2","strategy":"least-outstanding"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("put strategy: %v %v", err, resp)
	}
	req, _ = http.NewRequest(http.MethodPut, admin.URL+"/admin/strategy", strings.NewReader(`{"strategy":"round-robin"}`))
	if resp, _ := http.DefaultClient.Do(req); resp.StatusCode != 400 {
		t.Fatalf("bad strategy accepted: %d", resp.StatusCode)
	}
	for _, m := range []string{"m1", "m2"} {
		post(t, h.srv.URL+"/v1/completions", `{"model":"`+m+`","prompt":"hello"}`).Body.Close()
	}
	h.settle()
	if testutil.ToFloat64(h.rt.metrics.decisions.WithLabelValues("least-outstanding", "least", "m2")) != 1 ||
		testutil.ToFloat64(h.rt.metrics.decisions.WithLabelValues(string(Defaults().Strategy), "cold", "other")) != 1 {
		t.Fatal("per-model strategy not applied")
	}
	resp, err = http.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"warmfleet_router_decisions_total", "warmfleet_router_decision_seconds", "warmfleet_router_ttfb_seconds",
		"warmfleet_router_backend_inflight", "warmfleet_router_cached_prefix_ratio", "warmfleet_router_request_duration_seconds"} {
		if !bytes.Contains(m, []byte(name)) {
			t.Errorf("metric %s missing", name)
		}
	}
	if bytes.Contains(m, []byte("hello")) {
		t.Error("prompt text leaked into metrics")
	}
	resp, _ = http.Get(admin.URL + "/admin/state")
	var st State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Backends) != 1 || st.Models["m2"] != balance.LeastOutstanding {
		t.Fatalf("state %+v %v", st, err)
	}
}

func TestModelsAndPassthrough(t *testing.T) {
	mk := func(ids ...string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/models":
				var data []string
				for _, id := range ids {
					data = append(data, fmt.Sprintf(`{"id":%q,"object":"model"}`, id))
				}
				fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(data, ","))
			default:
				b, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "%s %s?%s %s", r.Method, r.URL.Path, r.URL.RawQuery, b)
			}
		}))
		t.Cleanup(s.Close)
		return s
	}
	h := newHarness(t, Defaults(), Options{}, mk("a", "b").URL, mk("b", "c").URL, deadURL(t, 4))
	resp, err := http.Get(h.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string }
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 3 {
		t.Fatalf("models %+v", list)
	}
	resp = post(t, h.srv.URL+"/v1/embeddings?x=1", `{"model":"a","input":"q"}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != `POST /v1/embeddings?x=1 {"model":"a","input":"q"}` {
		t.Fatalf("passthrough got %q", b)
	}
}

func TestProbesEjectAndReadmit(t *testing.T) {
	var healthy atomic.Bool
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/metrics":
			_, _ = io.WriteString(w, "# HELP x\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1.0\n")
		case !healthy.Load():
			w.WriteHeader(500)
		}
	}))
	defer b.Close()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := newHarness(t, Defaults(), Options{Now: clock}, b.URL)
	h.rt.ProbeOnce(context.Background())
	if st := h.rt.Snapshot().Backends[0]; st.EjectedUntil.IsZero() || st.Failures != 1 {
		t.Fatalf("failing probe did not eject: %+v", st)
	}
	resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != 503 {
		t.Fatalf("ejected backend used: %d", resp.StatusCode)
	}
	resp.Body.Close()
	healthy.Store(true)
	h.rt.ProbeOnce(context.Background()) // still inside the backoff: probes anyway, readmits on success
	st := h.rt.Snapshot().Backends[0]
	if !st.EjectedUntil.IsZero() || st.Failures != 0 {
		t.Fatalf("passing probe did not readmit: %+v", st)
	}
	if want := 16000 * 4 / 256; st.IndexCap != want {
		t.Fatalf("index capacity %d, want %d learned from vllm:cache_config_info", st.IndexCap, want)
	}
}

func TestRampUp(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	cfg := Defaults()
	cfg.RampUp = 100 * time.Second
	a, b := okBackend(t, "a", nil), okBackend(t, "b", nil)
	h := newHarness(t, cfg, Options{Now: clock}, a.URL)
	eps, _ := h.src.Endpoints()
	h.src.Set(append(eps, Endpoint{URL: b.URL, Ready: true, HoldsWeights: true}))
	weightOf := func(u string) float64 {
		var w float64
		// The follower applies the change asynchronously.
		wait.For(t, "backend "+u+" listed", func() bool {
			for _, s := range h.rt.Snapshot().Backends {
				if s.URL == u {
					w = s.Weight
					return true
				}
			}
			return false
		})
		return w
	}
	if w := weightOf(b.URL); w != 0.05 {
		t.Fatalf("new endpoint weight %v, want the 0.05 floor", w)
	}
	mu.Lock()
	now = now.Add(50 * time.Second)
	mu.Unlock()
	if w := weightOf(b.URL); w != 0.5 {
		t.Fatalf("half-way weight %v", w)
	}
	if w := weightOf(a.URL); w != 1 {
		t.Fatalf("settled weight %v", w)
	}
}

func TestConfigParse(t *testing.T) {
	cfg := Defaults()
	good := "strategy: least-outstanding\nload_factor: 1.5\nqueue_timeout: 3s\nmodels:\n  llama: {strategy: random}\nbackends:\n  - url: http://127.0.0.1:8000/\n    models: [llama]\n    max_inflight: 8\n"
	if err := ParseConfig([]byte(good), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.StrategyFor("llama") != balance.Random || cfg.StrategyFor("x") != balance.LeastOutstanding || cfg.QueueTimeout != 3*time.Second {
		t.Fatalf("parsed %+v", cfg)
	}
	if eps := StaticEndpoints(&cfg); len(eps) != 1 || eps[0].URL != "http://127.0.0.1:8000" || !eps[0].HoldsWeights {
		t.Fatalf("endpoints %+v", eps)
	}
	fast := Defaults()
	if err := ParseConfig([]byte("backends:\n  - {url: http://a, speed: 2.5}\n  - url: http://b\n"), &fast); err != nil {
		t.Fatal(err)
	}
	if eps := StaticEndpoints(&fast); len(eps) != 2 || eps[0].Speed != 2.5 || eps[1].Speed != 0 {
		t.Fatalf("speeds: endpoints %+v", eps)
	}
	seqs := Defaults()
	if err := ParseConfig([]byte("max_num_seqs: 4\nbackends:\n  - {url: http://a, max_num_seqs: 8}\n  - url: http://b\n"), &seqs); err != nil {
		t.Fatal(err)
	}
	if eps := StaticEndpoints(&seqs); seqs.MaxNumSeqs != 4 || len(eps) != 2 || eps[0].MaxNumSeqs != 8 || eps[1].MaxNumSeqs != 0 {
		t.Fatalf("max_num_seqs: %d, endpoints %+v", seqs.MaxNumSeqs, eps)
	}
	for _, bad := range []string{"strategy: fastest\n", "max_num_seqs: -1\n", "backends:\n  - {url: http://a, max_num_seqs: -2}\n", "load_factor: 0.5\n", "unknown_key: 1\n", "backends:\n  - url: ftp://x\n",
		"backends:\n  - url: http://a\n  - url: http://a/\n", "block_chars: 1\n", "queue_timeout: soon\n",
		"share_factor: 0.5\n", "share_half_life: 0\n", "decode_weight: 2\n", "decode_weight: 0\n", "eject_5xx: -1\n", "hot_share: -1\n", "hot_share: .nan\n",
		// NaN and infinities pass a plain "< bound" check; each float is checked as "inside".
		"load_factor: .nan\n", "load_factor: .inf\n", "load_factor: 1e308\n", "slack: .nan\n", "balance_slack: .nan\n", "decode_weight: .nan\n",
		"share_factor: .nan\n", "chars_per_token: .nan\n", "chars_per_token: .inf\n", "chars_per_token: -1\n",
		"backends:\n  - {url: http://a, id: x}\n  - {url: http://b, id: x}\n", "backends:\n  - url: http://a\n  - {url: http://b, id: \"http://a\"}\n",
		"cache_threshold: 0\n", "cache_threshold: 1.5\n", "cache_threshold: .nan\n", "balance_abs_threshold: 0\n", "balance_rel_threshold: 0.5\n",
		"balance_rel_threshold: .nan\n", "strategy: sglang\n",
		"backends:\n  - {url: http://a, speed: -1}\n", "backends:\n  - {url: http://a, speed: .nan}\n", "backends:\n  - {url: http://a, speed: .inf}\n",
		"backends:\n  - {url: http://a, speed: 100}\n", "backends:\n  - {url: http://a, speed: 0.001}\n"} {
		c := Defaults()
		if err := ParseConfig([]byte(bad), &c); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	c := Defaults()
	if err := ParseConfig([]byte("backends:\n  - url: http://a\n  - url: http://a/\n"), &c); err == nil || strings.Contains(err.Error(), "duplicate id") {
		t.Errorf("a duplicate url without ids: %v, want one duplicate url error", err)
	}
	c = Defaults()
	if err := ParseConfig([]byte("strategy: cache-aware\ncache_threshold: 0.3\nbalance_abs_threshold: 64\nbalance_rel_threshold: 1.5\nmodels:\n  chat: {strategy: session}\n"), &c); err != nil ||
		c.CacheThreshold != 0.3 || c.BalanceAbsThreshold != 64 || c.BalanceRelThreshold != 1.5 || c.StrategyFor("chat") != balance.Session {
		t.Fatalf("cache-aware keys: %+v, %v", c, err)
	}
	c = Defaults()
	if err := ParseConfig(nil, &c); err != nil {
		t.Fatalf("empty config: %v", err)
	}
}

func TestParseKVCacheTokens(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\",gpu_memory_utilization=\"0.9\"} 1.0\n", 32768},
		{"# comment\nother 1\nvllm:cache_config_info{num_gpu_blocks=\"10\", block_size=\"32\"} 1\n", 320},
		{"vllm:cache_config_info{block_size=\"16\"} 1\n", 0},
		{"vllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"5\"} 1\n", 0},
		{"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"5\"", 0},
		{"", 0},
		// Quoted commas and braces are part of a label value, not separators.
		{"vllm:cache_config_info{num_gpu_blocks=\"10\",note=\"x,num_gpu_blocks=7\",block_size=\"16\"} 1\n", 160},
		{"vllm:cache_config_info{note=\"}\",num_gpu_blocks=\"10\",block_size=\"16\"} 1\n", 160},
	}
	for _, tc := range tests {
		if got := ParseKVCacheTokens(strings.NewReader(tc.in)); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.in, got, tc.want)
		}
	}
}

func FuzzParseKVCacheTokens(f *testing.F) {
	f.Add("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\"} 1.0\n")
	f.Add("vllm:cache_config_info{num_gpu_blocks=\"1073741824\",block_size=\"1073741824\"} 1\n")
	f.Fuzz(func(t *testing.T, in string) {
		if n := ParseKVCacheTokens(bufio.NewReader(strings.NewReader(in))); n < 0 || n > 1<<40 {
			t.Fatalf("implausible size %d", n)
		}
	})
}

func TestStaticSourceRampStarts(t *testing.T) {
	now := time.Unix(500, 0)
	src := NewStaticSource([]Endpoint{{URL: "http://a", Ready: true}, {URL: "http://b"}}, func() time.Time { return now })
	src.Set([]Endpoint{{URL: "http://a", Ready: true}, {URL: "http://b", Ready: true}, {URL: "http://c", Ready: true}})
	eps, _ := src.Endpoints()
	if !eps[0].ReadySince.IsZero() || !eps[1].ReadySince.Equal(now) || !eps[2].ReadySince.Equal(now) {
		t.Fatalf("ramp starts: %+v", eps)
	}
}

// TestEjectOn5xxBurst: a backend that answers but fails every request is
// ejected after Eject5xx consecutive 5xx answers; a success in between
// resets the count, and 501 does not count.
func TestEjectOn5xxBurst(t *testing.T) {
	tests := []struct {
		name     string
		statuses []int
		ejected  bool
	}{
		{name: "burst of 500s ejects", statuses: []int{500, 502, 503}, ejected: true},
		{name: "a success resets the run", statuses: []int{500, 500, 200, 500, 500}, ejected: false},
		{name: "4xx is the caller's fault", statuses: []int{400, 404, 429, 400}, ejected: false},
		{name: "501 says nothing about health", statuses: []int{501, 501, 501}, ejected: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var next atomic.Int32
			b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := int(next.Add(1)) - 1
				w.WriteHeader(tc.statuses[min(i, len(tc.statuses)-1)])
			}))
			defer b.Close()
			cfg := Defaults()
			cfg.Eject5xx = 3
			h := newHarness(t, cfg, Options{}, b.URL)
			for i, want := range tc.statuses {
				resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("request %d: status %d, want the backend's %d passed through", i, resp.StatusCode, want)
				}
			}
			st := h.rt.Snapshot().Backends[0]
			if got := !st.EjectedUntil.IsZero(); got != tc.ejected {
				t.Fatalf("ejected %v, want %v (%+v)", got, tc.ejected, st)
			}
			resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
			resp.Body.Close()
			if tc.ejected && resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("ejected backend still used: %d", resp.StatusCode)
			}
		})
	}
}

// TestLoadSignals: a request counts as prefilling (with its uncached blocks
// pending) until its first byte, then only as in flight; every decision adds
// to the backend's recent traffic.
func TestLoadSignals(t *testing.T) {
	release, first := make(chan struct{}), make(chan struct{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-release
		_, _ = io.WriteString(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		<-first
	}))
	defer b.Close()
	h := newHarness(t, Defaults(), Options{}, b.URL)
	prompt := strings.Repeat("x", 4*256)
	done := make(chan *http.Response)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"`+prompt+`"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	wait.For(t, "one request in flight", func() bool { return h.rt.Snapshot().Backends[0].Inflight == 1 })
	st := h.rt.Snapshot().Backends[0]
	if st.Prefilling != 1 || st.PendingBlock != 4 || st.Recent != 1 {
		t.Fatalf("before the first byte: %+v, want 1 prefilling, 4 pending blocks, recent 1", st)
	}
	close(release)
	resp := <-done
	buf := make([]byte, 3)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	st = h.rt.Snapshot().Backends[0]
	if st.Prefilling != 0 || st.PendingBlock != 0 || st.Inflight != 1 {
		t.Fatalf("after the first byte: %+v, want decoding only", st)
	}
	close(first)
	resp.Body.Close()
	wait.For(t, "no request in flight", func() bool { return h.rt.Snapshot().Backends[0].Inflight == 0 })
}

// TestConcurrentBodiesIntact sends many distinct bodies of several sizes
// concurrently; the backend checks each against what the client sent (the
// request path shares pooled key buffers and the transport's write buffer).
func TestConcurrentBodiesIntact(t *testing.T) {
	var bad atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if fmt.Sprint(len(b), ":", string(b[len(b)-40:])) != r.Header.Get("X-Want") {
			bad.Add(1)
		}
		_, _ = io.WriteString(w, "{}")
	}))
	defer backend.Close()
	h := newHarness(t, Defaults(), Options{}, backend.URL, okBackend(t, "other", nil).URL)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 {
				size := 3000 + (g*40+i)*97%20000 // across several size classes
				prompt := fmt.Sprintf("%0*d", size, g*1000+i)
				body := `{"model":"m","prompt":"` + prompt + `"}`
				resp := post(t, h.srv.URL+"/v1/completions", body, "X-Want", fmt.Sprint(len(body), ":", body[len(body)-40:]))
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d bodies arrived changed", n)
	}
}

// TestOverflowNamesTheBound: the backend holding a prompt is at its own
// limit, or has its engine's only sequence slot busy, so the repeat goes
// elsewhere, and the header and the metric say which rule made it yield.
func TestOverflowNamesTheBound(t *testing.T) {
	for _, tc := range []struct {
		bound string
		set   func(*Config)
	}{
		{"limit", func(c *Config) { c.MaxInflight = 1 }},
		{"slots", func(c *Config) { c.MaxNumSeqs = 1 }},
	} {
		t.Run(tc.bound, func(t *testing.T) {
			release := make(chan struct{})
			started := make(chan struct{}, 2)
			var backends []string
			for range 2 {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					started <- struct{}{}
					<-release
					_, _ = io.WriteString(w, "done")
				}))
				defer srv.Close()
				backends = append(backends, srv.URL)
			}
			cfg := Defaults()
			cfg.Strategy = balance.PrefixAware // its bounds' names
			tc.set(&cfg)
			h := newHarness(t, cfg, Options{}, backends...)
			body := fmt.Sprintf(`{"model":"m","prompt":%q}`, strings.Repeat("the same long document. ", 100))
			done := make(chan string)
			send := func() {
				resp := post(t, h.srv.URL+"/v1/completions", body, DebugRequestHeader, "1")
				resp.Body.Close()
				done <- resp.Header.Get(RouteHeader)
			}
			go send()
			<-started // the first holds its backend's only slot
			go send()
			<-started
			release <- struct{}{}
			release <- struct{}{}
			routes := []string{<-done, <-done}
			overflowed := 0
			for _, r := range routes {
				if strings.Contains(r, "reason=overflow") {
					overflowed++
					if !strings.Contains(r, "yielded="+tc.bound) {
						t.Fatalf("overflow without its bound: %s", r)
					}
				}
			}
			if overflowed != 1 {
				t.Fatalf("want one overflow, got routes %q", routes)
			}
			if v := testutil.ToFloat64(h.rt.metrics.overflows.WithLabelValues("prefix-aware", tc.bound, "other")); v != 1 {
				t.Fatalf("overflows{bound=%s} = %v, want 1", tc.bound, v)
			}
		})
	}
}

// FuzzParseConfig: any bytes give a config or an error, never a panic; an
// accepted config has every float finite and in its range, validates again,
// and lists backends by URLs that are already normal.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("strategy: random\nload_factor: 2\nslack: 30\nhot_share: 0.25\nbackends:\n  - url: http://127.0.0.1:8000/\n"))
	f.Add([]byte("load_factor: .nan\n"))
	f.Add([]byte("chars_per_token: .inf\nbackends:\n  - {url: https://a/b, id: x, models: [m]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := Defaults()
		if ParseConfig(data, &cfg) != nil {
			return
		}
		for name, x := range map[string]float64{"load_factor": cfg.LoadFactor, "slack": cfg.Slack, "balance_slack": cfg.BalanceSlack,
			"decode_weight": cfg.DecodeWeight, "share_factor": cfg.ShareFactor, "hot_share": cfg.HotShare, "chars_per_token": cfg.CharsPerToken,
			"self_tuning_share_factor": cfg.TuneShareFactor} {
			if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 || x > 1000 {
				t.Fatalf("accepted %s = %v", name, x)
			}
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted, then invalid: %v", err)
		}
		for _, ep := range StaticEndpoints(&cfg) {
			if u, err := ParseBackendURL(ep.URL); err != nil || u != ep.URL {
				t.Fatalf("endpoint URL %q not normal: %q, %v", ep.URL, u, err)
			}
		}
	})
}

// FuzzParseBackendURL: a URL is accepted as http(s) with a host and no
// query, fragment or credentials, and its normal form is a fixed point.
func FuzzParseBackendURL(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:8000/", "https://a.b/base//", "ftp://x", "http://u:p@h", "http://h/?q=1", "http://[::1]:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseBackendURL(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			t.Fatalf("%q normalised to %q", s, u)
		}
		if again, err := ParseBackendURL(u); err != nil || again != u {
			t.Fatalf("%q -> %q -> %q, %v", s, u, again, err)
		}
	})
}

// TestParseRoute: what explain writes, ParseRoute reads back.
func TestParseRoute(t *testing.T) {
	r := routed{b: &backend{url: "http://10.0.0.1:8000"}, decision: balance.Decision{Reason: balance.Overflow, Matched: 3, Yielded: balance.BoundShare},
		blocks: 9, common: 1, bound: 4, inflight: 2, eligible: 8, prefMatched: 7}
	got := ParseRoute((&Router{}).explain(r, 2))
	want := map[string]string{"backend": "http://10.0.0.1:8000", "reason": "overflow", "matched": "3/9", "common": "1", "bound": "4",
		"inflight": "2", "share": "0.00", "eligible": "8", "attempts": "2", "preferred_matched": "7", "yielded": "share"}
	if !maps.Equal(got, want) {
		t.Fatalf("ParseRoute = %v\nwant %v", got, want)
	}
	if got := ParseRoute(""); len(got) != 0 {
		t.Fatalf("empty explanation: %v", got)
	}
}
