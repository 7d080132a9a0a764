package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns` keeps its named namespaces.
const netnsDir = "/run/netns"

// Netns is a named network namespace created with `ip netns add`.
type Netns string

// Name is the namespace's name as `ip netns` knows it.
func (n Netns) Name() string { return string(n) }

// Command returns a command that runs name inside the namespace
// (`ip netns exec NS name args...`). ip execs the program itself, so the
// command's PID is the program's.
func (n Netns) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", string(n), name}, args...)...)
}

// Do runs fn on an OS thread that has entered the namespace, so sockets fn
// creates belong to it and keep belonging to it afterwards. fn must not
// start goroutines that create sockets: they would run on other threads.
func (n Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err, poisoned := n.doLocked(fn)
		if !poisoned {
			// The thread is back in its own namespace: reuse it. A poisoned
			// thread is left locked, so the runtime ends it with this goroutine.
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func (n Netns) doLocked(fn func() error) (err error, poisoned bool) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("own network namespace: %w", err), false
	}
	defer self.Close()
	target, err := os.Open(filepath.Join(netnsDir, string(n)))
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", n, err), false
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", n, err), false
	}
	fnErr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(fnErr, fmt.Errorf("leave network namespace %s: %w", n, err)), true
	}
	return fnErr, false
}

// Listen opens a listener inside the namespace.
func (n Netns) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s in %s: %w", addr, n, err)
	}
	return l, nil
}

// DialContext connects from inside the namespace. addr must be an IP
// literal and port: a host name would be resolved on another thread.
func (n Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s in %s: %w", addr, n, err)
	}
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("dial %s in %s: host must be an IP address", addr, n)
	}
	var c net.Conn
	err = n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s in %s: %w", addr, n, err)
	}
	return c, nil
}

// ip runs `ip args...` and returns its output, with stderr in the error.
func ip(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "ip", args...)
}

// tc runs `tc args...`.
func tc(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "tc", args...)
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// namespaceNames lists the named network namespaces.
func namespaceNames() ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}
