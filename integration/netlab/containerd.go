package netlab

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Containerd is a containerd daemon of one host, with its own root, state
// and sockets, so several run side by side on one machine.
type Containerd struct {
	*Process
	// Address is the gRPC unix socket (ctr --address, containerd.New).
	Address string
	Root    string
	State   string
}

// StartContainerd runs containerd inside the host with everything under the
// host's directory (root) and the run directory (state and sockets, whose
// paths must stay short). The CRI plugin is disabled: the lab has no
// kubelet. bin is the containerd binary; empty means "containerd" in PATH.
func (h *Host) StartContainerd(ctx context.Context, bin string) (*Containerd, error) {
	if bin == "" {
		bin = "containerd"
	}
	bin, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("start containerd on %s: %w", h.Name, err)
	}
	base := filepath.Join(h.lab.RunDir(), h.Name+"-ctd")
	c := &Containerd{
		Address: base + ".sock",
		Root:    filepath.Join(h.Dir, "containerd"),
		State:   filepath.Join(base, "state"),
	}
	for _, d := range []string{c.Root, c.State} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("start containerd on %s: %w", h.Name, err)
		}
	}
	cfg := filepath.Join(h.Dir, "containerd.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(c, base)), 0o644); err != nil {
		return nil, fmt.Errorf("start containerd on %s: %w", h.Name, err)
	}
	c.Process, err = h.Start(ProcSpec{Name: "containerd", Path: bin, Args: []string{"--config", cfg}})
	if err != nil {
		return nil, err
	}
	if err := waitUnix(ctx, c.Address, c.Process); err != nil {
		return nil, fmt.Errorf("containerd on %s: %w; log:\n%s", h.Name, err, tail(c.Log(), 4<<10))
	}
	return c, nil
}

func containerdConfig(c *Containerd, base string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, c.Root, c.State, c.Address, base+"-ttrpc.sock", filepath.Join(c.Root, "opt"))
}

// waitUnix waits until a unix socket accepts connections.
func waitUnix(ctx context.Context, path string, proc *Process) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c.Close()
		}
		last = err
		select {
		case <-proc.Done():
			return fmt.Errorf("exited before listening on %s", path)
		case <-ctx.Done():
			return fmt.Errorf("not listening on %s: %w (last error: %v)", path, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
