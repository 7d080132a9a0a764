package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmfleet/warmfleet/router"
	"github.com/warmfleet/warmfleet/router/llmsim"
)

// driver replays requests in virtual time over real HTTP: it advances the
// clock to the next arrival or simulator timer only once every request and
// response in transit has landed (motion zero), so the router sees exactly
// the in-flight state it would at that instant, however loaded the machine.
type driver struct {
	clock   *llmsim.VirtualClock
	client  *http.Client
	routers []replica
	sent    int // requests started so far: the next goes to replica sent mod len(routers)
	// open counts requests sent whose answer has not ended at the client.
	// Once a response's last byte lands the client is idle, but the
	// router may not have released the backend yet: quiet waits until
	// every open request is queued in or held by the router, so the next
	// decision sees the in-flight counts of this instant, not a race.
	open atomic.Int64
	// arrival, if set, runs (in openLoop, at quiet) before request i is
	// sent: the scale-out phase changes the fleet there.
	arrival func(i int) error
	// debug asks the router to name the backend (Outcome.backend).
	debug bool
}

func newDriver(clock *llmsim.VirtualClock, client *http.Client, f *fleet) *driver {
	return &driver{clock: clock, client: client, routers: f.routers}
}

// held is how many requests the routers hold: queued for a backend, or
// sent to one and not yet released.
func (d *driver) held() (queued, inflight int64) {
	for _, r := range d.routers {
		queued += int64(r.rt.Queued())
		inflight += int64(r.rt.InFlight())
	}
	return queued, inflight
}

// start sends r in the background. It counts as motion, and as open,
// until its answer has ended and done has run.
func (d *driver) start(ctx context.Context, wg *sync.WaitGroup, r *Request, done func(outcome)) {
	d.open.Add(1)
	d.clock.Busy(1)
	base := d.routers[d.sent%len(d.routers)].url
	d.sent++
	wg.Go(func() {
		done(d.send(ctx, base, r))
		d.open.Add(-1)
		d.clock.Idle()
	})
}

// quiet waits until nothing is in motion at the current instant.
func (d *driver) quiet(ctx context.Context) error {
	watchdog := time.Now().Add(2 * time.Minute)
	zeros, negatives := 0, 0
	for {
		// The routers' counts and the clock's are read apart, so a request
		// that leaves a queue and ends between the reads shows as negative
		// motion; only a count that stays negative is a fault.
		before := d.clock.Motion()
		queued, inflight := d.held()
		motion := d.clock.Motion()
		if motion != before {
			zeros = 0
			continue
		}
		m := motion - queued
		switch {
		case m < 0:
			if negatives++; negatives >= 100 {
				return fmt.Errorf("bench: virtual clock accounting went negative (%d)", m)
			}
			runtime.Gosched()
			continue
		case m == 0 && inflight+queued == d.open.Load():
			// Seen idle several times in a row, with the scheduler given a
			// chance to run anything just woken.
			if zeros++; zeros >= 3 {
				return nil
			}
			runtime.Gosched()
			continue
		}
		zeros, negatives = 0, 0
		if time.Now().After(watchdog) || ctx.Err() != nil {
			return fmt.Errorf("bench: stuck with %d in motion: %w", m, context.Cause(ctx))
		}
		time.Sleep(20 * time.Microsecond)
	}
}

type outcome struct {
	status int
	ttft   time.Duration // to the first body byte (virtual, or wall for sendReal)
	end    time.Time
	err    error
	// backend is the router's choice when the driver asked for it, and
	// route its whole explanation (router.RouteHeader).
	backend, route string
}

// send posts one request whose Busy the caller (start) counted, reads the
// whole answer, and leaves the last Idle to the caller.
func (d *driver) send(ctx context.Context, base string, r *Request) outcome {
	start := d.clock.Now()
	resp, err := post(ctx, d.client, base, r, d.debug)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	fromSim := resp.Header.Get("X-Llmsim") != ""
	out := routedOutcome(resp)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 && out.ttft == 0 {
			out.ttft = max(d.clock.Now().Sub(start), time.Nanosecond)
			if fromSim {
				d.clock.Idle() // the first byte landed
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				out.err = err
			}
			out.end = d.clock.Now()
			return out
		}
	}
}

// openLoop sends each request at its arrival time.
func (d *driver) openLoop(ctx context.Context, reqs []Request) ([]outcome, time.Duration, error) {
	outs := make([]outcome, len(reqs))
	t0 := d.clock.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	next := 0
	for {
		if err := d.quiet(ctx); err != nil {
			return nil, 0, err
		}
		timer, hasTimer := d.clock.Next()
		if next < len(reqs) && (!hasTimer || !t0.Add(reqs[next].At).After(timer)) {
			// One arrival at a time, even at the same instant: each
			// decision then sees the one before it, in trace order.
			d.clock.AdvanceTo(t0.Add(reqs[next].At))
			i := next
			if d.arrival != nil {
				if err := d.arrival(i); err != nil {
					return nil, 0, err
				}
			}
			d.start(ctx, &wg, &reqs[i], func(o outcome) { outs[i] = o })
			next++
			continue
		}
		if !hasTimer {
			break
		}
		d.clock.AdvanceTo(timer)
	}
	wg.Wait()
	last := t0
	for _, o := range outs {
		if o.end.After(last) {
			last = o.end
		}
	}
	return outs, max(last.Sub(t0), time.Nanosecond), nil
}

// steadyRate is completions per second in a closed loop of `clients`
// between its first round of completions and its last: the first round
// ends the burst every client sends at t=0 (placed with nothing held, and
// queued all at once) and the last is the drain, when the list is done and
// fewer than `clients` requests are left to run; neither says what the
// fleet sustains. Sorted offsets from the start; 0 when fewer than two
// completions lie between the rounds.
func steadyRate(ends []time.Duration, clients int) float64 {
	clients = max(clients, 1)
	lo, hi := clients, len(ends)-1-clients
	if hi-lo < 1 {
		return 0
	}
	ends = slices.Clone(ends)
	slices.Sort(ends)
	return float64(hi-lo) / max(ends[hi]-ends[lo], time.Nanosecond).Seconds()
}

// closedLoop keeps `clients` requests outstanding until the list is done
// and returns when each successful one ended (virtual time since the start).
// A client whose request ended sends the next one only at quiet, one at a
// time in list order, like openLoop's arrivals: requests ending at the same
// instant would otherwise race to the router, and the same seed would not
// give the same decisions.
func (d *driver) closedLoop(ctx context.Context, reqs []Request, clients int) ([]time.Duration, error) {
	var mu sync.Mutex
	var ends []time.Duration
	freed := 0 // clients whose request ended since the last look
	t0 := d.clock.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	idle, next := clients, 0
	for {
		if err := d.quiet(ctx); err != nil {
			return nil, err
		}
		mu.Lock()
		idle += freed
		freed = 0
		mu.Unlock()
		if idle > 0 && next < len(reqs) {
			d.start(ctx, &wg, &reqs[next], func(out outcome) {
				mu.Lock()
				defer mu.Unlock()
				if out.err == nil && out.status == http.StatusOK {
					ends = append(ends, d.clock.Now().Sub(t0))
				}
				freed++
			})
			idle--
			next++
			continue
		}
		timer, ok := d.clock.Next()
		if !ok {
			break
		}
		d.clock.AdvanceTo(timer)
	}
	wg.Wait()
	return ends, nil
}

// routedOutcome is resp's status and the router's explanation of where
// it went.
func routedOutcome(resp *http.Response) outcome {
	route := resp.Header.Get(router.RouteHeader)
	return outcome{status: resp.StatusCode, route: route, backend: router.ParseRoute(route)["backend"]}
}

// post sends r's body to base+r.Path as JSON, debug asking the router to
// name its backend; the caller reads and closes the response.
func post(ctx context.Context, c *http.Client, base string, r *Request, debug bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if debug {
		req.Header.Set(router.DebugRequestHeader, "1")
	}
	return c.Do(req)
}

// sendReal posts one request in wall-clock time (overhead phase).
func sendReal(ctx context.Context, c *http.Client, base string, r *Request) outcome {
	start := time.Now()
	resp, err := post(ctx, c, base, r, false)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	out := outcome{status: resp.StatusCode}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		out.err = err
	}
	out.ttft = time.Since(start)
	return out
}
