package router

import (
	"slices"
	"sync"
	"time"
)

// Endpoint is one inference server as the router sees it. The gossip layer
// will publish one per (node, endpoint) registered with `warmfleet endpoint add`.
type Endpoint struct {
	URL    string   // base URL, e.g. http://10.0.0.7:8000
	Models []string // models it serves; empty means any
	Node   string   // node name, for display
	// ID is the backend's identity in rendezvous hashing (which backend a
	// new prefix group goes to); empty means URL. Replicas of one router
	// must see the same IDs, so set it where they reach a backend by
	// different URLs.
	ID string
	// Ready: the model is loaded and serving on this node. Endpoints not
	// ready get no traffic.
	Ready bool
	// HoldsWeights: the node has the weights in its local cache; preferred
	// among otherwise equal choices.
	HoldsWeights bool
	// ReadySince is when Ready became true; traffic ramps up from then over
	// Config.RampUp. Zero means long ago (full share at once).
	ReadySince    time.Time
	MaxInflight   int // 0: Config.MaxInflight
	MaxNumSeqs    int // its engine's sequence slots; 0: Config.MaxNumSeqs
	KVCacheTokens int // 0: learned from the backend's KV events, its metrics, or Config.KVCacheTokens
	// KVEvents is the engine's KV-event address (BackendConfig.KVEvents);
	// empty: it publishes none.
	KVEvents string
	// Speed is the engine's speed relative to the fleet's usual backend
	// (BackendConfig.Speed); 0: 1.
	Speed float64
}

// EndpointSource is what the router needs from discovery: the current set
// and a channel closed when it changes (then call Endpoints again). The
// gossip layer implements it; StaticSource serves flags and config files.
type EndpointSource interface {
	Endpoints() ([]Endpoint, <-chan struct{})
}

// StaticSource is an EndpointSource over a list set by the caller (flags,
// config file, reloads).
type StaticSource struct {
	mu      sync.Mutex
	eps     []Endpoint
	changed chan struct{}
	now     func() time.Time
}

// NewStaticSource returns a source holding eps; endpoints without a
// ReadySince are treated as settled.
func NewStaticSource(eps []Endpoint, now func() time.Time) *StaticSource {
	if now == nil {
		now = time.Now
	}
	return &StaticSource{eps: slices.Clone(eps), changed: make(chan struct{}), now: now}
}

// Endpoints implements EndpointSource.
func (s *StaticSource) Endpoints() ([]Endpoint, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.eps), s.changed
}

// Set replaces the list. Endpoints that become ready (new ones, once some
// others exist, and known ones whose Ready flips on) start their ramp-up
// now unless they carry their own ReadySince; the others keep theirs.
func (s *StaticSource) Set(eps []Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := map[string]Endpoint{}
	for _, e := range s.eps {
		old[e.URL] = e
	}
	next := slices.Clone(eps)
	for i := range next {
		if !next[i].ReadySince.IsZero() {
			continue // the caller knows better
		}
		prev, known := old[next[i].URL]
		switch {
		case known && prev.Ready == next[i].Ready:
			next[i].ReadySince = prev.ReadySince
		case next[i].Ready && (known || len(s.eps) > 0):
			// Newly ready, or new while others already serve: ramp up.
			next[i].ReadySince = s.now()
		}
	}
	s.eps = next
	close(s.changed)
	s.changed = make(chan struct{})
}

// StaticEndpoints converts configured backends (already validated).
func StaticEndpoints(cfg *Config) []Endpoint {
	eps := make([]Endpoint, 0, len(cfg.Backends))
	for _, b := range cfg.Backends {
		u, err := ParseBackendURL(b.URL)
		if err != nil {
			continue
		}
		warm := b.HoldsWeights == nil || *b.HoldsWeights
		eps = append(eps, Endpoint{URL: u, ID: b.ID, Models: slices.Clone(b.Models), Ready: true, HoldsWeights: warm,
			MaxInflight: b.MaxInflight, MaxNumSeqs: b.MaxNumSeqs, KVCacheTokens: b.KVCacheTokens, KVEvents: b.KVEvents, Speed: b.Speed})
	}
	return eps
}
