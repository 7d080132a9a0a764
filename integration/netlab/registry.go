package netlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// registryPort is where the registry host serves the registry API.
const registryPort = 5000

// Registry is a host running Debian's docker-registry (distribution v2),
// plain HTTP, storing blobs in its data directory.
type Registry struct {
	*Host
	// Addr is host:port as clients on lab hosts use it (an insecure
	// registry).
	Addr   string
	Server *Process
}

func startRegistry(ctx context.Context, l *Lab, h *Host) (*Registry, error) {
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		return nil, fmt.Errorf("netlab: registry host: docker-registry not found (apt-get install docker-registry): %w", err)
	}
	r := &Registry{Host: h, Addr: h.Addr(registryPort)}
	cfg := filepath.Join(h.Dir, "registry.yml")
	if err := os.WriteFile(cfg, []byte(registryConfig(h.DataDir, r.Addr)), 0o644); err != nil {
		return nil, fmt.Errorf("netlab: registry host: %w", err)
	}
	r.Server, err = h.Start(ProcSpec{Name: "registry", Path: bin, Args: []string{"serve", cfg}})
	if err != nil {
		return nil, fmt.Errorf("netlab: registry host: %w", err)
	}
	if err := waitHTTP(ctx, h.NS, "http://"+r.Addr+"/v2/", r.Server); err != nil {
		return nil, fmt.Errorf("netlab: registry host: %w; log:\n%s", err, r.Server.Log())
	}
	l.log.Info("netlab: registry up", "addr", r.Addr)
	return r, nil
}

// registryConfig is docker-registry's configuration for a lab host.
func registryConfig(root, addr string) string {
	return strings.TrimSpace(fmt.Sprintf(`
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, root, addr)) + "\n"
}
