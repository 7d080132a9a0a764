package netlab

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestProxyLoopback runs the proxy between loopback sockets (no namespaces,
// no root): pass-through, mangling, reset of open connections, close.
func TestProxyLoopback(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(ln, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", up.Addr().String())
	})
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	roundTrip := func(c net.Conn, r *bufio.Reader, msg string) (string, error) {
		if _, err := io.WriteString(c, msg); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}

	c, r := dial()
	if got, err := roundTrip(c, r, "abcd\n"); err != nil || got != "abcd\n" {
		t.Fatalf("pass-through = %q, %v", got, err)
	}
	p.SetMangle(FlipEvery(4)) // applies to the bytes of this connection from now on
	if got, err := roundTrip(c, r, "abcd\n"); err != nil || got != "abbd\n" {
		t.Fatalf("mangled = %q, %v; want the stream's 8th byte (offset 7) flipped", got, err)
	}
	p.SetMangle(nil)
	if n := p.ResetAll(); n != 2 {
		t.Errorf("ResetAll reset %d connections, want 2 (client and upstream side)", n)
	}
	if _, err := roundTrip(c, r, "x\n"); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.EOF) {
		t.Errorf("after ResetAll: %v, want a reset", err)
	}
	_ = c.Close()
	if p.Served() == 0 {
		t.Errorf("Served() = 0 after traffic")
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := net.Dial("tcp", p.Addr().String()); err == nil {
		t.Errorf("proxy still accepts after Close")
	}
}
