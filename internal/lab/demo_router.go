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
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/cli"
	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

// demoRouterResult is what the demo's router half saw.
type demoRouterResult struct {
	requests, promptTokens, cachedTokens int
	stayed                               bool // every document's questions went to one server
	servers                              int  // servers that got a document
}

// demoRouter is the demo's second half: two simulated inference servers
// registered on the node as endpoints of the cached model, and a router that
// joins the node's gossip with the cluster key, learns the endpoints there
// (the node has the model ready), and keeps each document's questions on
// one server, whose prefix cache then holds most of the prompt.
func demoRouter(ctx context.Context, e *cli.Env, say func(string, ...any), cl *api.Client, model, keyFile string, logOut io.Writer) (res demoRouterResult, err error) {
	names := map[string]string{} // endpoint URL -> short name
	for _, name := range []string{"sim-a", "sim-b"} {
		cfg := llmsim.Defaults()
		cfg.Model, cfg.DecodePerToken = model, time.Millisecond
		sim, err := llmsim.New(cfg, prometheus.NewRegistry())
		if err != nil {
			return res, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return res, err
		}
		srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		url := "http://" + l.Addr().String()
		names[url] = name
		if err := cl.AddEndpoint(ctx, api.Endpoint{Model: model, URL: url}); err != nil {
			return res, err
		}
		say("warmfleet endpoint add --model %s --url %s   (%s, a simulated vLLM server)", model, url, name)
	}
	fleet, err := cl.Fleet(ctx)
	if err != nil {
		return res, err
	}
	join := ""
	for _, m := range fleet.Members {
		if m.Self {
			join = m.Addr
		}
	}
	if join == "" {
		return res, errors.New("the daemon is not in a gossip cluster")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	listening := make(chan net.Addr, 1)
	routerErr := make(chan error, 1)
	go func() {
		routerErr <- cli.ServeRouter(ctx, &cli.Env{Stdout: io.Discard, Stderr: logOut, Getenv: e.Getenv}, []string{
			"--listen", "127.0.0.1:0", "--admin-listen", "", "--join", join, "--gossip", "127.0.0.1:0",
			"--cluster-key-file", keyFile, "--node-name", "demo-router"}, func(a net.Addr) { listening <- a })
	}()
	var base string
	select {
	case a := <-listening:
		base = "http://" + a.String()
	case err := <-routerErr:
		return res, fmt.Errorf("router: %w", err)
	}
	defer func() {
		cancel()
		if rerr := <-routerErr; rerr != nil && err == nil {
			err = fmt.Errorf("router: %w", rerr)
		}
	}()
	say("warmfleet router --join %s --cluster-key-file ...   (listening on %s)", join, base)

	client := &http.Client{Timeout: 10 * time.Second}
	// ask sends one question about doc and reports where it went and how much
	// of its prompt that server had cached.
	type answer struct {
		backend, reason string
		prompt, cached  int
	}
	ask := func(doc, question int) (answer, error) {
		var a answer
		text := strings.Repeat(fmt.Sprintf("Document %d: one paragraph after another of the same long text.\n", doc+1), 80)
		body, err := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "messages": []map[string]string{
			{"role": "system", "content": "Answer from the document."},
			{"role": "user", "content": fmt.Sprintf("%s\nQuestion %d?", text, question+1)}}})
		if err != nil {
			return a, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return a, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(router.DebugRequestHeader, "1")
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
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return a, err
		}
		route := router.ParseRoute(resp.Header.Get(router.RouteHeader))
		a.backend, a.reason = names[route["backend"]], route["reason"]
		a.prompt, a.cached = out.Usage.PromptTokens, out.Usage.Details.CachedTokens
		return a, nil
	}

	// The router learns the endpoints, and that the node holds the model,
	// from gossip: a moment after it joins. Its model list answers once it
	// has a ready endpoint, without routing a request (which would count
	// in the traffic shares the first documents are placed by).
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
		if err != nil {
			return res, err
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("router never listed the model: %w", err)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}

	const docs, questions = 4, 3
	lines := make([][]string, docs)
	home := map[int]string{}
	res.stayed = true
	for q := range questions {
		for d := range docs {
			a, err := ask(d, q)
			if err != nil {
				return res, fmt.Errorf("document %d, question %d: %w", d+1, q+1, err)
			}
			if q == 0 {
				home[d] = a.backend
			} else if a.backend != home[d] {
				res.stayed = false
			}
			res.requests++
			res.promptTokens += a.prompt
			res.cachedTokens += a.cached
			lines[d] = append(lines[d], fmt.Sprintf("%s %s, %d/%d cached", a.backend, a.reason, a.cached, a.prompt))
		}
	}
	say("%d documents, %d questions each, asked round robin through the router (server, decision, prompt tokens the server had cached):", docs, questions)
	servers := map[string]bool{}
	for d, l := range lines {
		servers[home[d]] = true
		fmt.Fprintf(e.Stdout, "    document %d: %s\n", d+1, strings.Join(l, "; "))
	}
	res.servers = len(servers)
	return res, nil
}
