package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/router"
)

// The router's limits in routerRows: small, so a handful of clients
// reaches them.
const (
	rowsInflight    = 4 // per backend
	rowsSlowBodies  = 4
	rowsMaxBody     = 1 << 20
	rowsBodyTimeout = 3 * time.Second
	// rowsGoroutineSlack is what the router may hold above its idle count
	// once every client has gone: its pooled connections to the two
	// backends (two goroutines each, at most rowsInflight per backend) and
	// a few timers.
	rowsGoroutineSlack = 2*2*rowsInflight + 24
	// rowsRSSPerConn bounds the router's resident memory after a storm:
	// its idle memory and this much per connection of the storm. The
	// router runs with GOGC=400, so memory after a storm follows its peak,
	// not what is live: this bounds the cost of a storm. A leak shows in
	// the goroutine count and in the live heap (after a collection), which
	// may grow by rowsLiveSlack and rowsLivePerConn per connection of the
	// storm at most: the router's connections to the backends, and the
	// descriptor of every goroutine the storm started, which the runtime
	// keeps for reuse.
	rowsRSSPerConn  = 64 << 10
	rowsLiveSlack   = 2 << 20
	rowsLivePerConn = 1 << 10
)

// rowsConns is the size of a connection storm: short in the test suite,
// the 10k on request (Options.Long).
func rowsConns(long bool) int {
	if long {
		return 10000
	}
	return 2000
}

// rowsRig is the router scenario's lab: the product's router on h0, two
// llmsim engines (the lab binary's) on h1 and h2, clients on h3.
type rowsRig struct {
	f       *Fleet
	engines []*netlab.Process
	urls    []string
	router  *netlab.Process
	api     string
	client  *netlab.Host
	http    *http.Client
	admin   *http.Client
}

func startRows(ctx context.Context, f *Fleet) (*rowsRig, error) {
	if f.LabBin == "" {
		return nil, errors.New("no warmfleet-lab binary (Options.LabBin) for the llmsim engines")
	}
	hosts := f.Lab.Hosts()
	r := &rowsRig{f: f, client: hosts[3], api: "http://" + hosts[0].Addr(8080)}
	for _, h := range hosts[1:3] {
		// 200 tokens at 20 ms each: a stream lasts 4 s, long enough to
		// kill its engine in the middle.
		p, err := h.Start(netlab.ProcSpec{Name: "llmsim", Path: f.LabBin, Args: []string{"llmsim", "--listen", h.Addr(8000),
			"--max-seqs", fmt.Sprint(rowsInflight), "--decode-per-token", "20ms", "--default-max-tokens", "1"}})
		if err != nil {
			return nil, err
		}
		r.engines = append(r.engines, p)
		r.urls = append(r.urls, "http://"+h.Addr(8000))
	}
	cfg := fmt.Sprintf("backends:\n  - url: %s\n  - url: %s\nmax_inflight: %d\nmax_slow_bodies: %d\nbody_timeout: %v\nmax_body_bytes: %d\nqueue_timeout: 300ms\nprobe_interval: 500ms\ndebug_header: true\n",
		r.urls[0], r.urls[1], rowsInflight, rowsSlowBodies, rowsBodyTimeout, rowsMaxBody)
	path := filepath.Join(hosts[0].Dir, "router.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	p, err := hosts[0].Start(netlab.ProcSpec{Name: "router", Path: f.Bin, Args: []string{"router", "--config", path,
		"--listen", hosts[0].Addr(8080), "--admin-listen", "127.0.0.1:9180", "--log-level", "warn"}})
	if err != nil {
		return nil, err
	}
	r.router = p
	r.http = &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: r.client.NS.DialContext, MaxIdleConnsPerHost: 64}}
	// The admin listener stays on the router host's loopback, as without a
	// token it must.
	r.admin = &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: hosts[0].NS.DialContext}}
	err = wait.Until(ctx, func() error {
		status, _, err := r.complete(ctx, 1, false)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("router answers %d", status)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("router and engines up: %w", err)
	}
	return r, nil
}

func completionBody(maxTokens int, stream bool) []byte {
	return fmt.Appendf(nil, `{"model":"sim","prompt":"chaos rows %d","max_tokens":%d,"stream":%v}`, maxTokens, maxTokens, stream)
}

// complete asks for a completion and reads the whole answer.
func (r *rowsRig) complete(ctx context.Context, maxTokens int, stream bool) (int, string, error) {
	return r.post(ctx, bytes.NewReader(completionBody(maxTokens, stream)))
}

// post sends body as a completion request (chunked unless body is a
// bytes.Reader) and returns the status and the answer.
func (r *rowsRig) post(ctx context.Context, body io.Reader) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.api+"/v1/completions", body)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer), err
}

// metric reads one of the router's metrics from its admin listener.
func (r *rowsRig) metric(ctx context.Context, name string) (float64, error) {
	text, err := r.adminGet(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	v, found, err := netlab.MetricSum(text, name)
	if err == nil && !found {
		err = fmt.Errorf("router does not export %s", name)
	}
	return v, err
}

// liveHeap is the router's heap in use right after a collection: its heap
// profile with gc=1 collects first and then prints the runtime's MemStats.
// It is read twice: what sync.Pools held survives one collection (in their
// victim caches) and is dropped by the next.
func (r *rowsRig) liveHeap(ctx context.Context) (float64, error) {
	text, err := r.adminGet(ctx, "/debug/pprof/heap?gc=1&debug=1")
	if err == nil {
		text, err = r.adminGet(ctx, "/debug/pprof/heap?gc=1&debug=1")
	}
	if err != nil {
		return 0, err
	}
	const key = "\n# HeapAlloc = "
	i := strings.Index(text, key)
	if i < 0 {
		return 0, errors.New("router heap profile: no HeapAlloc line")
	}
	line, _, _ := strings.Cut(text[i+len(key):], "\n")
	v, err := strconv.ParseUint(line, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("router heap profile: %w", err)
	}
	return float64(v), nil
}

// adminGet reads path from the router's admin listener.
func (r *rowsRig) adminGet(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9180"+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := r.admin.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("router admin GET %s: %s", path, resp.Status)
	}
	return string(text), err
}

func routerRows(ctx context.Context, f *Fleet) error {
	r, err := startRows(ctx, f)
	if err != nil {
		return err
	}
	steps := []struct {
		name string
		run  func(context.Context, *rowsRig) error
	}{
		{"bad bodies", badBodies},
		{"slow bodies", slowBodies},
		{"saturated, then a backend dies mid-stream", saturatedThenDies},
		{"connection storms", func(ctx context.Context, r *rowsRig) error { return connStorms(ctx, r, rowsConns(f.Long)) }},
	}
	for _, s := range steps {
		if err := s.run(ctx, r); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if !r.router.Running() {
			return fmt.Errorf("%s: the router died", s.name)
		}
	}
	return nil
}

// badBodies: malformed JSON is a 400, a body over the limit a 413 (known
// length or chunked), and the router answers the next good request.
func badBodies(ctx context.Context, r *rowsRig) error {
	prompt := []byte(`{"model":"sim","prompt":"`)
	cases := []struct {
		name string
		body io.Reader
		want int
	}{
		{"malformed JSON", strings.NewReader(`{"model":"sim","prompt":`), http.StatusBadRequest},
		{"not an object", strings.NewReader(`[1,2,3]`), http.StatusBadRequest},
		{"oversize", bytes.NewReader(append(append(prompt, bytes.Repeat([]byte("a"), rowsMaxBody)...), `"}`...)), http.StatusRequestEntityTooLarge},
		// Without a length, the router must cut the read at its limit.
		{"chunked oversize", io.MultiReader(bytes.NewReader(prompt), io.LimitReader(letters{}, 4*rowsMaxBody)), http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		got, _, err := r.post(ctx, c.body)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if got != c.want {
			return fmt.Errorf("%s: router answered %d, want %d", c.name, got, c.want)
		}
	}
	r.f.Figure("bad_bodies_refused", float64(len(cases)))
	return r.expectOK(ctx)
}

// letters is an endless prompt.
type letters struct{}

func (letters) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

func (r *rowsRig) expectOK(ctx context.Context) error {
	status, body, err := r.complete(ctx, 1, false)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("a good request got %d: %s", status, body)
	}
	return err
}

// slowBodies: twice the slow-body slots trickle their bodies a byte at a
// time (slowloris); each gets 408, the ones past the slots at once, and a
// good request is answered meanwhile.
func slowBodies(ctx context.Context, r *rowsRig) error {
	n := 2 * rowsSlowBodies
	start := time.Now()
	statuses := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { statuses[i], errs[i] = r.slowloris(ctx) })
	}
	// While they trickle, the router serves others.
	okErr := r.expectOK(ctx)
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(append(errs, okErr)...); err != nil {
		return err
	}
	for i, s := range statuses {
		if s != http.StatusRequestTimeout {
			return fmt.Errorf("slow client %d got %d, want 408", i, s)
		}
	}
	r.f.Figure("slow_bodies_cut_seconds", took.Seconds())
	// Every trickling client was cut by the body timeout, not left to
	// trickle for as long as it liked.
	if took > 3*rowsBodyTimeout {
		return fmt.Errorf("slow clients were answered after %v, want within the body timeout (%v) and some", took, rowsBodyTimeout)
	}
	return nil
}

// slowloris sends a request whose body of 100 bytes comes a byte every
// 200 ms, and returns the status the router answers.
func (r *rowsRig) slowloris(ctx context.Context) (int, error) {
	c, err := r.client.NS.DialContext(ctx, "tcp", strings.TrimPrefix(r.api, "http://"))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(4 * rowsBodyTimeout))
	if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		return 0, err
	}
	answered := make(chan struct{})
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for range 99 {
			select {
			case <-answered:
				return
			case <-t.C:
			}
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	defer close(answered)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, fmt.Errorf("slow client: %w", err)
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// stream is one streamed completion held open.
type stream struct {
	backend string
	done    bool // ended with [DONE]
	err     error
	ended   time.Time
}

// saturatedThenDies: every backend slot is taken by a long stream; more
// requests get 429 within the queue timeout, none hangs and none is a 5xx.
// Then one engine is killed mid-stream: its streams end at once (cut, no
// [DONE]), the other engine's finish, and new requests go to the survivor.
func saturatedThenDies(ctx context.Context, r *rowsRig) error {
	slots := 2 * rowsInflight
	streams := make([]*stream, slots)
	started := make(chan struct{}, slots)
	var wg sync.WaitGroup
	for i := range slots {
		streams[i] = &stream{}
		wg.Go(func() { r.holdStream(ctx, streams[i], started) })
	}
	for range slots {
		select {
		case <-started:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	extra := 3 * slots
	statuses := make([]int, extra)
	errs := make([]error, extra)
	var ewg sync.WaitGroup
	for i := range extra {
		ewg.Go(func() { statuses[i], _, errs[i] = r.complete(ctx, 1, false) })
	}
	ewg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	refused := 0
	for _, s := range statuses {
		switch s {
		case http.StatusTooManyRequests:
			refused++
		case http.StatusOK:
		default:
			return fmt.Errorf("a request past the limits got %d, want 429 (or 200 if a slot freed)", s)
		}
	}
	r.f.Figure("saturated_429", float64(refused))
	if refused == 0 {
		return fmt.Errorf("none of %d requests past every backend's limit was refused", extra)
	}
	// Kill one engine while every stream is under way.
	victim := r.engines[0]
	if err := victim.Kill(); err != nil {
		return err
	}
	killed := time.Now()
	wg.Wait()
	cut, finished := 0, 0
	var slowest time.Duration
	for _, s := range streams {
		switch {
		case s.backend == r.urls[0]:
			if s.done {
				return errors.New("a stream from the killed engine ended with [DONE]: the client cannot tell it was cut")
			}
			cut++
			slowest = max(slowest, s.ended.Sub(killed))
		case s.err != nil || !s.done:
			return fmt.Errorf("a stream from the surviving engine (%s) broke: %v", s.backend, s.err)
		default:
			finished++
		}
	}
	r.f.Figure("midstream_cut", float64(cut))
	r.f.Figure("midstream_cut_seconds", slowest.Seconds())
	if cut == 0 || finished == 0 {
		return fmt.Errorf("%d streams cut, %d finished: want both engines to have held some", cut, finished)
	}
	// The survivor takes the traffic: every request is answered.
	for range 2 * slots {
		if err := r.expectOK(ctx); err != nil {
			return fmt.Errorf("with one engine dead: %w", err)
		}
	}
	return victim.Restart(10 * time.Second)
}

// holdStream streams a 200-token completion, noting which backend serves
// it and how it ended.
func (r *rowsRig) holdStream(ctx context.Context, s *stream, started chan<- struct{}) {
	defer func() { s.ended = time.Now() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.api+"/v1/completions", bytes.NewReader(completionBody(200, true)))
	if err != nil {
		s.err = err
		started <- struct{}{}
		return
	}
	req.Header.Set(router.DebugRequestHeader, "1")
	resp, err := r.http.Do(req)
	started <- struct{}{}
	if err != nil {
		s.err = err
		return
	}
	defer resp.Body.Close()
	s.backend = router.ParseRoute(resp.Header.Get(router.RouteHeader))["backend"]
	body, err := io.ReadAll(resp.Body)
	s.err = err
	s.done = resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte("data: [DONE]"))
}

// connStorms opens n connections at once, each asking for a completion
// and held until all are answered, twice; each answer must be a 200 or a
// 429. After each storm the router's goroutines return to their idle count
// (within rowsGoroutineSlack), its live heap within rowsLiveSlack and
// rowsLivePerConn per connection of what it was before, and its resident memory within rowsRSSPerConn per
// connection of what it was before the storms.
func connStorms(ctx context.Context, r *rowsRig, n int) error {
	idle, err := r.metric(ctx, "go_goroutines")
	if err != nil {
		return err
	}
	rssBefore, err := r.metric(ctx, "process_resident_memory_bytes")
	if err != nil {
		return err
	}
	liveBefore, err := r.liveHeap(ctx)
	if err != nil {
		return err
	}
	r.f.Figure("conns", float64(n))
	r.f.Figure("goroutines_idle", idle)
	r.f.Figure("rss_mib_before", rssBefore/(1<<20))
	r.f.Figure("live_heap_mib_before", liveBefore/(1<<20))
	var rss [2]float64
	for round := range 2 {
		peak, err := r.storm(ctx, n)
		if err != nil {
			return fmt.Errorf("storm %d: %w", round+1, err)
		}
		var after float64
		err = wait.Until(ctx, func() error {
			var err error
			if after, err = r.metric(ctx, "go_goroutines"); err == nil && after > idle+rowsGoroutineSlack {
				err = fmt.Errorf("router holds %v goroutines after %d connections closed, %v before (peak %v)", after, n, idle, peak)
			}
			return err
		}, wait.Timeout(30*time.Second))
		if err != nil {
			return fmt.Errorf("goroutines back to idle: %w", err)
		}
		if rss[round], err = r.metric(ctx, "process_resident_memory_bytes"); err != nil {
			return err
		}
		r.f.Figure(fmt.Sprintf("goroutines_peak_%d", round+1), peak)
		r.f.Figure(fmt.Sprintf("goroutines_after_%d", round+1), after)
		r.f.Figure(fmt.Sprintf("rss_mib_after_%d", round+1), rss[round]/(1<<20))
		live, err := r.liveHeap(ctx)
		if err != nil {
			return err
		}
		r.f.Figure(fmt.Sprintf("live_heap_mib_after_%d", round+1), live/(1<<20))
		if live > liveBefore+float64(rowsLiveSlack+n*rowsLivePerConn) {
			return fmt.Errorf("router keeps %.1f MiB live after a storm of %d connections, %.1f MiB before: over %d MiB and %d KiB per connection more",
				live/(1<<20), n, liveBefore/(1<<20), rowsLiveSlack>>20, rowsLivePerConn>>10)
		}
	}
	if limit := rssBefore + float64(n*rowsRSSPerConn); max(rss[0], rss[1]) > limit {
		return fmt.Errorf("router holds %.0f MiB after storms of %d connections, %.0f MiB before: over %d KiB per connection",
			max(rss[0], rss[1])/(1<<20), n, rssBefore/(1<<20), rowsRSSPerConn>>10)
	}
	return r.expectOK(ctx)
}

// storm opens n connections, sends a request on each, reads every answer
// while keeping all open, then closes them; it returns the router's
// goroutine count with all of them open.
func (r *rowsRig) storm(ctx context.Context, n int) (float64, error) {
	addr := strings.TrimPrefix(r.api, "http://")
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(completionBody(1, false)), completionBody(1, false))
	statuses := make([]int, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := r.client.NS.DialContext(ctx, "tcp", addr)
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
			if _, err := io.WriteString(c, req); err != nil {
				errs[i] = err
				return
			}
		})
	}
	wg.Wait()
	if err := firstOf(errs); err != nil {
		return 0, err
	}
	peak, err := r.metric(ctx, "go_goroutines")
	if err != nil {
		return 0, err
	}
	for i, c := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// The clock starts when this connection's answer is read: the
			// last of n dials may come long after the first.
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				errs[i] = err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	if err := firstOf(errs); err != nil {
		return peak, err
	}
	counts := map[int]int{}
	for _, s := range statuses {
		counts[s]++
	}
	for s, c := range counts {
		if s != http.StatusOK && s != http.StatusTooManyRequests {
			return peak, fmt.Errorf("%d of %d connections got %d, want 200 or 429 (all: %v)", c, n, s, counts)
		}
	}
	r.f.Log.Info("chaos: connection storm", "conns", n, "statuses", fmt.Sprint(counts), "goroutines_peak", peak)
	return peak, nil
}

// firstOf returns the first error of errs with how many there were, not
// thousands of lines.
func firstOf(errs []error) error {
	n := 0
	var first error
	for _, err := range errs {
		if err != nil {
			n++
			first = cmpOr(first, err)
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d connections failed, the first: %w", n, len(errs), first)
}
