package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// alarm calls expire once bound has passed without progress. It is made
// once and reused (its owner lives in a sync.Pool), so arming it, marking
// progress and disarming it allocate nothing on the request path.
//
// Progress is only a clock read: the timer is not reset for it. When the
// timer fires it measures the time since the latest progress and, if the
// bound has not passed, sets itself for the rest. The same check makes
// reuse safe: a firing that began as its last use ended finds the next use
// armed but not yet due, and only sets the timer again.
//
// expire runs under the alarm's lock, so once disarm returns no expire is
// running or will run for that use, and the owner may read what expire
// wrote without a lock of its own.
type alarm struct {
	t      *time.Timer
	expire func()

	epoch time.Time // what last counts from, on the monotonic clock

	mu    sync.Mutex
	armed bool
	bound time.Duration
	last  atomic.Int64 // a.now() of the latest progress
}

func (a *alarm) now() time.Duration { return time.Since(a.epoch) }

// init makes the timer, stopped, for expire. Call it once, before arm.
func (a *alarm) init(expire func()) {
	a.expire, a.epoch = expire, time.Now()
	a.t = time.AfterFunc(time.Hour, a.fire)
	a.t.Stop()
}

// armLocked starts a bound from now. Call it with a.mu held.
func (a *alarm) armLocked(bound time.Duration) {
	a.armed, a.bound = true, bound
	a.last.Store(int64(a.now()))
	a.t.Reset(bound)
}

// progress restarts the bound from now.
func (a *alarm) progress() { a.last.Store(int64(a.now())) }

// disarm ends the use: expire does not run after it returns.
func (a *alarm) disarm() {
	a.t.Stop()
	a.mu.Lock()
	a.armed = false
	a.mu.Unlock()
}

func (a *alarm) fire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.armed {
		return
	}
	if left := a.bound - (a.now() - time.Duration(a.last.Load())); left > 0 {
		a.t.Reset(left)
		return
	}
	a.armed = false
	a.expire()
}

// watchdog cancels an attempt whose backend goes quiet: first for want of
// a first byte, then, restarted with another cause and bound, for want of
// the next read. One per attempt, from Router.watchdogs.
type watchdog struct {
	alarm
	cancel context.CancelCauseFunc
	cause  error
}

func (rt *Router) newWatchdog() *watchdog {
	if w, ok := rt.watchdogs.Get().(*watchdog); ok {
		return w
	}
	w := &watchdog{}
	w.init(func() { w.cancel(w.cause) })
	return w
}

// start cancels with cause once bound passes without progress.
func (w *watchdog) start(cancel context.CancelCauseFunc, cause error, bound time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel, w.cause = cancel, cause
	w.armLocked(bound)
}

// putWatchdog disarms w and keeps it for another attempt.
func (rt *Router) putWatchdog(w *watchdog) {
	w.disarm()
	w.cancel = nil // no reference to the attempt's context
	rt.watchdogs.Put(w)
}
