package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// pathRecorder is a backend that answers every path and remembers them.
type pathRecorder struct {
	mu    sync.Mutex
	paths []string
}

func (p *pathRecorder) start(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.paths = append(p.paths, r.URL.Path)
		p.mu.Unlock()
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

func (p *pathRecorder) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.paths...)
}

func get(t *testing.T, url string, hdr ...string) (int, string) {
	t.Helper()
	return request(t, http.MethodGet, url, hdr...)
}

// request sends a body-less request with the given header pairs and
// returns the answer's status and body.
func request(t *testing.T, method, url string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestOnlyAPIPathsForwarded: the router answers /healthz and /readyz
// itself, forwards the configured API paths, and answers anything else
// (/metrics, /admin/state) with a 404 in the OpenAI error shape.
func TestOnlyAPIPathsForwarded(t *testing.T) {
	var rec pathRecorder
	h := newHarness(t, Defaults(), Options{}, rec.start(t))
	for _, p := range []string{"/metrics", "/admin/state", "/v1/files", "/v1/modelsx", "/"} {
		req, _ := http.NewRequest(http.MethodGet, h.srv.URL+p, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s: status %d, want 404", p, resp.StatusCode)
		}
		if e := readErr(t, resp); e.Error.Code != "unknown_path" || e.Error.Type != "not_found_error" {
			t.Fatalf("%s: error %+v", p, e)
		}
	}
	if code, body := get(t, h.srv.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
	if code, body := get(t, h.srv.URL+"/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("readyz %d %q", code, body)
	}
	resp := post(t, h.srv.URL+"/v1/embeddings", `{"model":"m","input":"x"}`)
	resp.Body.Close()
	resp = post(t, h.srv.URL+"/v1/models/m/extra", `{}`)
	resp.Body.Close()
	if got := rec.seen(); strings.Join(got, ",") != "/v1/embeddings,/v1/models/m/extra" {
		t.Fatalf("backend saw %v, want only the API paths", got)
	}

	cfg := h.rt.Config()
	cfg.ForwardPaths = []string{"/v1/chat/completions", "/tokenize"}
	if err := h.rt.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	resp = post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a path taken off forward_paths: status %d", resp.StatusCode)
	}
	resp.Body.Close()
	resp = post(t, h.srv.URL+"/tokenize", `{"model":"m","prompt":"x"}`)
	resp.Body.Close()
	if got := rec.seen(); resp.StatusCode != 200 || got[len(got)-1] != "/tokenize" {
		t.Fatalf("an added path: status %d, backend saw %v", resp.StatusCode, got)
	}
	for _, bad := range []string{"/healthz", "v1", "/v1/"} {
		c := Defaults()
		c.ForwardPaths = []string{bad}
		if err := c.Validate(); err == nil {
			t.Fatalf("forward path %q accepted", bad)
		}
	}
}

// TestReadyzAndAdminToken: /readyz says why no backend can be routed to,
// on the API and the admin listener alike; the admin listener wants its
// token for everything but the health paths.
func TestReadyzAndAdminToken(t *testing.T) {
	h := newHarness(t, Defaults(), Options{}, deadURL(t, 5))
	const token = "0123456789abcdef-secret"
	admin := httptest.NewServer(h.rt.AdminHandler(h.reg, nil, token))
	defer admin.Close()
	for _, base := range []string{h.srv.URL, admin.URL} {
		if code, _ := get(t, base+"/readyz"); code != 200 {
			t.Fatalf("%s/readyz before any failure: %d", base, code)
		}
	}
	resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`) // ejects the dead backend
	resp.Body.Close()
	for _, base := range []string{h.srv.URL, admin.URL} {
		code, body := get(t, base+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "1 ejected") {
			t.Fatalf("%s/readyz with its only backend ejected: %d %q", base, code, body)
		}
		if code, _ := get(t, base+"/healthz"); code != 200 {
			t.Fatalf("%s/healthz: %d", base, code)
		}
	}
	if code, _ := get(t, admin.URL+"/admin/state"); code != http.StatusUnauthorized {
		t.Fatalf("admin state without a token: %d", code)
	}
	if code, _ := get(t, admin.URL+"/metrics", "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
		t.Fatalf("metrics with a wrong token: %d", code)
	}
	if code, _ := get(t, admin.URL+"/admin/state", "Authorization", "Bearer "+token); code != 200 {
		t.Fatalf("admin state with the token: %d", code)
	}
	if code, _ := get(t, admin.URL+"/debug/pprof/heap?gc=1&debug=1"); code != http.StatusUnauthorized {
		t.Fatalf("heap profile without a token: %d", code)
	}
	if code, body := get(t, admin.URL+"/debug/pprof/heap?gc=1&debug=1", "Authorization", "Bearer "+token); code != 200 || !strings.Contains(body, "# HeapAlloc = ") {
		t.Fatalf("heap profile with the token: %d %.200q", code, body)
	}
	if code, _ := get(t, h.srv.URL+"/debug/pprof/heap"); code == 200 {
		t.Fatal("the API listener serves profiles")
	}
}

// TestIdleTimeoutBreaksStream: a backend that begins a stream and then
// stalls gets no more than the idle timeout; the client sees an error
// event and a broken connection, not a finished answer.
func TestIdleTimeoutBreaksStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer b.Close()
	cfg := Defaults()
	cfg.IdleTimeout = 200 * time.Millisecond
	h := newHarness(t, cfg, Options{}, b.URL)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a hang fails the test
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("stream ended without a break (err %v): %q", err, body)
	}
	if !strings.Contains(string(body), `data: {"error":{`) || !strings.Contains(string(body), "backend_idle_timeout") {
		t.Fatalf("no error event: %q", body)
	}
	h.settle()
	if n := testutil.ToFloat64(h.rt.metrics.failures.WithLabelValues(b.URL, "idle_timeout")); n != 1 {
		t.Fatalf("idle timeouts counted %v", n)
	}
	if st := h.rt.Snapshot().Backends[0]; st.EjectedUntil.IsZero() {
		t.Fatalf("backend not ejected: %+v", st)
	}
}

// TestNoBackendSaysWhy: the 503 for a request no backend can take says
// which cause holds: the ready backends failed this request or were
// ejected, none is ready yet, or no endpoint serves the model at all.
func TestNoBackendSaysWhy(t *testing.T) {
	dead := deadURL(t, 6)
	h := newHarness(t, Defaults(), Options{}, dead)
	ask := func() (int, string) {
		resp := post(t, h.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, want := range []string{
		"every ready endpoint for model \\\"m\\\" failed this request: 1 known, 1 tried", // the first request ejects it
		"every ready endpoint for model \\\"m\\\" is ejected after failures: 1 known, 1 ejected",
	} {
		if code, body := ask(); code != http.StatusServiceUnavailable || !strings.Contains(body, want) || !strings.Contains(body, "no_backend") {
			t.Fatalf("503 %d %s, want %q", code, body, want)
		}
	}
	for _, c := range []struct {
		ep   Endpoint
		want string
	}{
		{Endpoint{URL: dead, Ready: false}, "no endpoint for model \\\"m\\\" is ready: 1 known, all still loading the model"},
		{Endpoint{URL: dead, Ready: true, Models: []string{"other"}}, "no endpoint serves model \\\"m\\\": none is registered for it"},
	} {
		h.src.Set([]Endpoint{c.ep})
		wait.For(t, c.want, func() bool {
			code, body := ask()
			return code == http.StatusServiceUnavailable && strings.Contains(body, c.want)
		})
	}
}
