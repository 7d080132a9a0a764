package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/spec"
)

// Endpoint discovery (--discover-endpoints): the daemon asks each local
// OpenAI-compatible server which models it serves (GET /v1/models) and
// registers it as an endpoint, as `warmfleet endpoint add` would, so
// routers find it with no hand-typed registration. Endpoints are keyed by
// URL, so a server is registered for one model: the first (by name) of
// those it lists that is ready on this node, else the first it lists. A
// server that claims a model this node does not hold is registered but
// gets no traffic: routers send a model's requests only to nodes that hold
// it ready. A server that stops answering, or lists no model, is removed
// after missesToRemove probes in a row. Endpoints at the URLs of
// --discover-endpoints belong to the discovery: one added by hand at such
// a URL is managed like the others.

const (
	// missesToRemove failed probes in a row remove a server's endpoint:
	// one lost probe (a restart in progress, a GC pause) does not.
	missesToRemove = 2
	// maxModelsBody bounds the /v1/models answer read.
	maxModelsBody = 1 << 20
)

// endpointRegistry is what discovery needs from the daemon (daemon.Daemon).
type endpointRegistry interface {
	AddEndpoint(ctx context.Context, ep api.Endpoint) error
	RemoveEndpoint(ctx context.Context, url string) (bool, error)
	Endpoints() ([]api.Endpoint, error)
	Caches() ([]api.CacheStatus, error)
}

// parseDiscoverURLs checks the --discover-endpoints URLs: base URLs of
// servers, http(s)://host:port[/path], a trailing slash dropped.
func parseDiscoverURLs(urls []string) ([]string, error) {
	var out []string
	for _, u := range urls {
		u = strings.TrimRight(u, "/")
		if err := (api.Endpoint{Model: "probe", URL: u}).Validate(); err != nil {
			return nil, fmt.Errorf("--discover-endpoints: %w", err)
		}
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out, nil
}

// probeModels asks the server at base which models it serves.
func probeModels(ctx context.Context, client *http.Client, base string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("probe %s: GET /v1/models: %s", base, resp.Status)
	}
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&body); err != nil {
		return nil, fmt.Errorf("probe %s: /v1/models: %w", base, err)
	}
	var models []string
	for _, m := range body.Data {
		// A name the fleet could never cache is no endpoint of it.
		if spec.ValidateModelName(m.ID) == nil && !slices.Contains(models, m.ID) {
			models = append(models, m.ID)
		}
	}
	return models, nil
}

// pickModel is the model a server that lists models is registered for:
// the first ready on this node, else the first listed; "" for none.
func pickModel(models []string, ready map[string]bool) string {
	sorted := slices.Sorted(slices.Values(models))
	for _, m := range sorted {
		if ready[m] {
			return m
		}
	}
	if len(models) == 0 {
		return ""
	}
	return models[0]
}

// discoveryChange is what one round of probes changes.
type discoveryChange struct {
	add    []api.Endpoint
	remove []string
}

// planDiscovery decides, from the endpoints registered at the discovery's
// URLs (URL to model), the model each server answered with (absent: the
// probe failed; "": it lists none) and the failed probes in a row so far,
// which endpoints to add or change and which to remove. It updates misses.
func planDiscovery(registered, answered map[string]string, urls []string, misses map[string]int) discoveryChange {
	var ch discoveryChange
	for _, u := range urls {
		model, ok := answered[u]
		if ok && model != "" {
			misses[u] = 0
			if registered[u] != model {
				ch.add = append(ch.add, api.Endpoint{Model: model, URL: u})
			}
			continue
		}
		misses[u]++
		if _, reg := registered[u]; reg && misses[u] >= missesToRemove {
			ch.remove = append(ch.remove, u)
		}
	}
	return ch
}

// discoverEndpoints probes urls every interval and applies planDiscovery's
// changes to the daemon's endpoints, until ctx ends.
func discoverEndpoints(log *slog.Logger, reg endpointRegistry, urls []string, interval time.Duration) func(context.Context) error {
	client := &http.Client{Timeout: max(interval/2, time.Second)}
	return func(ctx context.Context) error {
		misses := map[string]int{}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			discoverOnce(ctx, log, reg, client, urls, misses)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

func discoverOnce(ctx context.Context, log *slog.Logger, reg endpointRegistry, client *http.Client, urls []string, misses map[string]int) {
	eps, err := reg.Endpoints()
	if err != nil {
		log.Warn("endpoint discovery: reading endpoints", "err", err)
		return
	}
	caches, err := reg.Caches()
	if err != nil {
		log.Warn("endpoint discovery: reading caches", "err", err)
		return
	}
	ready := map[string]bool{}
	for _, c := range caches {
		ready[c.Name] = c.Ready
	}
	registered := map[string]string{}
	for _, ep := range eps {
		if slices.Contains(urls, ep.URL) {
			registered[ep.URL] = ep.Model
		}
	}
	answered := map[string]string{}
	for _, u := range urls {
		models, err := probeModels(ctx, client, u)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if misses[u]+1 == missesToRemove {
				log.Info("endpoint discovery: server not answering", "url", u, "err", err)
			}
			continue
		}
		answered[u] = pickModel(models, ready)
	}
	ch := planDiscovery(registered, answered, urls, misses)
	for _, ep := range ch.add {
		if err := reg.AddEndpoint(ctx, ep); err != nil {
			log.Warn("endpoint discovery: register", "url", ep.URL, "model", ep.Model, "err", err)
			continue
		}
		log.Info("endpoint discovered", "url", ep.URL, "model", ep.Model, "ready_here", ready[ep.Model])
	}
	for _, u := range ch.remove {
		if _, err := reg.RemoveEndpoint(ctx, u); err != nil {
			log.Warn("endpoint discovery: unregister", "url", u, "err", err)
			continue
		}
		log.Info("endpoint removed: its server stopped answering", "url", u, "misses", misses[u])
	}
}
