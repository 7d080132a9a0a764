// Package ui serves the fleet status page: one HTML file with its CSS and
// JavaScript inline, embedded in the binary, so it works offline and loads
// nothing from elsewhere. The page polls a JSON snapshot about once a
// second and renders it as tables:
//
//   - on the daemon's metrics listener, the snapshot is the fleet as that
//     daemon sees it (what `warmfleet fleet` prints: members and health, each
//     node's caches and images with state and progress, bytes read from S3
//     and exchanged with peers, free cache space);
//   - on the router's admin listener, it is the router's state: per backend
//     the requests in flight, the prefix hit rate and first-byte latency
//     percentiles.
//
// The page renders whichever of the two it is given. Both endpoints are GET
// only: another method is refused with 405 by net/http's ServeMux, so the
// page may be served where nothing that changes state may be, and it
// inherits the authentication of the listener it is mounted on.
package ui

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
)

//go:embed page.html
var page []byte

// dataPlaceholder is where the page names its snapshot's URL, filled in by
// Mount so one page serves both listeners.
const dataPlaceholder = "@DATA@"

var validName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// Mount adds GET /ui (the page) and GET /ui/NAME.json (snapshot's value as
// JSON) to mux. A snapshot error is answered 503 with the error's text, and
// the page shows it until a later poll succeeds.
func Mount(mux *http.ServeMux, name string, snapshot func() (any, error)) {
	if !validName.MatchString(name) {
		panic(fmt.Sprintf("ui: snapshot name %q: want lower-case letters, digits and dashes", name))
	}
	html := bytes.Replace(page, []byte(dataPlaceholder), []byte("ui/"+name+".json"), 1)
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		// The page loads nothing from anywhere else, and may not.
		h.Set("Content-Security-Policy", "default-src 'none'; connect-src 'self'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		_, _ = w.Write(html)
	})
	mux.HandleFunc("GET /ui/"+name+".json", func(w http.ResponseWriter, _ *http.Request) {
		v, err := snapshot()
		var body []byte
		if err == nil {
			body, err = json.Marshal(v)
		}
		w.Header().Set("Cache-Control", "no-store")
		if err != nil {
			http.Error(w, "snapshot: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}
