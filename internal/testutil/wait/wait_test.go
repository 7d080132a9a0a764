package wait

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf is recorded instead of ending the
// test, so the failure path can be checked.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.msg = fmt.Sprintf(format, args...) }

func TestForSeesACondition(t *testing.T) {
	var n atomic.Int32
	For(t, "the third poll", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Fatalf("polled %d times, want 3", got)
	}
}

func TestErrReportsTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	Err(r, "a thing", func() error { return errors.New("still broken") }, Timeout(20*time.Millisecond))
	if !strings.Contains(r.msg, "waiting for a thing") || !strings.Contains(r.msg, "still broken") {
		t.Fatalf("message %q lacks what was awaited or the last error", r.msg)
	}
}

func TestPollReturnsNilOnceTrue(t *testing.T) {
	if err := Poll(t, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestContextEndsTheWait(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := Poll(t, func() error { return errors.New("never") }, Context(ctx))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "never") {
		t.Fatalf("Poll = %v, want the context's error and the last one", err)
	}
}

// TestUntilOutsideATest: Until ends with its context, with the last error,
// and returns nil once the condition holds; no test is needed.
func TestUntilOutsideATest(t *testing.T) {
	var n atomic.Int32
	if err := Until(context.Background(), func() error {
		if n.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n.Load() != 3 {
		t.Fatalf("Until = %v after %d polls, want nil after 3", err, n.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Until(ctx, func() error { return errors.New("never") })
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "never") {
		t.Fatalf("Until = %v, want the context's error and the last one", err)
	}
	err = Until(context.Background(), func() error { return errors.New("slow") }, Timeout(20*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "slow") {
		t.Fatalf("Until = %v, want a timeout naming the last error", err)
	}
}
