// Package testclock is the settable wall clock that tests inject where the
// code under test takes a `func() time.Time`: it stands still until the test
// moves it, so a test decides when a grace period or an interval has passed
// instead of waiting for it.
//
// It is test support: only _test.go files and test-support packages import
// it, never a product package.
package testclock

import (
	"sync"
	"time"
)

// Start is where every new Clock stands: a fixed instant, so figures in
// test output (timestamps, ages) are the same on every run.
var Start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Clock is a wall clock safe for the goroutines of the code under test and
// the test itself. Pass its Now method as the injected clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock standing at Start.
func New() *Clock { return &Clock{t: Start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d, backwards when d is negative (a wall clock
// stepped back).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
