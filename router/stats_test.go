package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
)

func TestLatencyPercentiles(t *testing.T) {
	if l := latency(nil); l != nil {
		t.Fatalf("latency of no samples: %+v, want nil", l)
	}
	var s []time.Duration
	for i := 100; i >= 1; i-- { // out of order: latency sorts a copy
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	l := latency(s)
	if l.P50 != 0.050 || l.P90 != 0.090 || l.P99 != 0.099 || l.Samples != 100 {
		t.Fatalf("latency of 1..100 ms: %+v", l)
	}
	if s[0] != 100*time.Millisecond {
		t.Fatal("latency sorted its input")
	}
	if l := latency([]time.Duration{time.Second}); l.P50 != 1 || l.P99 != 1 {
		t.Fatalf("latency of one sample: %+v", l)
	}
	var st backendStats
	for i := range ttftWindow + 10 {
		st.firstByte(time.Duration(i))
	}
	if len(st.ttft) != ttftWindow || st.ttft[0] != ttftWindow || st.ttft[9] != ttftWindow+9 {
		t.Fatalf("ring after %d samples: len %d, first %v", ttftWindow+10, len(st.ttft), st.ttft[:10])
	}
	st.routed(10, 30) // a match longer than the prompt counts as the whole prompt
	st.routed(10, 0)
	if st.requests != 2 || st.hitRate() != 0.5 {
		t.Fatalf("after a full hit and a miss: %d requests, hit rate %v", st.requests, st.hitRate())
	}
}

// TestStatusPageData: the admin listener serves the status page and its
// snapshot, per backend the requests in flight, hit rate and first-byte
// latency of real llmsim engines; it wants the admin token like the other
// admin paths, and refuses every method but GET.
func TestStatusPageData(t *testing.T) {
	h := simFleet(t, 2, balance.PrefixAware)
	const token = "status-page-token-0123456789"
	admin := httptest.NewServer(h.rt.AdminHandler(h.reg, nil, token))
	defer admin.Close()

	doc := strings.Repeat("a long shared document about the fleet. ", 100)
	for q := range 4 {
		body := fmt.Sprintf(`{"model":"sim","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, doc, q)
		resp := post(t, h.srv.URL+"/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", q, resp.Status)
		}
		resp.Body.Close()
	}
	h.settle()

	call := func(method, path, tok string) (int, string) {
		t.Helper()
		if tok == "" {
			return request(t, method, admin.URL+path)
		}
		return request(t, method, admin.URL+path, "Authorization", "Bearer "+tok)
	}
	code, body := call("GET", "/ui/router.json", token)
	if code != http.StatusOK {
		t.Fatalf("GET /ui/router.json: %d %s", code, body)
	}
	var st State
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	var requests, blocks uint64
	var hits float64
	for _, b := range st.Backends {
		if b.Requests > 0 && (b.TTFT == nil || b.TTFT.Samples != int(b.Requests) || b.TTFT.P50 <= 0 || b.TTFT.P99 < b.TTFT.P50) {
			t.Errorf("backend %s: %d requests, ttft %+v", b.URL, b.Requests, b.TTFT)
		}
		if b.HitRate < 0 || b.HitRate >= 1 || b.Inflight != 0 {
			t.Errorf("backend %s: hit rate %v, %d in flight", b.URL, b.HitRate, b.Inflight)
		}
		requests, blocks, hits = requests+b.Requests, blocks+b.PromptBlocks, hits+b.HitRate*float64(b.PromptBlocks)
	}
	// Each question after the first on a backend finds the shared
	// document there.
	if requests != 4 || blocks == 0 || hits <= 0 {
		t.Fatalf("after 4 requests sharing a prefix: %s", body)
	}

	if code, body := call("GET", "/ui", token); code != http.StatusOK || !strings.Contains(body, `content="ui/router.json"`) {
		t.Fatalf("GET /ui: %d %.200s", code, body)
	}
	for _, tc := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", "/ui", "", http.StatusUnauthorized},
		{"GET", "/ui/router.json", "", http.StatusUnauthorized},
		{"POST", "/ui/router.json", "", http.StatusUnauthorized},
		{"POST", "/ui/router.json", token, http.StatusMethodNotAllowed},
		{"PUT", "/ui", token, http.StatusMethodNotAllowed},
		{"DELETE", "/ui/router.json", token, http.StatusMethodNotAllowed},
	} {
		if code, body := call(tc.method, tc.path, tc.token); code != tc.want {
			t.Errorf("%s %s (token %v): %d %q; want %d", tc.method, tc.path, tc.token != "", code, body, tc.want)
		}
	}
}
