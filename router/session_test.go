package router

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

// simFleet starts n llmsim engines and a router over them with strategy st.
func simFleet(t *testing.T, n int, st balance.Strategy) *harness {
	t.Helper()
	cfg := Defaults()
	cfg.Strategy = st
	return newHarness(t, cfg, Options{}, sims(t, n)...)
}

// sims starts n llmsim engines for the test and returns their URLs.
func sims(t *testing.T, n int) []string {
	t.Helper()
	var urls []string
	for range n {
		sim, err := llmsim.New(llmsim.Defaults(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(sim)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls
}

// routedTo sends body and returns the backend and reason the router names.
func routedTo(t *testing.T, h *harness, body string, hdr ...string) (backend, reason string) {
	t.Helper()
	resp := post(t, h.srv.URL+"/v1/chat/completions", body, append(hdr, DebugRequestHeader, "1")...)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	f := ParseRoute(resp.Header.Get(RouteHeader))
	return f["backend"], f["reason"]
}

func chat(user, text string) string {
	u := ""
	if user != "" {
		u = fmt.Sprintf(`"user":%q,`, user)
	}
	return fmt.Sprintf(`{"model":"sim","max_tokens":2,%s"messages":[{"role":"user","content":%q}]}`, u, text)
}

// TestSessionPins: under the session strategy every turn of a session, by
// the session header or by the body's user field, reaches the same real
// engine whatever its prompt, and sessions spread over the engines.
func TestSessionPins(t *testing.T) {
	h := simFleet(t, 4, balance.Session)
	used := map[string]bool{}
	// Sessions land by a keyed hash: 12 of them missed two of the four
	// engines about once in 150 runs. Past the 12 whose every turn is
	// checked, first turns go on until three engines are used (64
	// sessions fail to reach them about once in 10^18).
	for s := range 64 {
		if s >= 12 && len(used) >= 3 {
			break
		}
		turns := 4
		if s >= 12 {
			turns = 1
		}
		var first string
		for turn := range turns {
			text := strings.Repeat(fmt.Sprintf("turn %d of a conversation. ", turn*100+s), 40) // no shared prefix
			var got string
			if s%2 == 0 {
				got, _ = routedTo(t, h, chat("", text), "X-Session-Id", fmt.Sprint("session-", s))
			} else {
				got, _ = routedTo(t, h, chat(fmt.Sprint("user-", s), text))
			}
			if turn == 0 {
				first = got
			} else if got != first {
				t.Fatalf("session %d turn %d went to %s, turn 0 to %s", s, turn, got, first)
			}
		}
		used[first] = true
	}
	if len(used) < 3 {
		t.Fatalf("64 sessions used %d of 4 engines", len(used))
	}
}

// TestSessionWithinLoadBound: a session pinned to a backend moves on once
// that backend reaches its load bound, and comes back when it drains.
func TestSessionWithinLoadBound(t *testing.T) {
	h := simFleet(t, 4, balance.Session)
	sess := h.rt.sessionID("alice", "")
	req := func() *routeRequest { return &routeRequest{model: "sim", strategy: balance.Session, session: sess} }
	var held []routed
	for range 2 { // the minimum bound is 2: both stay pinned
		r, err := h.rt.acquire(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	pinned := held[0].b
	if held[1].b != pinned {
		t.Fatalf("second request under the bound left the pinned backend")
	}
	third, err := h.rt.acquire(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	// ceil(1.25 x 3 / 4) = 1, raised to the minimum 2: the pinned backend is full.
	if third.b == pinned || third.decision.Reason != balance.Overflow {
		t.Fatalf("third request: %s reason %s, pinned %s", third.b.url, third.decision.Reason, pinned.url)
	}
	h.rt.release(&third)
	for i := range held {
		h.rt.release(&held[i])
	}
	again, err := h.rt.acquire(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	defer h.rt.release(&again)
	if again.b != pinned {
		t.Fatalf("after draining the session went to %s, not back to %s", again.b.url, pinned.url)
	}
}

// TestFieldStrategiesRoute: each of the field's policies routes real
// requests to real engines, keeps a document's questions together at low
// load, and reports its decisions under its own strategy label.
func TestFieldStrategiesRoute(t *testing.T) {
	for _, st := range []balance.Strategy{balance.PrefixHash, balance.CacheAware, balance.BoundedLoad} {
		t.Run(string(st), func(t *testing.T) {
			h := simFleet(t, 4, st)
			for doc := range 4 {
				text := strings.Repeat(fmt.Sprintf("document %d is long and shared. ", doc), 200) // past the 16 blocks the ring and the naive hash key by
				var first string
				for q := range 3 {
					body := fmt.Sprintf(`{"model":"sim","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, text, q)
					got, reason := routedTo(t, h, body)
					if q == 0 {
						first = got
						continue
					}
					if got != first || reason != string(balance.Hit) {
						t.Fatalf("doc %d question %d: %s (%s), first went to %s", doc, q, got, reason, first)
					}
				}
			}
			h.settle()
			n := 0.0
			for _, r := range []balance.Reason{balance.Hit, balance.Cold, balance.Least, balance.Overflow} {
				n += testutil.ToFloat64(h.rt.metrics.decisions.WithLabelValues(string(st), string(r), otherModel))
			}
			if n != 12 {
				t.Fatalf("%v decisions counted under %s, want 12", n, st)
			}
		})
	}
}

// TestMetricsModelAndWeights: requests are counted by model and by whether
// the chosen node held the weights warm; a model neither the config nor an
// endpoint names is labelled other, so callers cannot grow the series; the
// build's version is exported.
func TestMetricsModelAndWeights(t *testing.T) {
	cold := false
	cfg := Defaults()
	cfg.ProbeInterval = -1
	cfg.Backends = []BackendConfig{
		{URL: okBackend(t, "a", nil).URL, Models: []string{"sim"}, HoldsWeights: &cold},
		{URL: okBackend(t, "b", nil).URL, Models: []string{"b"}},
		{URL: okBackend(t, "c", nil).URL}, // serves any model
	}
	src := NewStaticSource(StaticEndpoints(&cfg), nil)
	reg := prometheus.NewRegistry()
	rt, err := New(cfg, Options{Source: src, Registry: reg, Version: "v9.9.9-test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt)
	defer srv.Close()
	// sim goes to a (cold) or c (warm), as the router decides; b only to
	// b; the made-up models only to c.
	simCold := 0.0
	for i, m := range []string{"sim", "sim", "sim", "sim", "b", "made-up-1", "made-up-2"} {
		resp := post(t, srv.URL+"/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hello %d"}`, m, i), DebugRequestHeader, "1")
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", m, resp.Status)
		}
		if ParseRoute(resp.Header.Get(RouteHeader))["backend"] == cfg.Backends[0].URL {
			simCold++
		}
	}
	for _, c := range []struct {
		model, weights string
		want           float64
	}{{"sim", "cold", simCold}, {"sim", "warm", 4 - simCold}, {"b", "warm", 1}, {otherModel, "warm", 2}, {otherModel, "cold", 0}} {
		if got := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(c.model, c.weights)); got != c.want {
			t.Errorf("requests{model=%s,weights=%s} = %v, want %v", c.model, c.weights, got, c.want)
		}
	}
	if simCold == 0 {
		t.Error("no sim request reached the cold backend")
	}
	if got := testutil.ToFloat64(rt.metrics.buildInfo.WithLabelValues("v9.9.9-test", runtime.Version())); got != 1 {
		t.Errorf("build_info = %v", got)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetValue(), "made-up") {
					t.Errorf("%s carries the caller's model %q", f.GetName(), l.GetValue())
				}
			}
		}
	}
}

// TestForwardedHeaders: a backend gets the client's headers, every value
// of each, without the hop-by-hop ones (also those Connection names) and
// the router's debug request, with the client's address appended to
// X-Forwarded-For.
func TestForwardedHeaders(t *testing.T) {
	got := make(chan http.Header, 2)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer backend.Close()
	h := newHarness(t, Defaults(), Options{}, backend.URL)
	for _, prior := range []string{"10.1.1.1", ""} {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok")
		req.Header["X-Multi"] = []string{"a", "b"}
		req.Header.Set("Connection", "X-Custom-Hop")
		req.Header.Set("X-Custom-Hop", "1")
		req.Header.Set("Keep-Alive", "timeout=5")
		req.Header.Set(DebugRequestHeader, "1")
		if prior != "" {
			req.Header.Set("X-Forwarded-For", prior)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		hdr := <-got
		wantXFF := "127.0.0.1"
		if prior != "" {
			wantXFF = prior + ", 127.0.0.1"
		}
		if hdr.Get("Authorization") != "Bearer tok" || strings.Join(hdr["X-Multi"], ",") != "a,b" || strings.Join(hdr["X-Forwarded-For"], "|") != wantXFF {
			t.Fatalf("forwarded %v", hdr)
		}
		for _, k := range []string{"X-Custom-Hop", "Keep-Alive", DebugRequestHeader} {
			if _, ok := hdr[k]; ok {
				t.Fatalf("%s forwarded: %v", k, hdr)
			}
		}
	}
}

// TestForwardedForIPv6: a client reaching the router over IPv6 is named
// in X-Forwarded-For by its whole address, not by what precedes its first
// colon.
func TestForwardedForIPv6(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	got := make(chan string, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Forwarded-For")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer backend.Close()
	h := newHarness(t, Defaults(), Options{}, backend.URL)
	front := &httptest.Server{Listener: l, Config: &http.Server{Handler: h.rt}}
	front.Start()
	defer front.Close()
	resp := post(t, front.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	resp.Body.Close()
	if xff := <-got; xff != "::1" {
		t.Fatalf("X-Forwarded-For %q, want ::1", xff)
	}
}

// TestConfiguredSpeed: one at a time, new prompts all go to a backend
// configured three times as fast as the other (idle, it answers in a third
// of the time, past what balance may cost: balance_slack); unconfigured,
// the two split them.
func TestConfiguredSpeed(t *testing.T) {
	for _, speed := range []float64{0, 3} {
		urls := sims(t, 2)
		cfg := Defaults()
		cfg.Backends = []BackendConfig{{URL: urls[0], Speed: speed}, {URL: urls[1]}}
		h := newHarness(t, cfg, Options{})
		fast := 0
		for i := range 40 {
			got, _ := routedTo(t, h, chat("", strings.Repeat(fmt.Sprintf("prompt %d, nothing shared. ", i), 40)))
			if got == urls[0] {
				fast++
			}
		}
		if speed == 3 && fast != 40 || speed == 0 && (fast < 17 || fast > 23) {
			t.Errorf("speed %v: %d of 40 prompts went to it, want 40 at speed 3, 17-23 unconfigured", speed, fast)
		}
	}
}
