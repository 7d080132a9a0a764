package imagecache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
)

// hostsFor returns the registry hosts containerd's hosts-dir logic yields
// for host, as newResolver configures it.
func hostsFor(t *testing.T, dir, host string) []docker.RegistryHost {
	t.Helper()
	opts := config.HostOptions{HostDir: config.HostDirFromRoot(dir)}
	hosts, err := config.ConfigureHosts(context.Background(), opts)(host)
	if err != nil {
		t.Fatalf("hosts for %s: %v", host, err)
	}
	return hosts
}

func writeHosts(t *testing.T, dir, host, toml string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHostsDir(t *testing.T) {
	dir := t.TempDir()
	writeHosts(t, dir, "docker.io", `server = "https://registry-1.docker.io"
[host."http://mirror.local:5000"]
  capabilities = ["pull", "resolve"]
`)
	writeHosts(t, dir, "10.0.0.5:5000", `server = "http://10.0.0.5:5000"`)
	writeHosts(t, dir, "_default", `[host."https://fallback.example.com"]
  capabilities = ["pull", "resolve"]
`)
	for _, tc := range []struct {
		host string
		want []string // scheme://host/path, in order of preference
	}{
		{"docker.io", []string{"http://mirror.local:5000/v2", "https://registry-1.docker.io/v2"}},
		{"10.0.0.5:5000", []string{"http://10.0.0.5:5000/v2"}},
		{"quay.io", []string{"https://fallback.example.com/v2", "https://quay.io/v2"}},
	} {
		t.Run(tc.host, func(t *testing.T) {
			var got []string
			for _, h := range hostsFor(t, dir, tc.host) {
				got = append(got, h.Scheme+"://"+h.Host+h.Path)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("hosts = %v, want %v", got, tc.want)
			}
		})
	}
	// A loopback registry works without any hosts.toml: containerd tries
	// TLS and falls back to plain HTTP, as ctr does.
	if h := hostsFor(t, t.TempDir(), "127.0.0.1:5000"); len(h) != 1 || h[0].Host != "127.0.0.1:5000" || h[0].Scheme != "https" {
		t.Fatalf("loopback default = %+v", h)
	}
}

func FuzzHostsToml(f *testing.F) {
	f.Add(`server = "https://registry-1.docker.io"
[host."http://mirror.local:5000"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
`)
	f.Add(`[host."x"]` + "\n" + `header = { a = ["b"] }`)
	f.Fuzz(func(t *testing.T, toml string) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "reg.example.com"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "reg.example.com", "hosts.toml"), []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		// An operator's malformed file must give an error, never a panic.
		_, _ = config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: config.HostDirFromRoot(dir)})("reg.example.com")
	})
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		want   error
		reason string
	}{
		{"resolver not found", fmt.Errorf("failed to resolve reference: %w", errdefs.ErrNotFound), ErrNotFound, "not_found"},
		{"blob 404", remoteerrors.ErrUnexpectedStatus{Status: "404 Not Found", StatusCode: 404}, ErrNotFound, "not_found"},
		{"401", fmt.Errorf("fetch: %w", remoteerrors.ErrUnexpectedStatus{Status: "401 Unauthorized", StatusCode: 401}), ErrUnauthorized, "unauthorized"},
		{"403", remoteerrors.ErrUnexpectedStatus{Status: "403 Forbidden", StatusCode: 403}, ErrUnauthorized, "unauthorized"},
		{"errdefs unauthorized", fmt.Errorf("x: %w", errdefs.ErrUnauthenticated), ErrUnauthorized, "unauthorized"},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, ErrUnreachable, "unreachable"},
		{"dns", &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}, ErrUnreachable, "unreachable"},
		{"canceled", fmt.Errorf("pull: %w", context.Canceled), nil, "canceled"},
		{"other", errors.New("unpack: invalid tar header"), nil, "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.err)
			if !strings.Contains(got.Error(), tc.err.Error()) {
				t.Fatalf("classify lost the original error: %v", got)
			}
			if tc.want != nil && !errors.Is(got, tc.want) {
				t.Fatalf("classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if r := errorReason(got); r != tc.reason {
				t.Fatalf("errorReason = %q, want %q", r, tc.reason)
			}
			if classify(got).Error() != got.Error() {
				t.Fatal("classify is not idempotent")
			}
		})
	}
	if classify(nil) != nil {
		t.Fatal("classify(nil) != nil")
	}
	if !strings.Contains(classify(remoteerrors.ErrUnexpectedStatus{Status: "401 Unauthorized", StatusCode: 401}).Error(), "refused the credentials") {
		t.Fatal("unauthorized message unclear")
	}
}
