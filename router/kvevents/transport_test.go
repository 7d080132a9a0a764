package kvevents

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// slowCloseListener's Accept blocks until Close, then takes a second to
// return, as an accept loop's goroutine can when the machine is busy.
type slowCloseListener struct {
	net.Listener // nil: only Accept and Close are called
	closed       chan struct{}
	returned     atomic.Bool
}

func (l *slowCloseListener) Accept() (net.Conn, error) {
	<-l.closed
	time.Sleep(time.Second)
	l.returned.Store(true)
	return nil, net.ErrClosed
}

func (l *slowCloseListener) Close() error { close(l.closed); return nil }

// TestBoundedListenerCloseWaitsForAccept: once Close returns, no Accept is
// left in this package's code (zmq4 accepts on a goroutine it does not
// wait for), and an Accept after Close fails at once.
func TestBoundedListenerCloseWaitsForAccept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &slowCloseListener{closed: make(chan struct{})}
		l := &boundedListener{Listener: inner}
		go func() { _, _ = l.Accept() }()
		synctest.Wait() // Accept is blocked in the inner listener
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !inner.returned.Load() {
			t.Error("Close returned while an Accept was still in flight")
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
		}
	})
}
