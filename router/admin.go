package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/pprof"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/warmfleet/warmfleet/internal/bearer"
	"github.com/warmfleet/warmfleet/internal/ui"
	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/oai"
)

// BackendState is one backend as GET /admin/state shows it.
type BackendState struct {
	URL          string   `json:"url"`
	Models       []string `json:"models,omitempty"`
	Node         string   `json:"node,omitempty"`
	Ready        bool     `json:"ready"`
	HoldsWeights bool     `json:"holds_weights"`
	Weight       float64  `json:"weight"`
	Speed        float64  `json:"speed,omitempty"` // configured (BackendConfig.Speed)
	Inflight     int      `json:"inflight"`
	Prefilling   int      `json:"prefilling"`     // in flight, no first byte yet
	PendingBlock int      `json:"pending_blocks"` // estimated prompt blocks queued for prefill
	// PeerInflight and PeerPending are what peer replicas told of (Observe).
	PeerInflight int     `json:"peer_inflight"`
	PeerPending  int     `json:"peer_pending_blocks"`
	Recent       float64 `json:"recent_traffic"` // decayed request count (traffic-share bound)
	Limit        int     `json:"limit"`
	// Slots are its engine's sequence slots (0: unknown) and SlotWait
	// how long a request sent now would wait for one, in blocks of
	// prefill (0: a slot is free, or the router does not yet know).
	Slots        int       `json:"slots"`
	SlotWait     int       `json:"slot_wait_blocks"`
	IndexBlocks  int       `json:"index_blocks"`
	IndexCap     int       `json:"index_capacity"`
	EjectedUntil time.Time `json:"ejected_until,omitzero"`
	Failures     int       `json:"failures"`
	// Requests, PromptBlocks and HitRate (the share of those blocks the
	// backend was expected to hold cached) count since the router started;
	// TTFT is the time to its first response byte over its latest requests.
	Requests     uint64   `json:"requests"`
	PromptBlocks uint64   `json:"prompt_blocks"`
	HitRate      float64  `json:"hit_rate"`
	TTFT         *Latency `json:"ttft,omitempty"`
}

// State is a snapshot for operators.
type State struct {
	Strategy balance.Strategy            `json:"strategy"`
	Models   map[string]balance.Strategy `json:"models"`
	Queued   int                         `json:"queued"`
	// SlotTurn is a request's mean time in its engine's sequence slot and
	// PrefillBlock a prompt block's mean prefill time, in seconds, as the
	// router learned them to price slot waits (0 until it has).
	SlotTurn     float64 `json:"slot_turn_seconds"`
	PrefillBlock float64 `json:"prefill_block_seconds"`
	// PrefillOverlap is the share of the prefill queued on a backend
	// that a new prompt was seen not to wait for (0: the engines prefill
	// one prompt after another; 1: side by side), and PrefillSlowdown
	// how much each request running beside a prompt stretches its
	// prefill as far as the fit is sure of it (its estimate less two
	// standard errors), as prefix-aware prices them (0 and 0 until
	// learned).
	PrefillOverlap  float64        `json:"prefill_overlap"`
	PrefillSlowdown float64        `json:"prefill_slowdown"`
	Backends        []BackendState `json:"backends"`
}

// Snapshot returns the current state.
func (rt *Router) Snapshot() State {
	// The first-byte samples are copied under the lock and summarized
	// after it: sorting every backend's window would hold up routing.
	var ttft [][]time.Duration
	st := rt.snapshot(&ttft)
	for i := range st.Backends {
		st.Backends[i].TTFT = latency(ttft[i])
	}
	return st
}

func (rt *Router) snapshot(ttft *[][]time.Duration) State {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := rt.now()
	st := State{Strategy: rt.cfg.Strategy, Models: map[string]balance.Strategy{}, Queued: rt.queued}
	for m, mc := range rt.cfg.Models {
		st.Models[m] = mc.Strategy
	}
	clock := rt.slotClockLocked(false)
	if clock.known() {
		st.SlotTurn, st.PrefillBlock = clock.turn(), clock.blockSec()
	}
	st.PrefillOverlap, st.PrefillSlowdown = clock.contention.shares()
	for _, b := range rt.order {
		st.Backends = append(st.Backends, BackendState{URL: b.url, Models: b.ep.Models, Node: b.ep.Node, Ready: b.ep.Ready,
			HoldsWeights: b.ep.HoldsWeights, Weight: rampWeight(&b.ep, now, rt.cfg.RampUp), Speed: b.ep.Speed, Inflight: b.inflight, Prefilling: b.prefilling,
			PendingBlock: b.pending, PeerInflight: b.peers.inflight, PeerPending: b.peers.pending, Recent: b.recent, Limit: int(b.limit),
			Slots: int(b.slots), SlotWait: clock.wait(b, now),
			IndexBlocks: rt.index.Len(b.slot), IndexCap: b.kvSize, EjectedUntil: b.ejectedUntil, Failures: b.failures,
			Requests: b.stats.requests, PromptBlocks: b.stats.promptBlocks, HitRate: b.stats.hitRate()})
		*ttft = append(*ttft, slices.Clone(b.stats.ttft))
	}
	return st
}

// AdminHandler serves /metrics (from gatherer), GET /admin/state, the
// status page (GET /ui, polling GET /ui/router.json: the same state), PUT
// /admin/strategy {"model":"","strategy":"random"} and, if reload is not
// nil, POST /admin/reload, and Go's profiles under /debug/pprof/ (the heap
// profile with ?gc=1 collects first, so its MemStats say what is live).
// Serve it on a separate, private listener. With a token, all but /healthz
// and /readyz (for orchestrators' probes) need it as a bearer token.
func (rt *Router) AdminHandler(gatherer prometheus.Gatherer, reload func() error, token string) http.Handler {
	mux := http.NewServeMux()
	if gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /admin/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rt.Snapshot())
	})
	ui.Mount(mux, "router", func() (any, error) { return rt.Snapshot(), nil })
	mountPprof(mux)
	mux.HandleFunc("PUT /admin/strategy", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Model    string `json:"model"`
			Strategy string `json:"strategy"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			oai.WriteError(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "invalid_request", Message: "invalid JSON: " + err.Error()})
			return
		}
		if err := rt.SetStrategy(in.Model, balance.Strategy(in.Strategy)); err != nil {
			oai.WriteError(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "invalid_strategy", Message: err.Error()})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	if reload != nil {
		mux.HandleFunc("POST /admin/reload", func(w http.ResponseWriter, r *http.Request) {
			if err := reload(); err != nil {
				oai.WriteError(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "reload_failed", Message: err.Error()})
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})
	}
	return rt.ownPaths(bearer.Require(token, mux, func(w http.ResponseWriter) {
		oai.WriteError(w, &oai.APIError{Status: http.StatusUnauthorized, Type: oai.TypeInvalidRequest, Code: "unauthorized",
			Message: "missing or wrong bearer token"})
	}))
}

// mountPprof serves net/http/pprof on mux (not on http.DefaultServeMux,
// which the API listener must never expose).
func mountPprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
