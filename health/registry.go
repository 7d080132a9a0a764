package health

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Registry is a Prometheus registry that remembers what was registered on
// it, so the metrics reference (docs/metrics.md) is written from the real
// registrations rather than by hand.
type Registry struct {
	*prometheus.Registry
	mu         sync.Mutex
	collectors []prometheus.Collector
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{Registry: prometheus.NewRegistry()} }

// Register registers c and remembers it.
func (r *Registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister registers cs, panicking on the first that fails.
func (r *Registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters c and forgets it.
func (r *Registry) Unregister(c prometheus.Collector) bool {
	if !r.Registry.Unregister(c) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, have := range r.collectors {
		if have == c {
			r.collectors = append(r.collectors[:i], r.collectors[i+1:]...)
			break
		}
	}
	return true
}

// Collectors returns what is registered, in the order it was.
func (r *Registry) Collectors() []prometheus.Collector {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]prometheus.Collector(nil), r.collectors...)
}
