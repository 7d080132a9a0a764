package ui

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(t *testing.T, snapshot func() (any, error)) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	Mount(mux, "fleet", snapshot)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func do(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{"x":1}`))
	if err != nil {
		t.Fatal(err)
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
	return resp, string(b)
}

// TestMountServesPageAndSnapshot: GET /ui is the page, naming its data
// URL; GET /ui/NAME.json is the snapshot as JSON, 503 with the reason when
// it fails; every other method is refused and nothing else is served.
func TestMountServesPageAndSnapshot(t *testing.T) {
	var fail error
	calls := 0
	srv := serve(t, func() (any, error) {
		calls++
		return map[string]any{"members": []string{"n1"}}, fail
	})
	resp, body := do(t, "GET", srv.URL+"/ui")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, `content="ui/fleet.json"`) || strings.Contains(body, dataPlaceholder) ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("GET /ui: %d %v:\n%.300s", resp.StatusCode, resp.Header, body)
	}
	resp, body = do(t, "GET", srv.URL+"/ui/fleet.json")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || body != `{"members":["n1"]}` {
		t.Fatalf("GET /ui/fleet.json: %d %q", resp.StatusCode, body)
	}
	fail = errors.New("state not loaded yet")
	if resp, body = do(t, "GET", srv.URL+"/ui/fleet.json"); resp.StatusCode != http.StatusServiceUnavailable ||
		!strings.Contains(body, "state not loaded yet") {
		t.Fatalf("GET /ui/fleet.json failing: %d %q", resp.StatusCode, body)
	}
	before := calls
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		for _, p := range []string{"/ui", "/ui/fleet.json"} {
			if resp, body := do(t, m, srv.URL+p); resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d %q; want 405", m, p, resp.StatusCode, body)
			}
		}
	}
	if calls != before {
		t.Errorf("refused requests took %d snapshots", calls-before)
	}
	for _, p := range []string{"/ui/", "/ui/router.json", "/ui/fleet.json/x", "/"} {
		if resp, _ := do(t, "GET", srv.URL+p); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d; want 404", p, resp.StatusCode)
		}
	}
}

// TestPageLoadsNothingElse: the page works offline, so it may name no
// other resource: no URL with a scheme or host, no src or href attribute,
// no CSS import.
func TestPageLoadsNothingElse(t *testing.T) {
	for _, re := range []string{`(?i)https?:`, `//[a-z0-9.-]+\.[a-z]{2,}`, `(?i)\bsrc\s*=`, `(?i)\bhref\s*=`, `(?i)@import`, `(?i)url\(`} {
		if m := regexp.MustCompile(re).Find(page); m != nil {
			t.Errorf("page.html matches %s: %q", re, m)
		}
	}
}

func TestMountRefusesBadName(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a name with a slash was mounted")
		}
	}()
	Mount(http.NewServeMux(), "../x", func() (any, error) { return nil, nil })
}
