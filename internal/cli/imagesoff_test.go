package cli

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// TestImageAddRefusedWithoutImageCache: on a daemon whose image cache is
// off, `image add` is refused with what to do, not accepted as a claim the
// node can neither pull nor list.
func TestImageAddRefusedWithoutImageCache(t *testing.T) {
	testenv.StartS3(t).SetEnv(t)
	sock := startDaemon(t) // --containerd off
	code, stderr := runBounded(t, sock, "image", "add", "nginx:1.27", "--owner", "web")
	if code != exitFailure || !strings.Contains(stderr, "image cache is off on this node: start the daemon with --containerd") {
		t.Errorf("image add: exit %d, stderr %q; want 1 saying the image cache is off", code, stderr)
	}
	code, stderr = runBounded(t, sock, "image", "ls")
	if code != exitFailure || !strings.Contains(stderr, "image cache is off") {
		t.Errorf("image ls: exit %d, stderr %q", code, stderr)
	}
}

// TestContainerdSocketWithNothingBehind: a --containerd socket that
// nothing listens on (no file: containerd not started yet; a stale file:
// containerd stopped) stops the daemon at start with what to do, instead
// of the containerd client's silent retries for its 10 s dial timeout and
// a bare "timeout".
func TestContainerdSocketWithNothingBehind(t *testing.T) {
	stale := filepath.Join(t.TempDir(), "containerd.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the file stays, nobody listens
	for sock, cause := range map[string]string{
		filepath.Join(t.TempDir(), "missing.sock"): "no such file or directory",
		stale: "connection refused",
	} {
		dir := t.TempDir()
		code, _, stderr := runOut(t, "daemon", "--data-dir", filepath.Join(dir, "data"), "--api", "unix://"+filepath.Join(dir, "api.sock"),
			"--reserve", "0", "--reserve-fraction", "0", "--containerd", "unix://"+sock)
		if code != exitFailure || !strings.Contains(stderr, "containerd unix://"+sock+": nothing answers on the socket") ||
			!strings.Contains(stderr, cause) || !strings.Contains(stderr, "--containerd off") || strings.Count(stderr, sock) != 1 {
			t.Errorf("exit %d, stderr %q; want 1 saying nothing answers on the socket (%s), naming it once, and what to do", code, stderr, cause)
		}
	}
}
