package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

// The demo's workload: documents (--documents) of demoQuestions
// questions each. Each document's questions share the document as
// their prompt's prefix, which a server that saw it holds in its prefix
// cache.
const demoQuestions = 4

// strategyResult is what one strategy did with the demo's requests.
type strategyResult struct {
	strategy             string
	requests             int
	promptTokens, cached int
	ttft                 []time.Duration // per request, in order
	servers              int             // servers that got at least one request
}

// hitRate is the share of prompt tokens the servers had cached.
func (r strategyResult) hitRate() float64 {
	return float64(r.cached) / float64(max(r.promptTokens, 1))
}

// quantile is the nearest-rank q quantile of ds (0 when empty).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// simSlot serves one simulated inference server at a fixed address, and
// can replace it with a fresh one (an empty prefix cache), so each
// strategy starts from the same cold servers.
type simSlot struct {
	sim   atomic.Pointer[llmsim.Server]
	model string
	url   string
	srv   *http.Server
}

func (s *simSlot) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.sim.Load().ServeHTTP(w, r) }

func (s *simSlot) reset() error {
	cfg := llmsim.Defaults()
	// A short document with a slow prefill shows the same contrast as a
	// long one at vLLM's speed, for a fraction of the hashing and parsing
	// (which the race detector makes slow in tests).
	cfg.Model, cfg.DecodePerToken, cfg.PrefillPerToken = s.model, time.Millisecond, 200*time.Microsecond
	sim, err := llmsim.New(cfg, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	s.sim.Store(sim)
	return nil
}

// startSims starts one simulated vLLM server per node and registers it on
// that node as an endpoint of model: the router learns it from gossip.
func startSims(ctx context.Context, nodes []*demoNode, model string) ([]*simSlot, error) {
	var sims []*simSlot
	for _, n := range nodes {
		s := &simSlot{model: model}
		if err := s.reset(); err != nil {
			return sims, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return sims, err
		}
		s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = s.srv.Serve(l) }()
		sims = append(sims, s)
		s.url = "http://" + l.Addr().String()
		if err := n.cl.AddEndpoint(ctx, api.Endpoint{Model: model, URL: s.url}); err != nil {
			return sims, fmt.Errorf("%s: %w", n.name, err)
		}
	}
	return sims, nil
}

// demoRouter is a router running in this process.
type demoRouter struct {
	base, admin string // http://host:port of the API and the admin listener
	cancel      context.CancelFunc
	done        chan error
}

// stop stops the router and returns its error.
func (r *demoRouter) stop() error {
	r.cancel()
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// startRouter runs a router with strategy that joins the fleet's gossip at
// join with the cluster key, and returns once it routes to every one of
// the backends (it learns them, and that their nodes hold the model, from
// gossip).
func startRouter(ctx context.Context, strategy, join, keyFile, configFile string, backends int, logOut io.Writer) (*demoRouter, error) {
	// The router reports only its API listener's address: pick the admin
	// listener's.
	admin, err := testenv.PickFreeAddr()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &demoRouter{admin: "http://" + admin, cancel: cancel, done: make(chan error, 1)}
	listening := make(chan net.Addr, 1)
	go func() {
		r.done <- cli.ServeRouter(ctx, &cli.Env{Stdout: io.Discard, Stderr: logOut, Getenv: func(string) string { return "" }}, []string{
			"--listen", "127.0.0.1:0", "--admin-listen", admin, "--join", join, "--gossip", "127.0.0.1:0",
			"--cluster-key-file", keyFile, "--node-name", "router-" + strategy, "--strategy", strategy,
			"--config", configFile}, func(a net.Addr) { listening <- a })
	}()
	select {
	case a := <-listening:
		r.base = "http://" + a.String()
	case err := <-r.done:
		cancel()
		return nil, fmt.Errorf("router: %w", err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, err := readyBackends(ctx, client, r.admin)
		if err == nil && ready == backends {
			return r, nil
		}
		if err == nil {
			err = fmt.Errorf("%d of %d backends ready", ready, backends)
		}
		if time.Now().After(deadline) {
			return nil, errors.Join(fmt.Errorf("the router did not learn the fleet's endpoints: %w", err), r.stop())
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, errors.Join(err, r.stop())
		}
	}
}

// readyBackends counts the backends a router's admin state shows ready.
func readyBackends(ctx context.Context, client *http.Client, admin string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/admin/state", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, errors.New(resp.Status)
	}
	var st router.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, fmt.Errorf("admin state: %w", err)
	}
	ready := 0
	for _, b := range st.Backends {
		if b.Ready {
			ready++
		}
	}
	return ready, nil
}

// runStrategy sends the demo's requests through the router at base, one
// at a time: every document's first question, then every second one, and
// so on. Each asks for one output token, so its latency is the time to
// the first token (prefill of what the server had not cached, plus one
// token).
func runStrategy(ctx context.Context, base, model, strategy string, docs int) (strategyResult, error) {
	res := strategyResult{strategy: strategy}
	client := &http.Client{Timeout: 30 * time.Second}
	used := map[string]bool{}
	for q := range demoQuestions {
		for d := range docs {
			a, err := ask(ctx, client, base, model, d, q)
			if err != nil {
				return res, fmt.Errorf("%s: document %d, question %d: %w", strategy, d+1, q+1, err)
			}
			res.requests++
			res.promptTokens += a.prompt
			res.cached += a.cached
			res.ttft = append(res.ttft, a.took)
			used[a.backend] = true
		}
	}
	res.servers = len(used)
	return res, nil
}

// answer is what one request saw.
type answer struct {
	backend        string
	prompt, cached int
	took           time.Duration
}

// ask sends question q about document d through the router.
func ask(ctx context.Context, client *http.Client, base, model string, d, q int) (answer, error) {
	var a answer
	text := strings.Repeat(fmt.Sprintf("Document %d: one paragraph after another of the same long text.\n", d+1), 20)
	body, err := json.Marshal(map[string]any{"model": model, "max_tokens": 1, "messages": []map[string]string{
		{"role": "system", "content": "Answer from the document."},
		{"role": "user", "content": fmt.Sprintf("%s\nQuestion %d?", text, q+1)}}})
	if err != nil {
		return a, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return a, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(router.DebugRequestHeader, "1")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return a, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return a, fmt.Errorf("answer: %w", err)
	}
	a.took = time.Since(start)
	a.backend = router.ParseRoute(resp.Header.Get(router.RouteHeader))["backend"]
	a.prompt, a.cached = out.Usage.PromptTokens, out.Usage.Details.CachedTokens
	return a, nil
}

// demoRouterConfig turns the router's ramp-up off: it gives an endpoint
// that just became ready a growing share of the traffic, which protects a
// server joining a busy fleet, but every server of the demo is new at once.
const demoRouterConfig = "ramp_up: 0s\n"

// compareStrategies sends the same requests through a router per strategy,
// each on fresh servers, and returns the results and the last router,
// left running (the caller stops it). The routers' configuration file goes
// in dir.
func compareStrategies(ctx context.Context, sims []*simSlot, model, join, keyFile, dir string, docs int, logOut io.Writer) ([]strategyResult, *demoRouter, error) {
	configFile := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(configFile, []byte(demoRouterConfig), 0o600); err != nil {
		return nil, nil, err
	}
	var results []strategyResult
	var last *demoRouter
	for _, strategy := range []string{"random", "prefix-aware"} {
		if last != nil {
			if err := last.stop(); err != nil {
				return nil, nil, err
			}
			last = nil
		}
		for _, s := range sims {
			if err := s.reset(); err != nil {
				return nil, nil, err
			}
		}
		r, err := startRouter(ctx, strategy, join, keyFile, configFile, len(sims), logOut)
		if err != nil {
			return nil, nil, err
		}
		last = r
		res, err := runStrategy(ctx, r.base, model, strategy, docs)
		if err != nil {
			return nil, nil, errors.Join(err, r.stop())
		}
		results = append(results, res)
	}
	return results, last, nil
}

// writeComparison prints the strategies side by side.
func writeComparison(w io.Writer, results []strategyResult) {
	fmt.Fprintf(w, "    %-13s %8s %15s %10s %10s %8s\n", "strategy", "requests", "prefix hit rate", "TTFT p50", "TTFT p90", "servers")
	for _, r := range results {
		fmt.Fprintf(w, "    %-13s %8d %14.0f%% %10s %10s %8d\n", r.strategy, r.requests, 100*r.hitRate(),
			quantile(r.ttft, 0.5).Round(100*time.Microsecond), quantile(r.ttft, 0.9).Round(100*time.Microsecond), r.servers)
	}
}
