package bench

import (
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/warmfleet/warmfleet/router"
)

// newBareHop is the overhead phase's baseline: the least any proxy in front
// of the backends costs. It is net/http/httputil's reverse proxy sending
// each request to the next backend in turn over the router's own transport
// (router.NewTransport), streaming the body through unread: no body read
// whole, no scan, no hashing, no decision, no metrics. The router's latency
// less this one's is what routing costs beyond being a proxy at all; this
// one's less direct is what one more HTTP hop costs on the machine.
func newBareHop(backends []string) (http.Handler, error) {
	targets := make([]*url.URL, len(backends))
	for i, b := range backends {
		u, err := url.Parse(b)
		if err != nil {
			return nil, err
		}
		targets[i] = u
	}
	var next atomic.Uint64
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
		},
		Transport:  router.NewTransport(router.Defaults().ConnectTimeout),
		BufferPool: &bufferPool{pool: sync.Pool{New: func() any { return make([]byte, 32<<10) }}},
		ErrorLog:   log.New(io.Discard, "", 0),
	}, nil
}

// bufferPool lends the reverse proxy its copy buffers, so the baseline
// allocates no more per answer than the router does.
type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte  { return p.pool.Get().([]byte) }
func (p *bufferPool) Put(b []byte) { p.pool.Put(b) } //nolint:staticcheck // SA6002: boxing the slice header costs a few bytes; without a pool httputil allocates 32 KiB per answer

// serveBareHop serves a bare hop to backends on loopback, as the router is
// served, and returns its URL and a function that stops it.
func serveBareHop(backends []string) (string, func(), error) {
	h, err := newBareHop(backends)
	if err != nil {
		return "", nil, err
	}
	return serve(h)
}
