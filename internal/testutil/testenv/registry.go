package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Registry is a running OCI distribution registry (Debian's docker-registry)
// serving plain HTTP on a loopback port, with its storage in a temporary
// directory.
type Registry struct {
	// Addr is host:port, which is also the registry host in image
	// references: Addr + "/repo:tag".
	Addr string
	// Dir is the storage root.
	Dir string
	// Username and Password are set when the registry requires htpasswd
	// basic auth; empty means anonymous access.
	Username string
	Password string
}

// RegistryOptions configure StartRegistryProcess.
type RegistryOptions struct {
	// Username and Password turn on htpasswd authentication with this one
	// account. Both or neither must be set.
	Username string
	Password string
}

// Ref returns the reference of repo:tag in this registry.
func (r *Registry) Ref(repo, tag string) string {
	return r.Addr + "/" + repo + ":" + tag
}

// StartRegistry starts an anonymous registry for the test and stops it when
// the test ends.
func StartRegistry(tb testing.TB) *Registry {
	tb.Helper()
	return startRegistryTB(tb, RegistryOptions{})
}

// StartRegistryWithAuth starts a registry that accepts only user/password
// (basic auth via htpasswd).
func StartRegistryWithAuth(tb testing.TB, user, password string) *Registry {
	tb.Helper()
	if user == "" || password == "" {
		tb.Fatal("StartRegistryWithAuth: empty user or password")
	}
	return startRegistryTB(tb, RegistryOptions{Username: user, Password: password})
}

func startRegistryTB(tb testing.TB, opts RegistryOptions) *Registry {
	tb.Helper()
	Bin(tb, "docker-registry") // skip, or fail in CI, when it is missing
	dir := tb.TempDir()
	return startForTest(tb, "registry", 30*time.Second, func(ctx context.Context) (*Registry, func() error, error) {
		return StartRegistryProcess(ctx, dir, opts)
	})
}

// RegistryPath finds the docker-registry binary in the repository's bin/ or
// PATH.
func RegistryPath() (string, error) {
	return ToolPath("docker-registry", "Debian package docker-registry")
}

// StartRegistryProcess starts docker-registry with its config, storage and
// optional htpasswd file in dir (created if missing) on a free loopback
// port, and waits until it answers HTTP or ctx ends. ctx bounds only the
// start; stop terminates it and removes nothing. It is for benchmarks and
// commands; tests use StartRegistry.
func StartRegistryProcess(ctx context.Context, dir string, opts RegistryOptions) (*Registry, func() error, error) {
	if (opts.Username == "") != (opts.Password == "") {
		return nil, nil, errors.New("registry: set both username and password, or neither")
	}
	if strings.ContainsAny(opts.Username, ":\n") {
		return nil, nil, fmt.Errorf("registry: username %q may not contain ':' or a newline", opts.Username)
	}
	bin, err := RegistryPath()
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, nil, fmt.Errorf("registry dir: %w", err)
	}
	htpasswd := ""
	if opts.Username != "" {
		// The cost is the minimum: the hash only guards a loopback
		// registry, and every request with credentials pays for it.
		hash, err := bcrypt.GenerateFromPassword([]byte(opts.Password), bcrypt.MinCost)
		if err != nil {
			return nil, nil, fmt.Errorf("htpasswd: %w", err)
		}
		htpasswd = filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, fmt.Appendf(nil, "%s:%s\n", opts.Username, hash), 0o600); err != nil {
			return nil, nil, fmt.Errorf("htpasswd: %w", err)
		}
	}
	// The port is free a moment before the registry binds it; retry with a
	// fresh one if somebody else took it meanwhile.
	var lastErr error
	for range 3 {
		addr, err := PickFreeAddr()
		if err != nil {
			return nil, nil, err
		}
		r, stop, err := startRegistry(ctx, bin, dir, addr, htpasswd, opts)
		if err == nil {
			return r, stop, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, nil, lastErr
}

func startRegistry(ctx context.Context, bin, dir, addr, htpasswd string, opts RegistryOptions) (*Registry, func() error, error) {
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(registryConfig(filepath.Join(dir, "storage"), addr, htpasswd)), 0o600); err != nil {
		return nil, nil, fmt.Errorf("registry config: %w", err)
	}
	cmd := exec.Command(bin, "serve", cfg)
	// REGISTRY_* variables override the config file; the caller's must not.
	cmd.Env = filteredEnv(os.Environ(), "REGISTRY_")
	svc, err := startService(cmd, 8<<10)
	if err != nil {
		return nil, nil, err
	}
	stop := func() error {
		if svc.stop(5 * time.Second) {
			return fmt.Errorf("registry on %s ignored SIGTERM for 5s; killed", addr)
		}
		return nil
	}
	if err := WaitHTTP(ctx, nil, "http://"+addr+"/v2/", svc.exited); err != nil {
		return nil, nil, svc.startFailed("registry on "+addr, err)
	}
	return &Registry{Addr: addr, Dir: dir, Username: opts.Username, Password: opts.Password}, stop, nil
}

// registryConfig renders the registry's YAML. Upload purging and health
// checks are off: they only start background work a short test never
// needs.
func registryConfig(storage, addr, htpasswd string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %q
  secret: warmfleet-test-only
`, storage, addr)
	if htpasswd != "" {
		fmt.Fprintf(&b, `auth:
  htpasswd:
    realm: warmfleet-test
    path: %q
`, htpasswd)
	}
	return b.String()
}
