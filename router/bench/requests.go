package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/balance"
)

// RequestRecord is one request of a strategy's open-loop run as
// Options.RequestsOut receives it (JSON, a line each): what the router
// decided for it and what it cost, to find which requests make a tail.
type RequestRecord struct {
	Workload string           `json:"workload"`
	Strategy balance.Strategy `json:"strategy"`
	Request  int              `json:"request"` // its index in arrival order
	At       float64          `json:"at_s"`    // its arrival, from the run's start
	Prompt   int              `json:"prompt_tokens"`
	MaxTok   int              `json:"max_tokens"`
	// Backend is the index of the backend it went to (-1: unknown, the
	// request failed before a backend answered); Reason and Matched are
	// the router's explanation (matched: expected cached blocks over the
	// prompt's).
	Backend int     `json:"backend"`
	Reason  string  `json:"reason,omitempty"`
	Matched string  `json:"matched,omitempty"`
	TTFT    float64 `json:"ttft_s,omitempty"` // 0 where it failed
	Status  int     `json:"status,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// writeRequests writes one RequestRecord per request of reqs, whose
// outcomes are outs, to w, each TTFT as sr.ByRequest counted it (tally):
// urls are the backends in index order.
func writeRequests(w io.Writer, workload string, sr *StrategyResult, urls []string, reqs []Request, outs []outcome) error {
	enc := json.NewEncoder(w)
	for i := range outs {
		o, r := &outs[i], &reqs[i]
		route := router.ParseRoute(o.route)
		rec := RequestRecord{Workload: workload, Strategy: sr.Strategy, Request: i, At: r.At.Seconds(), Prompt: r.PromptTokens, MaxTok: r.OutTokens,
			Backend: slices.Index(urls, route["backend"]), Reason: route["reason"], Matched: route["matched"], Status: o.status}
		if t := sr.ByRequest[i]; !math.IsNaN(t) {
			rec.TTFT = t
		}
		if o.err != nil {
			rec.Error = o.err.Error()
		}
		if err := enc.Encode(&rec); err != nil {
			return fmt.Errorf("bench: requests out: %w", err)
		}
	}
	return nil
}
