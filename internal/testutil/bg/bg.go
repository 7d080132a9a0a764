// Package bg runs a part's Run(ctx) loop in the background of a test: the
// loop starts at once, and stops (its context canceled, its error
// reported) when the test calls the returned stop or ends, whichever comes
// first. It is the one way this tree's tests run a long-running part, so
// each test does not write its own goroutine, channel and cleanup.
//
// It is test support: only _test.go files and test-support packages import
// it, never a product package.
package bg

import (
	"context"
	"sync"
	"testing"
)

// Run starts run(ctx) in a goroutine and returns stop, which cancels ctx,
// waits for run to return and reports its error with tb.Error. stop runs
// at cleanup too and does its work once. then, if given, runs after run
// returned (closing what the loop used, say); its error is reported too.
func Run(tb testing.TB, run func(context.Context) error, then ...func() error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("Run: %v", err)
			}
			for _, f := range then {
				if err := f(); err != nil {
					tb.Error(err)
				}
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
