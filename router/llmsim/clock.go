package llmsim

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the simulator's time source. Besides telling and waiting for
// time, it is told when simulator work starts (Busy) and parks (Idle), so a
// virtual clock's driver knows when everything due at the current instant
// has happened and time may jump to the next event. The real clock ignores
// Busy and Idle.
type Clock interface {
	Now() time.Time
	// SleepUntil parks until the clock reaches t (Idle while parked; the
	// waker accounts for the wake-up).
	SleepUntil(ctx context.Context, t time.Time) error
	Busy(n int)
	Idle()
}

// RealClock is the wall clock.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// SleepUntil implements Clock.
func (RealClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Busy implements Clock.
func (RealClock) Busy(int) {}

// Idle implements Clock.
func (RealClock) Idle() {}

// VirtualClock is a discrete-event clock: time stands still until the
// driver advances it to the next timer or arrival. Motion counts work in
// progress at the current instant (requests and responses in transit,
// goroutines woken but not parked); the driver advances only at zero, so
// results do not depend on how fast or how loaded the machine is.
// Sleeps cancelled by their context leave their timer behind; the bench
// never cancels.
type VirtualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers timerHeap
	seq    uint64
	motion atomic.Int64
}

// NewVirtualClock starts at t.
func NewVirtualClock(t time.Time) *VirtualClock { return &VirtualClock{now: t} }

type timer struct {
	at  time.Time
	seq uint64
	ch  chan struct{}
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// Now implements Clock.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// SleepUntil implements Clock.
func (c *VirtualClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	if !t.After(c.now) {
		c.mu.Unlock()
		return ctx.Err()
	}
	ch := make(chan struct{})
	c.seq++
	heap.Push(&c.timers, timer{at: t, seq: c.seq, ch: ch})
	c.mu.Unlock()
	c.Idle()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		c.Busy(1)
		return ctx.Err()
	}
}

// Busy implements Clock.
func (c *VirtualClock) Busy(n int) { c.motion.Add(int64(n)) }

// Idle implements Clock.
func (c *VirtualClock) Idle() { c.motion.Add(-1) }

// Motion is the amount of work in progress at the current instant.
func (c *VirtualClock) Motion() int64 { return c.motion.Load() }

// Next returns the earliest pending timer.
func (c *VirtualClock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	return c.timers[0].at, true
}

// AdvanceTo moves time forward to t (never back) and wakes every sleeper
// due by then, counting each as busy.
func (c *VirtualClock) AdvanceTo(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	var due []chan struct{}
	for len(c.timers) > 0 && !c.timers[0].at.After(c.now) {
		due = append(due, heap.Pop(&c.timers).(timer).ch)
	}
	c.mu.Unlock()
	c.Busy(len(due))
	for _, ch := range due {
		close(ch)
	}
}
