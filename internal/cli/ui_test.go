package cli

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/synthmodel"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// TestStatusPageShowsFleetWarmingLive runs three daemons that gossip and
// swarm on loopback over a real S3 server, opens the first one's /ui in
// headless Chromium before any model is cached, adds a model, and waits for
// the page's own polling to show it ready on every node. The screenshot is
// kept as a test artifact.
func TestStatusPageShowsFleetWarmingLive(t *testing.T) {
	browser := testenv.StartBrowser(t)
	_, socks, metricsAddrs := startSwarmFleet(t, 3, synthmodel.Options{Seed: 24, Size: 24 << 20, Shards: 3})
	var metrics []string
	for _, addr := range metricsAddrs {
		metrics = append(metrics, "http://"+addr)
	}

	browser.Open(t, metrics[0]+"/ui")
	count := func(selector string) int {
		var n int
		browser.Eval(t, fmt.Sprintf("return document.querySelectorAll(%q).length", selector), &n)
		return n
	}
	polls := func() int {
		var n int
		browser.Eval(t, "return Number(document.body.dataset.polls || 0)", &n)
		return n
	}
	wait.For(t, "the page to list three alive members", func() bool {
		return count(`tr[data-member][data-state="alive"]`) == 3
	})
	if n := count(`tr[data-model]`); n != 0 {
		t.Fatalf("the page shows %d model caches before any was added", n)
	}
	before := polls()

	var out bytes.Buffer
	if code := Run(t.Context(), []string{"cache", "add", "tiny", "--source", "s3://models/tiny/", "--api", socks[0]},
		&Env{Stdout: &out, Stderr: &out, Getenv: os.Getenv}); code != 0 {
		t.Fatalf("cache add exited %d: %s", code, out.String())
	}
	wait.For(t, "the page to show the model ready on every node", func() bool {
		return count(`tr[data-model="tiny"][data-state="ready"]`) == 3
	}, wait.Timeout(2*time.Minute))
	if after := polls(); after <= before {
		t.Fatalf("page polled %d times before the cache was added and %d after: it did not update itself", before, after)
	}
	// The node sections show the size, and the members table the S3 and
	// peer counters the fleet gossips: together the fleet read the model.
	var text string
	browser.Eval(t, "return document.body.innerText", &text)
	for _, want := range []string{"node-1 *", "node-2", "node-3", "100% of 24.0 MiB", "1 / 1"} {
		if !strings.Contains(text, want) {
			t.Errorf("page text lacks %q:\n%s", want, text)
		}
	}
	wait.For(t, "the members table to count bytes from S3", func() bool {
		var s3Cells []string
		browser.Eval(t, `return [...document.querySelectorAll("tr[data-member]")].map(r => r.cells[7].textContent)`, &s3Cells)
		return len(s3Cells) == 3 && slices.ContainsFunc(s3Cells, func(s string) bool { return s != "0 B" })
	})

	png := browser.Screenshot(t)
	shot := filepath.Join(t.ArtifactDir(), "fleet-status.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}

// TestStatusPageShowsRouterBackends opens the router's /ui in headless
// Chromium while requests go through it to two llmsim engines, and waits
// for the page to show each backend's requests and first-byte percentiles.
func TestStatusPageShowsRouterBackends(t *testing.T) {
	browser := testenv.StartBrowser(t)
	var sims []string
	for range 2 {
		addr := testenv.FreeAddr(t)
		startSim(t, addr, "sim")
		sims = append(sims, "http://"+addr)
	}
	routerAddr, adminAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	runInBackground(t, "router", "--listen", routerAddr, "--admin-listen", adminAddr, "--backend", strings.Join(sims, ","))

	browser.Open(t, "http://"+adminAddr+"/ui")
	rows := func() [][]string {
		var out [][]string
		browser.Eval(t, `return [...document.querySelectorAll("tr[data-backend]")].map(r => [...r.cells].map(c => c.textContent))`, &out)
		return out
	}
	wait.For(t, "the page to list both backends", func() bool { return len(rows()) == 2 })
	complete := func(i int) error {
		body := fmt.Sprintf(`{"model":"sim","max_tokens":2,"prompt":"%s question %d"}`, strings.Repeat("shared context ", 200), i)
		resp, err := http.Post("http://"+routerAddr+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("completion %d: %s", i, resp.Status)
		}
		return nil
	}
	for i := range 8 {
		if err := complete(i); err != nil {
			t.Fatal(err)
		}
	}
	// Columns: backend, node, models, state, in flight, prefilling, limit,
	// requests, hit rate, TTFT p50, p90, p99, samples.
	wait.For(t, "the page to show 8 requests with their hit rate and TTFT", func() bool {
		total := 0
		for _, r := range rows() {
			var n int
			if _, err := fmt.Sscan(r[7], &n); err != nil {
				return false
			}
			if n > 0 && (r[9] == "–" || r[12] != r[7]) {
				return false
			}
			total += n
		}
		return total == 8
	})
	var text string
	browser.Eval(t, "return document.body.innerText", &text)
	if !strings.Contains(text, "%") || !strings.Contains(text, " ms") {
		t.Errorf("page shows no hit rate or latency:\n%s", text)
	}
	png := browser.Screenshot(t)
	shot := filepath.Join(t.ArtifactDir(), "router-status.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}
