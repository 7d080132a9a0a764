package testenv

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"testing"
	"time"
)

// Browser is a headless Chromium driven through chromedriver's W3C
// WebDriver HTTP API: enough to load a page, read it with a script and take
// a screenshot, for end-to-end tests of the status page.
type Browser struct {
	base    string // chromedriver's session URL
	client  *http.Client
	timeout time.Duration
}

// StartBrowser starts chromedriver and a headless Chromium session that end
// with the test. Chromium runs without a sandbox (tests run as root), with a
// throw-away profile and with its own background traffic (updates, sync,
// safe browsing) off, so it talks only to the pages the test opens.
func StartBrowser(tb testing.TB) *Browser {
	tb.Helper()
	chromium, err := ToolPath("chromium", "Debian package chromium")
	if err != nil {
		Missing(tb, "%v", err)
	}
	driver, err := ToolPath("chromedriver", "Debian package chromium-driver")
	if err != nil {
		Missing(tb, "%v", err)
	}
	profile := tb.TempDir()
	return startForTest(tb, "chromedriver", time.Minute, func(ctx context.Context) (*Browser, func() error, error) {
		return startBrowser(ctx, driver, chromium, profile, FreeAddr(tb))
	})
}

func startBrowser(ctx context.Context, driver, chromium, profile, addr string) (*Browser, func() error, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	svc, err := startService(exec.Command(driver, "--port="+port, "--allowed-ips=127.0.0.1"), 64<<10)
	if err != nil {
		return nil, nil, err
	}
	base := "http://" + addr
	if err := WaitHTTP(ctx, nil, base+"/status", svc.exited); err != nil {
		return nil, nil, svc.startFailed("chromedriver", err)
	}
	b := &Browser{base: base, client: &http.Client{}, timeout: 30 * time.Second}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{"binary": chromium, "args": []string{
			"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
			"--disable-component-update", "--disable-sync", "--disable-default-apps", "--no-first-run",
			"--window-size=1400,1000", "--user-data-dir=" + profile,
		}},
	}}}
	var session struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(ctx, http.MethodPost, "/session", caps, &session); err != nil || session.SessionID == "" {
		return nil, nil, svc.startFailed("chromium session", fmt.Errorf("new session %q: %v", session.SessionID, err))
	}
	b.base += "/session/" + session.SessionID
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := b.call(ctx, http.MethodDelete, "", nil, nil)
		if svc.stop(5 * time.Second) {
			return fmt.Errorf("chromedriver ignored SIGTERM; output:\n%s", svc.out.String())
		}
		return err
	}
	return b, stop, nil
}

// call sends one WebDriver command and decodes its "value" into out.
func (b *Browser) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		j, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		return fmt.Errorf("webdriver %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("webdriver %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("webdriver %s %s: %s: %.1000s", method, path, resp.Status, raw)
	}
	if out == nil {
		return nil
	}
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("webdriver %s %s: %w", method, path, err)
	}
	return json.Unmarshal(env.Value, out)
}

func (b *Browser) do(tb testing.TB, method, path string, in, out any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	if err := b.call(ctx, method, path, in, out); err != nil {
		tb.Fatal(err)
	}
}

// Open loads url and waits for the page's load event.
func (b *Browser) Open(tb testing.TB, url string) {
	tb.Helper()
	b.do(tb, http.MethodPost, "/url", map[string]string{"url": url}, nil)
}

// Eval runs script (a function body: `return ...`) in the page and decodes
// what it returns into out.
func (b *Browser) Eval(tb testing.TB, script string, out any) {
	tb.Helper()
	b.do(tb, http.MethodPost, "/execute/sync", map[string]any{"script": script, "args": []any{}}, out)
}

// Screenshot returns the visible part of the page as PNG.
func (b *Browser) Screenshot(tb testing.TB) []byte {
	tb.Helper()
	var b64 string
	b.do(tb, http.MethodGet, "/screenshot", nil, &b64)
	png, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		tb.Fatalf("screenshot: %v", err)
	}
	return png
}
