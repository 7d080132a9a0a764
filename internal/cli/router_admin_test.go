package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRouterAdminNeedsTokenOffLoopback: an admin listener other hosts can
// reach is refused without --admin-token-file, as the daemon's API is; a
// bad log flag is refused too. Neither starts a listener.
func TestRouterAdminNeedsTokenOffLoopback(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("tiny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin-listen", "0.0.0.0:0"}, "--admin-token-file"},
		{[]string{"--admin-listen", ":0"}, "--admin-token-file"},
		{[]string{"--admin-listen", "127.0.0.1:0", "--admin-token-file", short}, "at least 16 characters"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-format", "xml"}, "--log-format"},
	} {
		var out syncBuffer
		done := make(chan int, 1)
		go func() {
			args := append([]string{"router", "--listen", "127.0.0.1:0", "--backend", "http://127.0.0.1:1"}, c.args...)
			done <- Run(t.Context(), args, &Env{Stdout: &out, Stderr: &out, Getenv: os.Getenv})
		}()
		select {
		case code := <-done:
			if code != 2 || !strings.Contains(out.String(), c.want) {
				t.Errorf("%v: exit %d, want 2 and %q: %s", c.args, code, c.want, out.String())
			}
		case <-time.After(30 * time.Second): // a bound on a hang, not a timing
			t.Fatalf("%v: the router started: %s", c.args, out.String())
		}
	}
}
