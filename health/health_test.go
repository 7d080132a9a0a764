package health

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestReadinessNamesTheFirstMissingCondition: conditions are checked in
// the order added and the first that fails is the reason.
func TestReadinessNamesTheFirstMissingCondition(t *testing.T) {
	var r Readiness
	loaded, joined := false, false
	r.Add("state", func() error {
		if !loaded {
			return errors.New("not loaded yet")
		}
		return nil
	})
	r.Add("fleet", func() error {
		if !joined {
			return errors.New("alone")
		}
		return nil
	})
	h := http.NewServeMux()
	Mount(h, prometheus.NewRegistry(), r.Err)
	for _, step := range []struct {
		loaded, joined bool
		code           int
		body           string
	}{
		{false, false, 503, "not ready: state: not loaded yet\n"},
		{true, false, 503, "not ready: fleet: alone\n"},
		{true, true, 200, "ok\n"},
	} {
		loaded, joined = step.loaded, step.joined
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		if rec.Code != step.code || rec.Body.String() != step.body {
			t.Errorf("loaded=%v joined=%v: %d %q, want %d %q", loaded, joined, rec.Code, rec.Body, step.code, step.body)
		}
	}
	for _, req := range []struct{ method, path string }{{"POST", "/metrics"}, {"PUT", "/readyz"}, {"DELETE", "/healthz"}, {"PATCH", "/metrics"}} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(req.method, req.path, strings.NewReader("x")))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d, want 405", req.method, req.path, rec.Code)
		}
	}
}
