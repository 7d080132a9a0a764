package cli

import (
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
