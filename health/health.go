// Package health serves a process's probes and Prometheus metrics: the
// read-only endpoints that kubelet, systemd's tooling and a Prometheus
// scraper need, on the API and on a listener of their own.
//
// The endpoints:
//
//   - GET /healthz answers 200 while the process can serve HTTP at all: a
//     liveness probe that restarts a process that fails it.
//   - GET /readyz answers 200 when every readiness condition holds, else 503
//     with the first condition that does not and why, one line of text.
//   - GET /metrics is the Prometheus text exposition of a gatherer.
//
// Nothing else is served: another method on those paths is refused with 405
// (net/http's ServeMux answers it, with an Allow header) and any other path
// is 404. A listener that serves only these endpoints can therefore be left
// without authentication: it changes nothing and shows only what metrics
// show.
package health

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Mount adds /healthz, /readyz and /metrics to mux; ready reports why the
// process is not ready, or nil.
func Mount(mux *http.ServeMux, g prometheus.Gatherer, ready func() error) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
}

// Readiness is an ordered list of named conditions, all of which must hold
// for the process to be ready. Conditions may be added while it is served.
type Readiness struct {
	mu     sync.Mutex
	checks []check
}

type check struct {
	name string
	fn   func() error
}

// Add appends a condition; fn returns why it does not hold, or nil.
func (r *Readiness) Add(name string, fn func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks = append(r.checks, check{name, fn})
}

// Err returns the first condition that does not hold, as "name: why", or
// nil when all hold. Conditions are checked in the order they were added,
// so the reason names the earliest step of start-up still missing.
func (r *Readiness) Err() error {
	r.mu.Lock()
	checks := r.checks
	r.mu.Unlock()
	for _, c := range checks {
		if err := c.fn(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// Listen opens addr (host:port) for the metrics listener. It is opened
// before anything else of the process starts, so a busy or bad address
// stops the process instead of leaving it running unobservable.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	return ln, nil
}

// Server serves h with the timeouts a probe endpoint needs: probes and
// scrapes are small, so a client that stalls or idles is cut off.
func Server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
}
