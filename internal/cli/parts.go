package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// parts runs a binary's long-running parts in one errgroup and stops them
// in an explicit order. Each part runs from the moment it is started; when
// the root's context ends or any part fails, the parts are stopped stage by
// stage, lowest first: every part of a stage is told to stop and has
// returned before the next stage is told. Wait returns the first failure.
type parts struct {
	g    *errgroup.Group
	ctx  context.Context // ends when the root's context ends or a part fails
	quit context.CancelFunc

	mu      sync.Mutex
	started []*runningPart
}

type runningPart struct {
	stage int
	stop  func()
	done  chan struct{}
}

// newParts starts an empty set of parts under ctx.
func newParts(ctx context.Context) *parts {
	ctx, quit := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	return &parts{g: g, ctx: gctx, quit: quit}
}

// start runs run in the group until the part's stage is stopped: then its
// context ends, and stop, if not nil, is called as well (an http.Server's
// Shutdown, which Serve's context does not reach). A non-nil error from
// run, wrapped with name, stops every part and is what Wait returns. run
// returning nil early stops nothing.
func (ps *parts) start(stage int, name string, run func(ctx context.Context) error, stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ps.ctx))
	p := &runningPart{stage: stage, done: make(chan struct{}), stop: func() {
		cancel()
		if stop != nil {
			stop()
		}
	}}
	ps.mu.Lock()
	ps.started = append(ps.started, p)
	ps.mu.Unlock()
	ps.g.Go(func() error {
		defer close(p.done)
		defer cancel()
		if err := run(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// fail stops every part started so far and returns err: for an error while
// the root is still building.
func (ps *parts) fail(err error) error {
	ps.quit()
	if werr := ps.Wait(); werr != nil {
		return errors.Join(err, werr)
	}
	return err
}

// Wait blocks until the root's context ends or a part fails, stops the
// parts stage by stage and returns the first failure.
func (ps *parts) Wait() error {
	<-ps.ctx.Done()
	ps.mu.Lock()
	started := ps.started
	ps.mu.Unlock()
	for stage := 0; ; stage++ {
		var stopping []*runningPart
		later := false
		for _, p := range started {
			switch {
			case p.stage == stage:
				stopping = append(stopping, p)
			case p.stage > stage:
				later = true
			}
		}
		for _, p := range stopping {
			p.stop()
		}
		for _, p := range stopping {
			<-p.done
		}
		if !later {
			break
		}
	}
	err := ps.g.Wait()
	ps.quit()
	return err
}

// serveHTTP runs srv on ln as a part: Serve's end by Shutdown is a clean
// stop, any other end a failure.
func serveHTTP(srv *http.Server, ln net.Listener) func(context.Context) error {
	return func(context.Context) error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// shutdownHTTP stops srv accepting and lets requests in flight finish for
// up to grace; the connections still open then are closed (and cut, if not
// nil, is told), so a client stalled mid-request does not hold the stop.
func shutdownHTTP(srv *http.Server, grace time.Duration, cut func(error)) func() {
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			if cut != nil {
				cut(err)
			}
			srv.Close()
		}
	}
}
