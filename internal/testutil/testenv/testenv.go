// Package testenv starts the real services that tests run against (an S3
// server, containerd, a registry) and finds the tools they need. A missing tool
// skips the test on a developer's machine and fails it in CI (CI=true), where
// the README's test command must have installed it.
package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
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

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		tb.Fatalf("free port: %v", err)
	}
	return addr
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
