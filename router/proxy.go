package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
	"github.com/warmfleet/warmfleet/router/oai"
)

// Request and response headers the router reads or writes.
const (
	DebugRequestHeader = "X-Warmfleet-Debug" // any non-empty value asks for an explanation
	RouteHeader        = "X-Warmfleet-Route" // the explanation
)

// removeHop drops connection-scoped headers, which are never forwarded.
func removeHop(h http.Header) {
	hopHeaders := [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}
	for _, f := range h["Connection"] {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// statusWriter remembers the status and first-byte time.
type statusWriter struct {
	http.ResponseWriter
	status    int
	firstByte time.Time
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.firstByte.IsZero() && len(p) > 0 {
		w.firstByte = time.Now()
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP implements http.Handler.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	strategy := ""
	defer func() {
		if sw.status == 0 {
			// The handler ended without answering (client gone): record as 499.
			sw.status = 499
		}
		rt.metrics.duration.WithLabelValues(strconv.Itoa(sw.status)).Observe(time.Since(start).Seconds())
		if !sw.firstByte.IsZero() && strategy != "" {
			rt.metrics.ttfb.WithLabelValues(strategy).Observe(sw.firstByte.Sub(start).Seconds())
		}
	}()
	switch r.URL.Path {
	case "/v1/completions", "/v1/chat/completions":
		if r.Method != http.MethodPost {
			rt.fail(sw, &oai.APIError{Status: http.StatusMethodNotAllowed, Type: oai.TypeInvalidRequest,
				Code: "method_not_allowed", Message: "use POST for " + r.URL.Path})
			return
		}
		strategy = rt.inference(sw, r)
	case "/v1/models":
		if r.Method == http.MethodGet {
			rt.models(sw, r)
			return
		}
		rt.passthrough(sw, r)
	default:
		rt.passthrough(sw, r)
	}
}

func (rt *Router) fail(w http.ResponseWriter, e *oai.APIError) {
	rt.metrics.rejected.WithLabelValues(strconv.Itoa(e.Status)).Inc()
	oai.WriteError(w, e)
}

// readBody reads at most MaxBodyBytes within BodyTimeout.
//
// The buffer is not pooled: the transport may still be writing a request
// body after RoundTrip returns and only a Close says when it is done, but a
// body with its own Close is not one net/http recognises as in memory, so
// it flushes the headers separately and has net copy the body through a
// freshly allocated buffer: more garbage and a write more than this
// allocation, measured (see the bench's overhead phase).
func (rt *Router) readBody(w http.ResponseWriter, r *http.Request, cfg *Config) ([]byte, *oai.APIError) {
	tooLarge := func() *oai.APIError { // built only when needed: no garbage per request
		return &oai.APIError{Status: http.StatusRequestEntityTooLarge, Type: oai.TypeInvalidRequest, Code: "request_too_large",
			Message: fmt.Sprintf("request body exceeds the router's limit of %d bytes", cfg.MaxBodyBytes)}
	}
	if r.ContentLength > cfg.MaxBodyBytes {
		return nil, tooLarge()
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(cfg.BodyTimeout))
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	var body []byte
	var err error
	if r.ContentLength > 0 {
		// Known size: one allocation, then make sure nothing follows.
		body = make([]byte, r.ContentLength)
		if _, err = io.ReadFull(r.Body, body); err == nil {
			var extra [1]byte
			if n, _ := r.Body.Read(extra[:]); n > 0 {
				return nil, tooLarge()
			}
		}
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, cfg.MaxBodyBytes+1))
	}
	if err != nil {
		return nil, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "body_read_error",
			Message: "could not read the request body: " + err.Error()}
	}
	if int64(len(body)) > cfg.MaxBodyBytes {
		return nil, tooLarge()
	}
	return body, nil
}

// inference routes a completions or chat completions request and returns
// the strategy used ("" if the request was refused before routing).
func (rt *Router) inference(w *statusWriter, r *http.Request) string {
	cfg := rt.Config()
	body, apiErr := rt.readBody(w, r, &cfg)
	if apiErr != nil {
		if apiErr.Status == http.StatusRequestEntityTooLarge {
			// The rest of the body is unread: close rather than drain it.
			w.Header().Set("Connection", "close")
		}
		rt.fail(w, apiErr)
		return ""
	}
	start := time.Now()
	model, kp, err := rt.scanKeys(&cfg, body, r.Header.Get(cfg.SessionHeader))
	if err != nil {
		msg := "invalid JSON body: " + err.Error()
		if !oai.IsSyntax(err) {
			msg = "invalid request: " + err.Error()
		}
		rt.fail(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "invalid_request", Message: msg})
		return ""
	}
	if model == "" {
		rt.fail(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "missing_model",
			Param: "model", Message: "you must provide a model parameter"})
		return ""
	}
	defer rt.putKeys(kp)
	rr := &routeRequest{model: model, keys: *kp, strategy: cfg.StrategyFor(model), hashTime: time.Since(start)}
	rt.forward(w, r, body, rr, &cfg)
	return string(rr.strategy)
}

// passthrough proxies any other path to a backend chosen by load, restricted
// to the model named in a JSON body if there is one.
func (rt *Router) passthrough(w *statusWriter, r *http.Request) {
	cfg := rt.Config()
	body, apiErr := rt.readBody(w, r, &cfg)
	if apiErr != nil {
		if apiErr.Status == http.StatusRequestEntityTooLarge {
			w.Header().Set("Connection", "close")
		}
		rt.fail(w, apiErr)
		return
	}
	model := ""
	if len(body) > 0 {
		if m, err := rt.scanModel(body); err == nil {
			model = m
		}
	}
	rr := &routeRequest{model: model, strategy: balance.LeastOutstanding}
	rt.forward(w, r, body, rr, &cfg)
}

// forward picks a backend, sends the original bytes, streams the answer
// back, and retries on another backend when the request could not be sent.
func (rt *Router) forward(w *statusWriter, r *http.Request, body []byte, rr *routeRequest, cfg *Config) {
	debug := cfg.DebugHeader && r.Header.Get(DebugRequestHeader) != ""
	for attempt := 1; ; attempt++ {
		got, err := rt.acquire(r.Context(), rr)
		switch {
		case errors.Is(err, errNoBackend):
			rt.fail(w, &oai.APIError{Status: http.StatusServiceUnavailable, Type: oai.TypeServer, Code: "no_backend",
				Message: "no healthy backend is available for this model", RetryAfter: rt.retryAfter()})
			return
		case errors.Is(err, errFull):
			rt.fail(w, &oai.APIError{Status: http.StatusTooManyRequests, Type: oai.TypeRateLimit, Code: "overloaded",
				Message: "every backend for this model is at its concurrency limit; retry later", RetryAfter: time.Second})
			return
		case err != nil: // the client went away while queued
			return
		}
		sent, ferr := rt.send(w, r, body, &got, debug, attempt)
		rt.release(&got)
		if sent {
			return
		}
		rr.tried = append(rr.tried, got.b)
		if attempt > cfg.MaxRetries {
			rt.fail(w, &oai.APIError{Status: http.StatusBadGateway, Type: oai.TypeServer, Code: "backend_unreachable",
				Message: fmt.Sprintf("could not reach a backend after %d attempts", attempt), RetryAfter: rt.retryAfter()})
			return
		}
		rt.log.Debug("retrying on another backend", "backend", got.b.url, "err", ferr)
	}
}

// retryAfter is how long until the first ejected backend is probed again.
func (rt *Router) retryAfter() time.Duration {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := rt.now()
	best := time.Duration(0)
	for _, b := range rt.order {
		if d := b.ejectedUntil.Sub(now); d > 0 && (best == 0 || d < best) {
			best = d
		}
	}
	return max(best, time.Second)
}

// send makes one attempt. It reports whether the request reached the
// backend (then the response, or an error, has been written to w).
func (rt *Router) send(w *statusWriter, r *http.Request, body []byte, got *routed, debug bool, attempt int) (bool, error) {
	b := got.b
	target := b.url + r.URL.Path
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
	if err != nil {
		rt.fail(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "bad_path", Message: "cannot forward this path"})
		return true, err
	}
	out.Header = r.Header.Clone()
	removeHop(out.Header)
	out.Header.Del(DebugRequestHeader)
	if ip, _, ok := strings.Cut(r.RemoteAddr, ":"); ok && ip != "" {
		if prior := out.Header.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	out.ContentLength = int64(len(body))
	if len(body) == 0 && r.ContentLength <= 0 {
		out.Body = http.NoBody
	}
	resp, err := rt.client.Do(out)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	rt.markSent(b, status, err)
	if err != nil {
		var de *dialError
		if errors.As(err, &de) {
			return false, err
		}
		if r.Context().Err() != nil {
			return true, err // the client left
		}
		rt.fail(w, &oai.APIError{Status: http.StatusBadGateway, Type: oai.TypeServer, Code: "backend_error",
			Message: "the backend failed before answering"})
		return true, err
	}
	defer resp.Body.Close()
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	removeHop(h)
	if debug {
		h.Set(RouteHeader, rt.explain(*got, attempt))
	}
	w.WriteHeader(resp.StatusCode)
	return true, rt.stream(w, resp.Body, func() { rt.prefilled(got) })
}

// stream copies the response as it arrives: each read is written and
// flushed at once, so SSE events reach the client byte for byte, unbuffered.
// first is called once, at the first byte (the backend has prefilled).
func (rt *Router) stream(w http.ResponseWriter, body io.Reader, first func()) error {
	rc := http.NewResponseController(w)
	bp := rt.bufs.Get().(*[]byte)
	defer rt.bufs.Put(bp)
	buf := *bp
	for {
		n, err := body.Read(buf)
		if n > 0 && first != nil {
			first()
			first = nil
		}
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// models answers GET /v1/models with the union of the backends' lists.
func (rt *Router) models(w *statusWriter, r *http.Request) {
	rt.mu.Lock()
	now := rt.now()
	var urls []string
	for _, b := range rt.order {
		if b.ep.Ready && !now.Before(b.ejectedUntil) {
			urls = append(urls, b.url)
		}
	}
	rt.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	type list struct {
		Data []json.RawMessage `json:"data"`
	}
	results := make([]list, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/v1/models", nil)
			if err != nil {
				return
			}
			req.Header.Set("Authorization", r.Header.Get("Authorization"))
			resp, err := rt.client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return
			}
			_ = json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&results[i])
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	merged := []json.RawMessage{}
	for _, l := range results {
		for _, m := range l.Data {
			var id struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m, &id) != nil || id.ID == "" || seen[id.ID] {
				continue
			}
			seen[id.ID] = true
			merged = append(merged, m)
		}
	}
	if len(urls) == 0 || (len(merged) == 0 && ctx.Err() != nil) {
		rt.fail(w, &oai.APIError{Status: http.StatusServiceUnavailable, Type: oai.TypeServer, Code: "no_backend",
			Message: "no backend answered the model list", RetryAfter: time.Second})
		return
	}
	out, _ := json.Marshal(map[string]any{"object": "list", "data": merged})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
