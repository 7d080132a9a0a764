// Package pipenet is a network of in-memory connections for tests that run
// a real http.Server and client inside a testing/synctest bubble: net.Pipe
// blocks on channels, which synctest sees, where a loopback socket would
// stop its clock from moving.
//
// It is test support: only tests import it.
package pipenet

import (
	"context"
	"net"
	"sync"
)

// Listener hands a server the far ends of the connections Dial makes.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// Listen returns a Listener; serve it (http.Server.Serve) and dial it
// (http.Transport.DialContext = l.Dial).
func Listen() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Dial connects to the listener, whatever the address.
func (l *Listener) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept waits for the next Dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept and Dial fail from now on.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is a placeholder: the connections have no address.
func (l *Listener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }
