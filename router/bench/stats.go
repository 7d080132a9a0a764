package bench

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const overflowPrefix = "overflow/"

// kvPrefix marks the KV-event scorings among the reasons (kv/exact, kv/approximate).
const kvPrefix = "kv/"

// reasons sums the router's decisions by reason, and its overflows by the
// bound that caused them ("overflow/load", say).
func reasons(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	fams, err := reg.Gather()
	if err != nil {
		return out
	}
	series := map[string]struct{ label, prefix string }{
		"warmfleet_router_decisions_total": {"reason", ""},
		"warmfleet_router_overflows_total": {"bound", overflowPrefix},
		// Not decisions: how each backend publishing KV events was scored.
		"warmfleet_router_kv_scored_total": {"view", kvPrefix},
	}
	for _, f := range fams {
		s, ok := series[f.GetName()]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == s.label {
					out[s.prefix+l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

type simStats struct {
	hits, queries []float64
	requests      []float64
	generated     []float64 // output tokens
}

// minus is what happened between an earlier scrape b and s.
func (s simStats) minus(b simStats) simStats {
	sub := func(x, y []float64) []float64 {
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] - y[i]
		}
		return out
	}
	return simStats{hits: sub(s.hits, b.hits), queries: sub(s.queries, b.queries), requests: sub(s.requests, b.requests),
		generated: sub(s.generated, b.generated)}
}

func (s simStats) hitRate() float64 {
	h, q := 0.0, 0.0
	for i := range s.hits {
		h += s.hits[i]
		q += s.queries[i]
	}
	if q == 0 {
		return 0
	}
	return h / q
}

// computed is each backend's prompt tokens not served from its cache.
func (s simStats) computed() []float64 {
	out := make([]float64, len(s.queries))
	for i := range s.queries {
		out[i] = s.queries[i] - s.hits[i]
	}
	return out
}

// busiest is the largest value over the mean.
func busiest(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	top, sum := 0.0, 0.0
	for _, r := range xs {
		top = max(top, r)
		sum += r
	}
	if sum == 0 {
		return 0
	}
	return top / (sum / float64(len(xs)))
}

// scrape reads the simulators' own vLLM-style metrics over HTTP.
func scrape(ctx context.Context, c *http.Client, urls []string) (simStats, error) {
	var st simStats
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		if err != nil {
			return st, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return st, fmt.Errorf("scrape %s: %w", u, err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return st, fmt.Errorf("scrape %s: %w", u, err)
		}
		sum := func(name string) float64 {
			total := 0.0
			if f := fams[name]; f != nil {
				for _, m := range f.GetMetric() {
					total += m.GetCounter().GetValue()
				}
			}
			return total
		}
		// llm-d-inference-sim names its prefix cache counters without
		// the _total suffix vLLM (and llmsim) use.
		st.hits = append(st.hits, sum("vllm:prefix_cache_hits_total")+sum("vllm:prefix_cache_hits"))
		st.queries = append(st.queries, sum("vllm:prefix_cache_queries_total")+sum("vllm:prefix_cache_queries"))
		st.requests = append(st.requests, sum("vllm:request_success_total"))
		st.generated = append(st.generated, sum("vllm:generation_tokens_total")+sum("vllm:generation_tokens"))
	}
	return st, nil
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	return quantileSorted(s, q)
}

// quantileSorted is quantile of xs sorted ascending (not empty).
func quantileSorted(xs []float64, q float64) float64 {
	return xs[int(q*float64(len(xs)-1))]
}
