// Package s3fault is a reverse proxy to put in front of an S3 server in
// tests and labs: it injects the faults real S3 shows under load
// (throttling with 503 SlowDown, connections reset in the middle of a body)
// on demand, counts what it saw and logs what clients asked for. Unit tests
// serve it on loopback (Start); a netlab lab serves it on its S3 host
// (netlabtest.FaultFront). It is test support: the product must not import
// it (cmd/warmfleet/deps_test.go forbids integration/...).
package s3fault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a reverse proxy in front of an S3 server that injects the
// faults real S3 shows under load: throttling (503 SlowDown) and connections
// that break in the middle of a body. Faults are armed at run time and each
// one is used up when it fires, so a test can say "the next 3 requests are
// throttled" and then watch the client recover.
//
// The proxy keeps the client's Host header, so SigV4 signatures made for the
// proxy's address stay valid at the server.
type Proxy struct {
	rp *httputil.ReverseProxy

	slowDownLeft atomic.Int64
	slowGETsLeft atomic.Int64
	resetLeft    atomic.Int64
	resetAfter   atomic.Int64

	requests   atomic.Int64
	gets       atomic.Int64
	slowDowns  atomic.Int64
	resets     atomic.Int64
	bodyBytes  atomic.Int64
	logMu      sync.Mutex
	log        []string
	listenAddr string
	srv        *http.Server
	serveDone  chan struct{}
}

// New returns the proxy as an http.Handler forwarding to target
// (http://host:port); serve it on any listener. Listen also
// listens.
func New(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fault proxy target %q: want http://host:port", target)
	}
	p := &Proxy{}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = r.In.Host // the signature covers Host
		},
		Transport: &http.Transport{
			Proxy:               nil,
			DisableCompression:  true,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		},
		// A cut connection is the point of the exercise, not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	return p, nil
}

// Listen serves a Proxy for target on addr ("127.0.0.1:0"
// picks a free loopback port). Close stops it.
func Listen(addr, target string) (*Proxy, error) {
	p, err := New(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fault proxy listen %s: %w", addr, err)
	}
	p.listenAddr = ln.Addr().String()
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	p.serveDone = make(chan struct{})
	go func() {
		defer close(p.serveDone)
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// Start is Listen on loopback for a test, closed at
// cleanup.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// Addr is the listening host:port (empty for a bare handler).
func (p *Proxy) Addr() string { return p.listenAddr }

// URL is the endpoint clients use, for example http://127.0.0.1:41235.
func (p *Proxy) URL() string { return "http://" + p.listenAddr }

// Close stops a listening proxy and its connections.
func (p *Proxy) Close() error {
	if p.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	if err != nil {
		err = p.srv.Close()
	}
	<-p.serveDone
	return err
}

// SlowDown makes the next n requests fail with 503 SlowDown.
func (p *Proxy) SlowDown(n int) { p.slowDownLeft.Store(int64(n)) }

// SlowDownGETs makes the next n GET requests fail with 503 SlowDown and
// lets other requests (HEAD, LIST is a GET too) through. Use it to throttle
// downloads after their HEAD.
func (p *Proxy) SlowDownGETs(n int) { p.slowGETsLeft.Store(int64(n)) }

// ResetAfter makes the next n successful GET responses (200 or 206) break
// with a TCP reset after k body bytes. A response of at most k bytes is
// passed through and does not use up a fault.
func (p *Proxy) ResetAfter(k int64, n int) {
	p.resetAfter.Store(k)
	p.resetLeft.Store(int64(n))
}

// PassThrough disarms every pending fault.
func (p *Proxy) PassThrough() {
	p.slowDownLeft.Store(0)
	p.slowGETsLeft.Store(0)
	p.resetLeft.Store(0)
}

// Stats counts what the proxy saw and did.
type Stats struct {
	Requests  int64 // every request, including faulted ones
	GETs      int64
	SlowDowns int64 // 503s answered
	Resets    int64 // connections cut mid-body
	// BodyBytes counts response body bytes the proxy sent. A reset
	// discards what the client had not read yet, so after resets a client
	// may have received fewer.
	BodyBytes int64
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Requests:  p.requests.Load(),
		GETs:      p.gets.Load(),
		SlowDowns: p.slowDowns.Load(),
		Resets:    p.resets.Load(),
		BodyBytes: p.bodyBytes.Load(),
	}
}

// take uses up one armed fault, if any is left.
func take(c *atomic.Int64) bool {
	for {
		n := c.Load()
		if n <= 0 {
			return false
		}
		if c.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

const slowDownBody = `<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>%d</RequestId><HostId>warmfleet-fault-proxy</HostId></Error>`

// maxLog bounds the request log.
const maxLog = 10000

// Log returns "METHOD /path Range" for each request so far (the last
// 10000), for tests that check what a client asked for.
func (p *Proxy) Log() []string {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	return slices.Clone(p.log)
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := p.requests.Add(1)
	p.logMu.Lock()
	if len(p.log) == maxLog {
		p.log = slices.Delete(p.log, 0, 1)
	}
	p.log = append(p.log, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+r.Header.Get("Range")))
	p.logMu.Unlock()
	if take(&p.slowDownLeft) || (r.Method == http.MethodGet && take(&p.slowGETsLeft)) {
		p.slowDowns.Add(1)
		body := fmt.Sprintf(slowDownBody, id)
		w.Header().Set("Content-Type", "application/xml")
		w.Header().Set("Retry-After", "1")
		w.Header().Set("x-amz-request-id", strconv.FormatInt(id, 10))
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusServiceUnavailable)
		if r.Method != http.MethodHead {
			_, _ = io.WriteString(w, body)
		}
		return
	}
	cw := &cutWriter{ResponseWriter: w, p: p}
	if r.Method == http.MethodGet {
		p.gets.Add(1)
		if p.resetLeft.Load() > 0 {
			cw.armed = true
			cw.cutAt = p.resetAfter.Load()
		}
	}
	p.rp.ServeHTTP(cw, r)
}

var errCut = errors.New("fault proxy: connection reset on purpose")

// cutWriter forwards a response and, when armed, resets the connection once
// cutAt body bytes have gone out.
type cutWriter struct {
	http.ResponseWriter
	p       *Proxy
	armed   bool
	cutAt   int64
	written int64
	cut     bool
}

func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *cutWriter) WriteHeader(code int) {
	if code != http.StatusOK && code != http.StatusPartialContent {
		w.armed = false
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *cutWriter) Write(b []byte) (int, error) {
	if w.cut {
		return 0, errCut
	}
	if !w.armed || w.written+int64(len(b)) <= w.cutAt {
		n, err := w.ResponseWriter.Write(b)
		w.written += int64(n)
		w.p.bodyBytes.Add(int64(n))
		return n, err
	}
	if !take(&w.p.resetLeft) {
		w.armed = false
		return w.Write(b)
	}
	room := w.cutAt - w.written
	n, err := w.ResponseWriter.Write(b[:room])
	w.written += int64(n)
	w.p.bodyBytes.Add(int64(n))
	w.cut = true
	w.p.resets.Add(1)
	if err == nil {
		w.reset()
	}
	return n, errCut
}

// reset sends what was written, then closes the socket with SO_LINGER 0 so
// the client sees ECONNRESET rather than a clean end of stream.
func (w *cutWriter) reset() {
	rc := http.NewResponseController(w.ResponseWriter)
	_ = rc.Flush()
	conn, buf, err := rc.Hijack()
	if err != nil {
		return
	}
	_ = buf.Flush()
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}
