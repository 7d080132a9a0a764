package cli

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// helperEnv marks the test binary re-executed as warmfleet.
const helperEnv = "WARMFLEET_TEST_HELPER"

// TestHelperWarmfleet is not a test: it is `warmfleet` itself, with the
// signal handling of cmd/warmfleet, when the test binary is re-executed
// by runWarmfleet.
func TestHelperWarmfleet(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("entry point for warmfleet processes started by tests")
	}
	os.Exit(runUntilSignal(Run, os.Args[slices.Index(os.Args, "--")+1:]))
}

// runWarmfleet starts `warmfleet args` as a process with env added; the
// process is killed when the test ends if it still runs.
func runWarmfleet(t *testing.T, env []string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperWarmfleet$", "--"}, args...)...)
	cmd.Env = append(append(os.Environ(), helperEnv+"=1"), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}

// notifySocket is a stand-in for systemd's notification socket.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &notifySocket{path: path, conn: conn}
}

// next returns the next notification; what the process printed explains
// a missing one.
func (s *notifySocket) next(t *testing.T, out *syncBuffer) string {
	t.Helper()
	if err := s.conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := s.conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v; output:\n%s", err, out.String())
	}
	return string(buf[:n])
}

// expectServing checks the life of a notifying service: READY=1 first and
// only once answers serves, then (with the watchdog at 200ms)
// WATCHDOG=1 pings, then STOPPING=1 on SIGTERM and a clean exit.
func expectServing(t *testing.T, sock *notifySocket, cmd *exec.Cmd, out *syncBuffer, answers func() error) {
	t.Helper()
	if msg := sock.next(t, out); msg != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", msg)
	}
	if err := answers(); err != nil {
		t.Fatalf("READY=1 sent before the service answers: %v", err)
	}
	for range 3 {
		if msg := sock.next(t, out); msg != "WATCHDOG=1" {
			t.Fatalf("notification %q while serving, want WATCHDOG=1", msg)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		msg := sock.next(t, out)
		if msg == "STOPPING=1" {
			break
		}
		if msg != "WATCHDOG=1" {
			t.Fatalf("notification %q after SIGTERM, want STOPPING=1", msg)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v; output:\n%s", err, out.String())
	}
}

// notifyEnv is what systemd passes a Type=notify unit with WatchdogSec.
func notifyEnv(sock *notifySocket) []string {
	return []string{"NOTIFY_SOCKET=" + sock.path, "WATCHDOG_USEC=400000"}
}

// TestDaemonNotifiesSystemd: the daemon says READY=1 once its API
// answers, feeds the watchdog, and says STOPPING=1 on SIGTERM.
func TestDaemonNotifiesSystemd(t *testing.T) {
	sock := listenNotify(t)
	dir := t.TempDir()
	api := filepath.Join(dir, "api.sock")
	cmd, out := runWarmfleet(t, notifyEnv(sock), "daemon", "--data-dir", filepath.Join(dir, "data"),
		"--api", "unix://"+api, "--containerd", "off", "--reserve", "0", "--reserve-fraction", "0")
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", api)
	}}}
	expectServing(t, sock, cmd, out, func() error {
		resp, err := client.Get("http://daemon/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return &statusError{resp.StatusCode}
		}
		return nil
	})
}

// TestRouterNotifiesSystemd: the router says READY=1 once it listens,
// feeds the watchdog, and says STOPPING=1 on SIGTERM.
func TestRouterNotifiesSystemd(t *testing.T) {
	sock := listenNotify(t)
	listen := testenv.FreeAddr(t)
	cmd, out := runWarmfleet(t, notifyEnv(sock), "router", "--listen", listen, "--admin-listen", "",
		"--backend", "http://"+testenv.FreeAddr(t))
	expectServing(t, sock, cmd, out, func() error {
		resp, err := http.Get("http://" + listen + "/v1/models")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}

type statusError struct{ code int }

func (e *statusError) Error() string { return http.StatusText(e.code) }
