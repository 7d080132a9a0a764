package bg

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

// recorder is a testing.TB that keeps what Run reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Error(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }

func TestStopCancelsWaitsAndClosesOnce(t *testing.T) {
	var stopped, closed atomic.Int32
	stop := Run(t, func(ctx context.Context) error {
		<-ctx.Done()
		stopped.Add(1)
		return nil
	}, func() error {
		if stopped.Load() != 1 {
			t.Error("then ran before the loop returned")
		}
		closed.Add(1)
		return nil
	})
	stop()
	stop()
	if stopped.Load() != 1 || closed.Load() != 1 {
		t.Fatalf("loop returned %d times, then ran %d times: want once each", stopped.Load(), closed.Load())
	}
}

func TestErrorsAreReported(t *testing.T) {
	r := &recorder{TB: t}
	stop := Run(r, func(ctx context.Context) error {
		<-ctx.Done()
		return errors.New("loop broke")
	}, func() error { return errors.New("close broke") })
	stop()
	if len(r.errs) != 2 || r.errs[0] != "Run: loop broke" || r.errs[1] != "close broke" {
		t.Fatalf("reported %q", r.errs)
	}
}
