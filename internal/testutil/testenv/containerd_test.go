package testenv

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStartContainerdServesAndStops(t *testing.T) {
	c := StartContainerd(t)
	if c.Snapshotter != "overlayfs" && c.Snapshotter != "native" {
		t.Fatalf("snapshotter %q", c.Snapshotter)
	}
	t.Logf("containerd pid %d at %s, snapshotter %s", c.PID, c.Address, c.Snapshotter)
	conn, err := net.Dial("unix", c.Address)
	if err != nil {
		t.Fatalf("dial %s: %v", c.Address, err)
	}
	_ = conn.Close()
	cfg, err := os.ReadFile(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `"io.containerd.grpc.v1.cri"`) {
		t.Errorf("config does not disable CRI:\n%s", cfg)
	}
	// The daemon's data must live below its own root, not /var/lib/containerd.
	if _, err := os.Stat(filepath.Join(c.Root, "io.containerd.metadata.v1.bolt")); err != nil {
		t.Errorf("metadata not under the private root: %v", err)
	}
}

func TestStartContainerdProcessStop(t *testing.T) {
	RequireRoot(t)
	Bin(t, "containerd")
	dir, err := os.MkdirTemp("", "wfctd-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	c, stop, err := StartContainerdProcess(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	stopTwice(t, stop)
	if err := syscall.Kill(c.PID, 0); err == nil {
		t.Fatalf("containerd pid %d still alive after stop", c.PID)
	}
	if _, err := net.DialTimeout("unix", c.Address, time.Second); err == nil {
		t.Fatal("socket still served after stop")
	}
}

func TestStartContainerdProcessRejectsLongSocketPath(t *testing.T) {
	RequireRoot(t)
	Bin(t, "containerd")
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 110))
	if _, _, err := StartContainerdProcess(t.Context(), dir); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("got %v, want a too-long socket path error", err)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/a/b", "/a/b"},
		{`/a\040b`, "/a b"},
		{`/a\134b`, `/a\b`},
		{`/a\04`, `/a\04`},
		{`/a\999`, `/a\999`},
	} {
		if got := unescapeMountinfo(tc.in); got != tc.want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestStartRegistryAnonymousAndAuth(t *testing.T) {
	for _, tc := range []struct {
		name       string
		start      func(testing.TB) *Registry
		wantStatus int
	}{
		{"anonymous", StartRegistry, http.StatusOK},
		{"htpasswd", func(tb testing.TB) *Registry { return StartRegistryWithAuth(tb, "alice", "s3cret") }, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.start(t)
			resp, err := http.Get("http://" + r.Addr + "/v2/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("GET /v2/ = %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			if r.Username == "" {
				return
			}
			req, _ := http.NewRequest(http.MethodGet, "http://"+r.Addr+"/v2/", nil)
			req.SetBasicAuth(r.Username, r.Password)
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /v2/ with the right password = %d, want 200", resp.StatusCode)
			}
			req.SetBasicAuth(r.Username, "wrong")
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("GET /v2/ with a wrong password = %d, want 401", resp.StatusCode)
			}
		})
	}
}

func TestStartRegistryProcessRejectsHalfCredentials(t *testing.T) {
	if _, _, err := StartRegistryProcess(t.Context(), t.TempDir(), RegistryOptions{Username: "a"}); err == nil {
		t.Fatal("want an error for a username without password")
	}
}
