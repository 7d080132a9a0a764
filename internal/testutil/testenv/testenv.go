// Package testenv starts the real services that tests run against (an S3
// server, containerd, a registry) and finds the tools they need. A missing tool
// skips the test on a developer's machine and fails it in CI (CI=true), where
// the README's test command must have installed it.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// RepoRoot returns the module root (the directory holding go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// Bin returns the path of a tool from the project-local bin/ directory or PATH.
func Bin(tb testing.TB, name string) string {
	tb.Helper()
	p, err := ToolPath(name, "see the Makefile")
	if err != nil {
		Missing(tb, "%v", err)
	}
	return p
}

// Missing skips the test, or fails it in CI where everything must be present.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// RequireRoot skips (or fails in CI) a test that needs root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "needs root")
	}
}

// FreeAddr returns a loopback address whose port nothing listened on, over
// TCP or UDP, a moment ago, for a server that must be told its address
// before it starts (peers that name each other, a restart on the same
// address). A server that can bind port 0 and report what it got needs
// none of this.
//
// The port comes from below the kernel's ephemeral range: the local ports
// of outgoing connections (this test's, or a parallel package's) come from
// that range, so one of them cannot take the port between FreeAddr and the
// server's bind; only another explicit bind to the same port could. Where
// the range cannot be read or leaves no room below it, the kernel picks.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := PickFreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}

// PickFreeAddr is FreeAddr for code that runs outside a test (a harness
// shared by a test and a lab command).
func PickFreeAddr() (string, error) {
	if lo, _, err := ephemeralPorts(); err == nil && lo-freePortMin >= 1000 {
		for range 100 {
			port := freePortMin + rand.IntN(lo-freePortMin)
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			if bindable(addr) && handOut(port) {
				return addr, nil
			}
		}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("free port: %w", err)
		}
		addr := l.Addr().(*net.TCPAddr)
		if err := l.Close(); err != nil {
			return "", fmt.Errorf("free port: %w", err)
		}
		if handOut(addr.Port) {
			return addr.String(), nil
		}
	}
	return "", errors.New("free port: the kernel offered only ports handed out before")
}

// handedOut holds the ports PickFreeAddr has returned in this process:
// two picks in a row, before either is bound, could otherwise draw the
// same port (a VM's two forwarded ports did, and qemu refused the second).
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// handOut reports whether port was not handed out before, and marks it.
func handOut(port int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports[port] {
		return false
	}
	if handedOut.ports == nil {
		handedOut.ports = make(map[int]bool)
	}
	handedOut.ports[port] = true
	return true
}

// freePortMin keeps FreeAddr above the ports well-known services and
// tools' defaults cluster in.
const freePortMin = 10000

// ephemeralPorts reads the range the kernel takes outgoing connections'
// local ports from.
func ephemeralPorts() (lo, hi int, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, fmt.Errorf("ephemeral ports: %w", err)
	}
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0, 0, fmt.Errorf("ephemeral ports %q: %w", b, err)
	}
	return lo, hi, nil
}

// bindable tells whether addr can be bound over TCP and over UDP (a gossip
// member takes both) right now.
func bindable(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return pc.Close() == nil
}

// WaitTCP waits until addr accepts a connection or ctx ends.
func WaitTCP(ctx context.Context, addr string) error {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
