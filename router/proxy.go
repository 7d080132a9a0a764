package router

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	abort     bool // break the connection once the handler is done
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

// ServeHTTP implements http.Handler. The router answers its own paths
// (/healthz, /readyz) and forwards only Config.ForwardPaths; anything else
// is a 404 in the OpenAI error shape.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	strategy, model := "", ""
	defer func() {
		if sw.status == 0 {
			// The handler ended without answering (client gone): record as 499.
			sw.status = 499
		}
		rt.metrics.duration.WithLabelValues(strconv.Itoa(sw.status)).Observe(time.Since(start).Seconds())
		if !sw.firstByte.IsZero() && strategy != "" {
			rt.metrics.ttfb.WithLabelValues(strategy, model).Observe(sw.firstByte.Sub(start).Seconds())
		}
		if sw.abort {
			// The answer broke after it began: the only honest end is to
			// break the connection, so the client cannot take it as whole.
			panic(http.ErrAbortHandler)
		}
	}()
	if rt.serveOwn(sw, r) {
		return
	}
	cfg := rt.Config()
	if !cfg.Forwards(r.URL.Path) {
		rt.fail(sw, &oai.APIError{Status: http.StatusNotFound, Type: oai.TypeNotFound, Code: "unknown_path",
			Message: fmt.Sprintf("the router does not serve or forward %s (forwarded: %s)", r.URL.Path, strings.Join(cfg.ForwardPaths, ", "))})
		return
	}
	switch r.URL.Path {
	case "/v1/completions", "/v1/chat/completions":
		if r.Method != http.MethodPost {
			rt.fail(sw, &oai.APIError{Status: http.StatusMethodNotAllowed, Type: oai.TypeInvalidRequest,
				Code: "method_not_allowed", Message: "use POST for " + r.URL.Path})
			return
		}
		strategy, model = rt.inference(sw, r, &cfg)
	case "/v1/models":
		if r.Method == http.MethodGet {
			rt.models(sw, r)
			return
		}
		rt.passthrough(sw, r, &cfg)
	default:
		rt.passthrough(sw, r, &cfg)
	}
}

func (rt *Router) fail(w http.ResponseWriter, e *oai.APIError) {
	rt.metrics.rejected.WithLabelValues(strconv.Itoa(e.Status)).Inc()
	oai.WriteError(w, e)
}

// readBody reads at most MaxBodyBytes within BodyTimeout, counted from the
// first read however the bytes trickle in. A body still arriving after
// slowBodyAfter takes one of MaxSlowBodies slots, or is cut off at once
// when none is free: slow senders can hold at most that many requests.
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
	if r.ContentLength == 0 {
		return nil, nil
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(cfg.BodyTimeout))
	slow := rt.slowBodies.watch(w, cfg.MaxSlowBodies)
	var body []byte
	var err error
	if r.ContentLength > 0 {
		// Known size: one allocation, then make sure nothing follows (read
		// into the byte past it: a buffer of its own would escape, an
		// allocation more per request).
		buf := make([]byte, r.ContentLength+1)
		body = buf[:r.ContentLength]
		if err = slow.readFull(r.Body, body); err == nil {
			if n, _ := r.Body.Read(buf[len(body):]); n > 0 {
				slow.done()
				return nil, tooLarge()
			}
		}
	} else {
		body, err = io.ReadAll(io.LimitReader(countedReader{r.Body, slow}, cfg.MaxBodyBytes+1))
	}
	refused := slow.done()
	if err != nil {
		// The deadline stays: net/http would otherwise read what is left of
		// the body, as slowly as it comes, before sending this answer.
		if refused {
			return nil, &oai.APIError{Status: http.StatusRequestTimeout, Type: oai.TypeInvalidRequest, Code: "body_too_slow",
				Message: fmt.Sprintf("the request body is arriving too slowly and %d slow bodies are already being read", cfg.MaxSlowBodies)}
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil, &oai.APIError{Status: http.StatusRequestTimeout, Type: oai.TypeInvalidRequest, Code: "body_timeout",
				Message: fmt.Sprintf("the request body did not arrive within %v", cfg.BodyTimeout)}
		}
		return nil, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "body_read_error",
			Message: "could not read the request body: " + err.Error()}
	}
	_ = rc.SetReadDeadline(time.Time{})
	if int64(len(body)) > cfg.MaxBodyBytes {
		return nil, tooLarge()
	}
	return body, nil
}

// refuseBody answers a request whose body was not read in full. The rest
// of the body is unread: the connection closes rather than drain it.
func (rt *Router) refuseBody(w http.ResponseWriter, e *oai.APIError) {
	w.Header().Set("Connection", "close")
	rt.fail(w, e)
}

// inference routes a completions or chat completions request and returns
// the strategy used and the model's label ("" if the request was refused
// before routing).
func (rt *Router) inference(w *statusWriter, r *http.Request, cfg *Config) (strategy, modelLabel string) {
	body, apiErr := rt.readBody(w, r, cfg)
	if apiErr != nil {
		rt.refuseBody(w, apiErr)
		return "", ""
	}
	start := time.Now()
	model, kp, stream, exact, sess, err := rt.scanKeys(cfg, body, r.Header.Get(cfg.SessionHeader))
	if err != nil {
		msg := "invalid JSON body: " + err.Error()
		if !oai.IsSyntax(err) {
			msg = "invalid request: " + err.Error()
		}
		rt.fail(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "invalid_request", Message: msg})
		return "", ""
	}
	if model == "" {
		rt.fail(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "missing_model",
			Param: "model", Message: "you must provide a model parameter"})
		return "", ""
	}
	defer rt.putKeys(kp)
	rr := &routeRequest{model: model, keys: *kp, exact: exact, strategy: cfg.StrategyFor(model), session: sess, stream: stream, hashTime: time.Since(start)}
	firstByte := cfg.FirstByteTimeout
	if !stream {
		firstByte = cfg.ResponseTimeout
	}
	rt.forward(w, r, body, rr, cfg, firstByte)
	return string(rr.strategy), rr.label
}

// passthrough proxies any other path to a backend chosen by load, restricted
// to the model named in a JSON body if there is one.
func (rt *Router) passthrough(w *statusWriter, r *http.Request, cfg *Config) {
	body, apiErr := rt.readBody(w, r, cfg)
	if apiErr != nil {
		rt.refuseBody(w, apiErr)
		return
	}
	model := ""
	if len(body) > 0 {
		if m, err := rt.scanModel(body); err == nil {
			model = m
		}
	}
	rr := &routeRequest{model: model, strategy: balance.LeastOutstanding}
	rt.forward(w, r, body, rr, cfg, cfg.FirstByteTimeout)
}

// forward picks a backend, sends the original bytes, streams the answer
// back, and retries on another backend when the request could not be sent
// or the backend missed firstByte (nothing has reached the client then).
func (rt *Router) forward(w *statusWriter, r *http.Request, body []byte, rr *routeRequest, cfg *Config, firstByte time.Duration) {
	debug := cfg.DebugHeader && r.Header.Get(DebugRequestHeader) != ""
	for attempt := 1; ; attempt++ {
		got, err := rt.acquire(r.Context(), rr)
		switch {
		case errors.Is(err, errNoBackend):
			rt.fail(w, &oai.APIError{Status: http.StatusServiceUnavailable, Type: oai.TypeServer, Code: "no_backend",
				Message: err.Error(), RetryAfter: rt.retryAfter()})
			return
		case errors.Is(err, errFull):
			rt.fail(w, &oai.APIError{Status: http.StatusTooManyRequests, Type: oai.TypeRateLimit, Code: "overloaded",
				Message: "every backend for this model is at its concurrency limit; retry later", RetryAfter: time.Second})
			return
		case err != nil: // the client went away while queued
			return
		}
		a := attemptSpec{body: body, debug: debug, attempt: attempt, firstByte: firstByte, idle: cfg.IdleTimeout}
		sent, ferr := rt.send(w, r, &got, &a)
		rt.release(&got)
		if sent {
			return
		}
		rr.tried = append(rr.tried, got.b)
		if attempt > cfg.MaxRetries {
			e := &oai.APIError{Status: http.StatusBadGateway, Type: oai.TypeServer, Code: "backend_unreachable",
				Message: fmt.Sprintf("could not reach a backend after %d attempts", attempt), RetryAfter: rt.retryAfter()}
			if errors.Is(ferr, errFirstByteTimeout) {
				e.Status, e.Code = http.StatusGatewayTimeout, "backend_timeout"
				e.Message = fmt.Sprintf("no backend began its answer within %v, after %d attempts", firstByte, attempt)
			}
			rt.fail(w, e)
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

var (
	errFirstByteTimeout = errors.New("no first byte within the first-byte timeout")
	errIdleTimeout      = errors.New("no byte within the idle timeout")
)

// attemptSpec is what one attempt sends and how long it may wait.
type attemptSpec struct {
	body      []byte
	debug     bool
	attempt   int
	firstByte time.Duration // from sending until the answer's first body byte
	idle      time.Duration // between two reads of the answer after that
}

// send makes one attempt. It reports whether the request reached the
// backend (then the response, or an error, has been written to w).
//
// The answer's first bytes are read before anything is written to the
// client, so a backend that accepts the request and then stalls, or fails
// before its first byte, can still be left for another. A failure after
// that breaks the client's connection (w.abort), after an error event for
// a stream, and counts against the backend.
func (rt *Router) send(w *statusWriter, r *http.Request, got *routed, a *attemptSpec) (bool, error) {
	b := got.b
	target := b.url + r.URL.Path
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	wd := rt.newWatchdog()
	defer rt.putWatchdog(wd)
	wd.start(cancel, errFirstByteTimeout, a.firstByte)
	out, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(a.body))
	if err != nil {
		rt.fail(w, &oai.APIError{Status: http.StatusBadRequest, Type: oai.TypeInvalidRequest, Code: "bad_path", Message: "cannot forward this path"})
		return true, err
	}
	out.Header = r.Header.Clone()
	removeHop(out.Header)
	out.Header.Del(DebugRequestHeader)
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil && ip != "" { // [::1]:port too
		if prior := out.Header.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	out.ContentLength = int64(len(a.body))
	if len(a.body) == 0 && r.ContentLength <= 0 {
		out.Body = http.NoBody
	}
	resp, err := rt.client.Do(out)
	var bp *[]byte
	n, ended := 0, false
	if err == nil {
		defer resp.Body.Close()
		bp = rt.bufs.Get().(*[]byte)
		defer rt.bufs.Put(bp)
		n, err = readSome(resp.Body, *bp)
		if errors.Is(err, io.EOF) {
			ended, err = true, nil
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			return true, err // the client left
		}
		switch de, isDial := errors.AsType[*dialError](err); {
		case isDial:
			rt.markUnreachable(b, de)
			return false, err
		case errors.Is(context.Cause(ctx), errFirstByteTimeout):
			rt.markFailed(b, "first_byte_timeout", fmt.Sprintf("no first byte within %v", a.firstByte))
			return false, errFirstByteTimeout
		}
		rt.markFailed(b, "broken_before_answer", "failed before answering: "+err.Error())
		return false, err
	}
	rt.markAnswered(b, resp.StatusCode)
	rt.answered(got, resp.StatusCode)
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	removeHop(h)
	if a.debug {
		h.Set(RouteHeader, rt.explain(*got, a.attempt))
	}
	w.WriteHeader(resp.StatusCode)
	if ended {
		if _, err = w.Write((*bp)[:n]); err == nil {
			rt.ended(got)
		}
		return true, err
	}
	// The first byte is in: from now on the watchdog bounds each wait for more.
	wd.start(cancel, errIdleTimeout, a.idle)
	readErr, writeErr := rt.stream(w, resp.Body, (*bp)[:n], *bp, wd.progress)
	switch {
	case writeErr != nil || r.Context().Err() != nil:
		return true, cmp.Or(writeErr, r.Context().Err()) // the client left
	case readErr != nil:
		if errors.Is(context.Cause(ctx), errIdleTimeout) {
			readErr = errIdleTimeout
		}
		return true, rt.broken(w, b, resp, readErr)
	}
	rt.ended(got)
	return true, nil
}

// readSome reads until it has at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// broken ends an answer that failed after it began: the backend counts a
// failure, a stream gets an error event, and the connection is broken.
func (rt *Router) broken(w *statusWriter, b *backend, resp *http.Response, err error) error {
	kind := "broken_stream"
	if errors.Is(err, errIdleTimeout) {
		kind = "idle_timeout"
	}
	rt.markFailed(b, kind, "answer broken after it began: "+err.Error())
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		_, _ = w.Write(oai.ErrorEvent(&oai.APIError{Type: oai.TypeServer, Code: "backend_" + kind,
			Message: "the backend failed in the middle of its answer; the answer is incomplete"}))
		_ = http.NewResponseController(w).Flush()
	}
	w.abort = true
	return err
}

// stream writes head, then copies the rest of the response as it arrives:
// each read is written and flushed at once, so SSE events reach the client
// byte for byte, unbuffered. more is called before each read.
func (rt *Router) stream(w http.ResponseWriter, body io.Reader, head, buf []byte, more func()) (readErr, writeErr error) {
	rc := http.NewResponseController(w)
	chunk := head
	for {
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				return nil, err
			}
			if err := rc.Flush(); err != nil {
				return nil, err
			}
		}
		more()
		n, err := body.Read(buf)
		chunk = buf[:n]
		if errors.Is(err, io.EOF) {
			if _, werr := w.Write(chunk); werr != nil {
				return nil, werr
			}
			return nil, rc.Flush()
		}
		if err != nil {
			return err, nil
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
