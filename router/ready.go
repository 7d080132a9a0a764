package router

import (
	"fmt"
	"io"
	"net/http"
)

// routerPaths are the paths the router answers itself on both listeners;
// they are never forwarded.
var routerPaths = []string{"/healthz", "/readyz"}

// Ready reports whether at least one backend can take a request now: it is
// ready (per its endpoint source) and not ejected. When none can, the
// reason says what the backends are doing instead.
func (rt *Router) Ready() (bool, string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := rt.now()
	notReady, ejected := 0, 0
	for _, b := range rt.order {
		switch {
		case !b.ep.Ready:
			notReady++
		case now.Before(b.ejectedUntil):
			ejected++
		default:
			return true, ""
		}
	}
	if len(rt.order) == 0 {
		return false, "no backends known"
	}
	return false, fmt.Sprintf("no routable backend: %d known, %d not ready, %d ejected after failures", len(rt.order), notReady, ejected)
}

// serveOwn answers the router's own paths and reports whether r was one.
// /healthz: the process is alive and serving. /readyz: 200 with at least
// one routable backend, else 503 and the reason.
func (rt *Router) serveOwn(w http.ResponseWriter, r *http.Request) bool {
	var ready bool
	var reason string
	switch r.URL.Path {
	case "/healthz":
		ready = true
	case "/readyz":
		ready, reason = rt.Ready()
	default:
		return false
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET or HEAD", http.StatusMethodNotAllowed)
		return true
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, reason+"\n")
		return true
	}
	_, _ = io.WriteString(w, "ok\n")
	return true
}

// ownPaths serves the router's own paths and hands the rest to next.
func (rt *Router) ownPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !rt.serveOwn(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}
