// Package wait is the one helper this tree's tests use to wait for a
// condition: a daemon that becomes ready, a gossip view that converges, a
// counter that moves. Tests never sleep a fixed time to let something
// happen; they poll the condition here, with a deadline that only bounds a
// broken build's hang and measures nothing.
//
// It is test support: only _test.go files and test-support packages import
// it, never a product package.
package wait

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// DefaultTimeout bounds a wait when no Timeout option is given. It is long
// on purpose: CI machines have two cores and run everything under -race.
const DefaultTimeout = 60 * time.Second

// Option changes one wait.
type Option func(*config)

type config struct {
	timeout  time.Duration
	maxDelay time.Duration
	ctx      context.Context
}

// Timeout bounds the wait at d instead of DefaultTimeout.
func Timeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// Context ends the wait when ctx ends as well as at the timeout: a test
// whose phases share one overall deadline passes that deadline's context.
func Context(ctx context.Context) Option { return func(c *config) { c.ctx = ctx } }

// MaxInterval caps the delay between two polls (default 200ms); polls start
// at 1ms and double, so a condition that holds soon is seen soon.
func MaxInterval(d time.Duration) Option { return func(c *config) { c.maxDelay = d } }

// For polls cond until it returns true and fails tb (naming what) if the
// deadline passes or the test's context ends first.
func For(tb testing.TB, what string, cond func() bool, opts ...Option) {
	tb.Helper()
	Err(tb, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}, opts...)
}

// Err polls cond until it returns nil; on failure the last error it
// returned is part of the message.
func Err(tb testing.TB, what string, cond func() error, opts ...Option) {
	tb.Helper()
	if err := Poll(tb, cond, opts...); err != nil {
		tb.Fatalf("waiting for %s: %v", what, err)
	}
}

// Poll is Err without failing the test: it returns nil once cond does, or
// the reason the wait ended (deadline or the test's context) with cond's
// last error.
func Poll(tb testing.TB, cond func() error, opts ...Option) error {
	c := config{timeout: DefaultTimeout, maxDelay: 200 * time.Millisecond}
	for _, o := range opts {
		o(&c)
	}
	ctx := tb.Context()
	if c.ctx != nil {
		var stop context.CancelFunc
		ctx, stop = context.WithCancel(ctx)
		defer stop()
		defer context.AfterFunc(c.ctx, stop)()
	}
	ended, last := poll(ctx, c, cond)
	if ended {
		if c.ctx != nil && c.ctx.Err() != nil {
			return fmt.Errorf("%w (last: %w)", c.ctx.Err(), last)
		}
		return fmt.Errorf("test ended (last: %w)", last)
	}
	return last
}

// Until is Poll for code that runs outside a test (a benchmark harness
// shared by a test and a command): the wait ends with ctx instead of with
// the test. Options other than Context apply.
func Until(ctx context.Context, cond func() error, opts ...Option) error {
	c := config{timeout: DefaultTimeout, maxDelay: 200 * time.Millisecond}
	for _, o := range opts {
		o(&c)
	}
	ended, last := poll(ctx, c, cond)
	if ended {
		return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
	}
	return last
}

// poll calls cond with backoff until it returns nil or the timeout passes
// (the error says so), or ctx ends (ended, with cond's last error).
func poll(ctx context.Context, c config, cond func() error) (ended bool, err error) {
	deadline := time.NewTimer(c.timeout)
	defer deadline.Stop()
	delay := time.Millisecond
	for {
		last := cond()
		if last == nil {
			return false, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-deadline.C:
			t.Stop()
			return false, fmt.Errorf("timed out after %v (last: %w)", c.timeout, last)
		case <-ctx.Done():
			t.Stop()
			return true, last
		}
		if delay *= 2; delay > c.maxDelay {
			delay = c.maxDelay
		}
	}
}

var errNotYet = notYet{}

type notYet struct{}

func (notYet) Error() string { return "condition not yet true" }
