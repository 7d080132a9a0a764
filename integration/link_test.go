package integration

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
)

// TestLinkShaping sends bulk TCP between two hosts and logs the rate the
// receiver measures. The shaping is checked on each end separately (only
// the sender's link shaped, then only the receiver's), after a reshape, and
// cut/restore is checked. Timing on a shared 2-core machine is noisy, so
// the assertions are loose sanity bounds; the log has the figures.
func TestLinkShaping(t *testing.T) {
	const rate = 100 * netlab.Mbit
	lab := netlabtest.New(t, netlab.Options{Hosts: 2})
	ctx := t.Context()
	h0, h1 := lab.Hosts()[0], lab.Hosts()[1]

	unshaped := bulkRate(t, h0, h1, time.Second)
	t.Logf("unshaped h0 -> h1: %.0f Mbit/s", unshaped/1e6)

	steps := []struct {
		name       string
		send, recv netlab.Rate // of h0's and h1's links
		want       netlab.Rate
	}{
		{name: "sender shaped", send: rate, recv: 0, want: rate},
		{name: "receiver shaped", send: 0, recv: rate, want: rate},
		{name: "both reshaped", send: rate / 4, recv: rate / 4, want: rate / 4},
	}
	for _, st := range steps {
		if err := h0.Link().Shape(ctx, st.send); err != nil {
			t.Fatal(err)
		}
		if err := h1.Link().Shape(ctx, st.recv); err != nil {
			t.Fatal(err)
		}
		got := bulkRate(t, h0, h1, 2*time.Second)
		t.Logf("%s (h0 %s, h1 %s): measured %.1f Mbit/s, configured %s (%.2fx)",
			st.name, st.send, st.recv, got/1e6, st.want, got/float64(st.want))
		if got > 3*float64(st.want) {
			t.Errorf("%s: measured %.1f Mbit/s, more than 3x the configured %s: shaping is not applied", st.name, got/1e6, st.want)
		}
		if got < float64(st.want)/20 {
			t.Errorf("%s: measured %.3f Mbit/s, below a twentieth of %s: the link barely works", st.name, got/1e6, st.want)
		}
	}

	// A cut link passes nothing; restored, it works again.
	if err := h1.Link().Cut(ctx); err != nil {
		t.Fatal(err)
	}
	if err := echoRoundTripWithin(ctx, h0, h1, time.Second); err == nil {
		t.Errorf("h0 reached h1 over a cut link")
	}
	if err := h1.Link().Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if err := echoRoundTripWithin(ctx, h0, h1, 10*time.Second); err != nil {
		t.Errorf("h0 -> h1 after restore: %v", err)
	}
	c, err := h1.Link().Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.RxBytes == 0 {
		t.Errorf("h1 counters %+v after bulk transfers, want received bytes", c)
	}
}

// bulkRate streams from src to dst for about d and returns the rate the
// receiver saw, in bits per second.
func bulkRate(t *testing.T, src, dst *netlab.Host, d time.Duration) float64 {
	t.Helper()
	ln, err := dst.NS.Listen("tcp", dst.Addr(0))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		n   int64
		dur time.Duration
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		defer c.Close()
		// Skip the first moments (slow start, the initial token bucket).
		warm := make([]byte, 256<<10)
		if _, err := io.ReadFull(c, warm); err != nil {
			res <- result{err: err}
			return
		}
		start := time.Now()
		n, err := io.Copy(io.Discard, c)
		res <- result{n: n, dur: time.Since(start), err: err}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := src.NS.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256<<10)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	_ = c.Close()
	r := <-res
	if r.err != nil {
		t.Fatalf("receive: %v", r.err)
	}
	if r.dur <= 0 {
		t.Fatalf("receive took %v", r.dur)
	}
	return float64(r.n*8) / r.dur.Seconds()
}

func echoRoundTripWithin(ctx context.Context, src, dst *netlab.Host, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return echoRoundTrip(ctx, src, dst)
}
