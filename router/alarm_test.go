package router

import (
	"testing"
	"testing/synctest"
	"time"
)

// newTestAlarm returns an alarm that counts its expiries.
func newTestAlarm() (*alarm, *int) {
	a, n := &alarm{}, new(int)
	a.init(func() { *n++ })
	return a, n
}

func armed(a *alarm, bound time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.armLocked(bound)
}

// expiries reads the count under the alarm's lock, as expire writes it.
func expiries(a *alarm, n *int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return *n
}

// TestAlarmProgressDefers: progress restarts the bound without resetting
// the timer; the alarm expires once, a bound after the latest progress.
func TestAlarmProgressDefers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, n := newTestAlarm()
		armed(a, time.Second)
		time.Sleep(600 * time.Millisecond)
		a.progress()
		time.Sleep(600 * time.Millisecond) // 1.2s from arming, 0.6s from progress
		synctest.Wait()
		if got := expiries(a, n); got != 0 {
			t.Fatalf("expired %d times before the bound passed since progress", got)
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := expiries(a, n); got != 1 {
			t.Fatalf("expired %d times a bound after progress, want 1", got)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := expiries(a, n); got != 1 {
			t.Fatalf("expired %d times, want once per arming", got)
		}
	})
}

// TestAlarmDisarmAndReuse: a disarmed alarm does not expire; re-armed, it
// serves a new bound; a firing that arrives early (as one left over from
// the previous use would) does not expire it but waits out the bound.
func TestAlarmDisarmAndReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, n := newTestAlarm()
		armed(a, time.Second)
		time.Sleep(500 * time.Millisecond)
		a.disarm()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := expiries(a, n); got != 0 {
			t.Fatalf("a disarmed alarm expired %d times", got)
		}
		armed(a, 3*time.Second)
		time.Sleep(time.Second)
		a.fire() // early: 2s of the bound are left
		synctest.Wait()
		if got := expiries(a, n); got != 0 {
			t.Fatalf("an early firing expired the alarm %d times", got)
		}
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		if got := expiries(a, n); got != 1 {
			t.Fatalf("expired %d times once the bound passed, want 1", got)
		}
	})
}
