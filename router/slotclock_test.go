package router

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/router/balance"
)

// seqBlocks is c's turn in blocks of prefill (0: not known).
func seqBlocks(c *slotClock) float64 {
	if !c.known() {
		return 0
	}
	return c.turn() / c.blockSec()
}

func TestSlotClock(t *testing.T) {
	var c slotClock
	for range slotClockMin - 1 {
		c.prefill(40*time.Millisecond, 4) // 10 ms a block
		c.sequence(time.Second)
	}
	if got := seqBlocks(&c); got != 0 {
		t.Fatalf("priced a slot from %d samples: %v", slotClockMin-1, got)
	}
	c.prefill(40*time.Millisecond, 4)
	c.sequence(time.Second)
	if got := seqBlocks(&c); math.Abs(got-100) > 1e-9 {
		t.Fatalf("seqBlocks %v, want 100 (1 s at 10 ms a block)", got)
	}
	c.prefill(0, 4) // nothing to learn from
	c.prefill(time.Second, 0)
	c.sequence(-time.Second)
	if got := seqBlocks(&c); math.Abs(got-100) > 1e-9 {
		t.Fatalf("empty samples moved the clock to %v", got)
	}
	for range 2000 { // the engines got twice as fast at prefill
		c.prefill(20*time.Millisecond, 4)
	}
	if got := seqBlocks(&c); math.Abs(got-200) > 1 {
		t.Fatalf("seqBlocks %v after prefill sped up, want 200", got)
	}
}

// TestSlotClockLearnsFromAnswers: streamed answers to requests that found a
// sequence slot free teach the router's slot clock what a slot's turn costs
// in blocks of prefill; an error answer teaches it nothing.
func TestSlotClockLearnsFromAnswers(t *testing.T) {
	var now atomic.Int64
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	const block, seq = 10 * time.Millisecond, time.Second
	var fail atomic.Bool
	finish := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			now.Add(int64(time.Hour))
			http.Error(w, "no", http.StatusBadRequest)
			return
		}
		// Prefill: 10 ms for each of the prompt's 8 blocks.
		now.Add(int64(8 * block))
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-finish // the test moves the clock to the answer's end
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	cfg := Defaults()
	cfg.MaxNumSeqs = 4
	h := newHarness(t, cfg, Options{Now: clock}, srv.URL)
	send := func(i int) int {
		// 8 blocks of 256 characters, none held: the first differs.
		prompt := fmt.Sprintf("%08d", i) + strings.Repeat("x", 8*256-8)
		// The headers reach the client once the router has taken the
		// first byte as the end of prefill.
		resp := post(t, h.srv.URL+"/v1/completions", fmt.Sprintf(`{"model":"m","stream":true,"prompt":%q}`, prompt))
		if resp.StatusCode == http.StatusOK {
			now.Add(int64(seq - 8*block))
			finish <- struct{}{}
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h.settle()
		return resp.StatusCode
	}
	fail.Store(true)
	for i := range slotClockMin {
		if code := send(i); code != http.StatusBadRequest {
			t.Fatalf("status %d", code)
		}
	}
	h.rt.mu.Lock()
	got := seqBlocks(&h.rt.slotClocks[0])
	h.rt.mu.Unlock()
	if got != 0 {
		t.Fatalf("error answers taught the clock: %v", got)
	}
	fail.Store(false)
	for i := range slotClockMin {
		if code := send(slotClockMin + i); code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	h.rt.mu.Lock()
	got = seqBlocks(&h.rt.slotClocks[0])
	h.rt.mu.Unlock()
	if want := float64(seq / block); math.Abs(got-want) > 0.05*want {
		t.Fatalf("seqBlocks %v, want %v (a 1 s answer at 10 ms a block)", got, want)
	}
	// Operators see what it learned.
	st := h.rt.Snapshot()
	if math.Abs(st.SlotTurn-1) > 0.01 || math.Abs(st.PrefillBlock-0.01) > 0.001 || st.Backends[0].Slots != 4 || st.Backends[0].SlotWait != 0 {
		t.Fatalf("state: slot turn %v s, prefill block %v s, backend %+v", st.SlotTurn, st.PrefillBlock, st.Backends[0])
	}
}

// TestSlotWait: the wait for a sequence slot is the remaining turn of the
// oldest request that must end first, in blocks of prefill.
func TestSlotWait(t *testing.T) {
	var c slotClock
	for range slotClockMin {
		c.prefill(10*time.Millisecond, 1) // 10 ms a block
		c.sequence(time.Second)           // a 1 s turn
	}
	now := time.Unix(100, 0)
	ago := func(d ...time.Duration) []int64 {
		var out []int64
		for _, x := range d {
			out = append(out, now.Add(-x).UnixNano())
		}
		return out
	}
	ms := time.Millisecond
	for _, tc := range []struct {
		name        string
		slots       int32
		starts      []int64
		peers, want int
	}{
		{"a slot free", 4, ago(700*ms, 500*ms, 100*ms), 0, 0},
		{"slots unknown", 0, ago(700*ms, 500*ms, 100*ms, 0), 0, 0},
		{"the oldest ends first", 4, ago(700*ms, 500*ms, 100*ms, 0), 0, 30},
		{"one waits already: the second oldest", 4, ago(700*ms, 500*ms, 100*ms, 0, 0), 0, 50},
		{"a whole round waits", 4, ago(700*ms, 500*ms, 100*ms, 0, 0, 0, 0, 0), 0, 130},
		{"past its turn: a small part of one", 4, ago(2*time.Second, 500*ms, 100*ms, 0), 0, 12},
		{"past their turns, one waits already: a later end", 4, ago(3*time.Second, 2*time.Second, 2*time.Second, 2*time.Second, 0), 0, 25},
		{"past their turns, three wait already", 4, ago(3*time.Second, 2*time.Second, 2*time.Second, 2*time.Second, 0, 0, 0), 0, 50},
		{"only those past their turns add a part", 4, ago(3*time.Second, 950*ms, 900*ms, 850*ms, 0, 0), 0, 25},
		{"peers' requests wait a gap each", 4, ago(700*ms, 500*ms), 4, 75},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &backend{slots: tc.slots, inflight: len(tc.starts), starts: tc.starts}
			b.peers.inflight = tc.peers
			if got := c.wait(b, now); got != tc.want {
				t.Fatalf("slot wait %d blocks, want %d", got, tc.want)
			}
		})
	}
	// Each request queued makes a backend look later free, whatever the
	// ages of those running there.
	for _, run := range [][]int64{ago(3*time.Second, 2*time.Second, 2*time.Second, 2*time.Second),
		ago(2*time.Second, 900*ms, 300*ms, 0), ago(800*ms, 700*ms, 600*ms, 500*ms)} {
		last := 0
		for queued := range 9 {
			starts := append(slices.Clone(run), ago(make([]time.Duration, queued)...)...)
			b := &backend{slots: 4, inflight: len(starts), starts: starts}
			got := c.wait(b, now)
			if queued > 0 && got <= last {
				t.Fatalf("%d queued: slot wait %d blocks, not above %d with one fewer", queued, got, last)
			}
			last = got
		}
	}
	var unknown slotClock
	b := &backend{slots: 1, inflight: 1, starts: ago(0)}
	if got := unknown.wait(b, now); got != 0 {
		t.Fatalf("an unknown clock priced a slot: %d", got)
	}
}

// TestStartsFollowRequests: a backend's send times of requests in flight
// stay oldest first as requests end in any order.
func TestStartsFollowRequests(t *testing.T) {
	var b backend
	t0 := time.Unix(1, 0)
	for i := range 4 {
		b.startedLocked(t0.Add(time.Duration(i) * time.Second))
	}
	b.endedLocked(t0.Add(time.Second))
	b.endedLocked(t0.Add(time.Hour)) // not in flight: nothing changes
	if want := []int64{t0.UnixNano(), t0.Add(2 * time.Second).UnixNano(), t0.Add(3 * time.Second).UnixNano()}; !slices.Equal(b.starts, want) {
		t.Fatalf("starts %v, want %v", b.starts, want)
	}
}

// TestContention feeds the contention fit first bytes from engines of
// each kind (with 5% noise and the odd stall) and checks what prefix-aware
// would be told: a queue is priced as before, prompts prefilled side by
// side are priced by the requests running beside them.
func TestContention(t *testing.T) {
	const base, perBlock = 0.010, 0.002 // seconds
	for _, tc := range []struct {
		name string
		// ttfb is the engine's time to first byte for a prompt of u
		// uncached blocks sent with ahead blocks before it and others
		// requests in flight.
		ttfb               func(u, ahead, others int) float64
		busy               bool // prompts are sent beside others
		overlap, slowdown  [2]float64
		wantOverlapPricing bool
	}{
		{"vLLM-like queue", func(u, ahead, others int) float64 { return base + perBlock*float64(u+ahead) }, true, [2]float64{0, 0.1}, [2]float64{0, 0.1}, false},
		{"side by side, factor 2 over 4 slots", func(u, ahead, others int) float64 {
			return (base + perBlock*float64(u)) * (1 + float64(others)/3)
		}, true, [2]float64{0.9, 1}, [2]float64{0.25, 0.4}, true},
		{"side by side, no slowdown", func(u, ahead, others int) float64 { return base + perBlock*float64(u) }, true, [2]float64{0.9, 1}, [2]float64{0, 0.05}, true},
		{"never beside another", func(u, ahead, others int) float64 { return base + perBlock*float64(u) }, false, [2]float64{0, 0}, [2]float64{0, 0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var c contention
			for i := range 400 {
				if i == contentionMin-1 {
					if o, s := c.shares(); o != 0 || s != 0 {
						t.Fatalf("priced from %d prompts: overlap %v, slowdown %v", i, o, s)
					}
				}
				// Most prompts of a block, as chat traffic sends:
				// the outlier bound must not be set by them alone.
				u, ahead, others := 1+rng.IntN(300), 0, 0
				if rng.IntN(4) > 0 {
					u = 1
				}
				if tc.busy {
					ahead, others = rng.IntN(600), rng.IntN(4)
				}
				y := tc.ttfb(u, ahead, others) * (0.95 + 0.1*rng.Float64())
				if i%50 == 49 {
					y = 100 // a stall
				}
				c.observe(u, ahead, others, time.Duration(y*float64(time.Second)))
			}
			o, s := c.shares()
			if o < tc.overlap[0] || o > tc.overlap[1] || s < tc.slowdown[0] || s > tc.slowdown[1] {
				t.Fatalf("overlap %.3f (want %v), slowdown %.3f (want %v); fit %v", o, tc.overlap, s, tc.slowdown, c.fit)
			}
			if in := (balance.Input{Overlap: o, Slowdown: s}); (o >= balance.OverlapAt) != tc.wantOverlapPricing {
				t.Fatalf("overlap %.3f: priced side by side %v, want %v (%+v)", o, !tc.wantOverlapPricing, tc.wantOverlapPricing, in)
			}
		})
	}
	// An engine that turns five times slower is followed, not taken for
	// a run of stalls.
	var slow contention
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 600 {
		u := 1 + rng.IntN(300)
		y := base + perBlock*float64(u)
		if i >= 200 {
			y *= 5
		}
		slow.observe(u, 0, 0, time.Duration(y*float64(time.Second)))
	}
	if b := slow.fit[1] / 64; b < 4*perBlock || b > 6*perBlock {
		t.Errorf("after the engine slowed 5x, a block costs %.4gs, want about %.4gs", b, 5*perBlock)
	}
	var c contention
	for _, bad := range []struct {
		u, ahead, others int
		d                time.Duration
	}{{0, 1, 1, time.Second}, {-1, 0, 0, time.Second}, {1, -1, 0, time.Second}, {1, 0, -1, time.Second}, {1, 0, 0, 0}, {1, 0, 0, time.Hour}} {
		c.observe(bad.u, bad.ahead, bad.others, bad.d)
	}
	if c.n != 0 {
		t.Fatalf("learned from %d observations with nothing to learn from", c.n)
	}
}

// TestContentionPricesSureSlowdown: an engine that queues prefill, whose
// queue the router overstates (ahead counts blocks the engine found
// cached), read over 64 slots. Its fit reads a slowdown that is not there,
// now and then past SlowdownAt; what prefix-aware is given, the slowdown
// less two standard errors, stays under it.
func TestContentionPricesSureSlowdown(t *testing.T) {
	const base, perBlock = 0.010, 0.002 // seconds
	point := 0.0                        // the most the bare estimate read, over every seed
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed+1, 2))
		var c contention
		for i := range 2000 {
			u, ahead, others := 1+rng.IntN(300), rng.IntN(600), rng.IntN(64)
			if rng.IntN(4) > 0 {
				u = 1 + rng.IntN(8)
			}
			y := (base + perBlock*(float64(u)+float64(ahead)*rng.Float64())) * (0.8 + 0.4*rng.Float64())
			c.observe(u, ahead, others, time.Duration(y*float64(time.Second)))
			if i < contentionMin {
				continue
			}
			if c.fit[1] > 0 {
				point = max(point, c.fit[3]/c.fit[1])
			}
			if _, s := c.shares(); s >= balance.SlowdownAt {
				t.Fatalf("seed %d, prompt %d: slowdown %.3f priced (fit %v)", seed, i, s, c.fit)
			}
		}
	}
	if point < balance.SlowdownAt {
		t.Fatalf("the bare estimate read at most %.3f: this engine no longer tests the bound", point)
	}
}
