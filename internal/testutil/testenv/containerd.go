package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Containerd is a running containerd daemon private to one test or benchmark:
// its own root, state directory, gRPC socket and config.
type Containerd struct {
	// Address is the gRPC socket path (what `ctr -a` and client.New take).
	Address string
	// Root and State are the daemon's persistent and runtime directories.
	Root  string
	State string
	// Snapshotter is "overlayfs" when an overlay mount works in Root,
	// otherwise "native".
	Snapshotter string
	// Config is the path of the generated config.toml.
	Config string
	// PID of the daemon.
	PID int
}

// ctrStartTimeout bounds how long a daemon may take to serve its socket.
const ctrStartTimeout = 30 * time.Second

// StartContainerd runs a private containerd (needs root) and stops it when
// the test ends. The CRI plugin and the snapshotters and services that tests
// do not use are disabled, so it neither touches the host's
// /run/containerd nor needs CNI.
func StartContainerd(tb testing.TB) *Containerd {
	tb.Helper()
	RequireRoot(tb)
	Bin(tb, "containerd") // skip, or fail in CI, when it is missing
	// Unix socket paths are limited to 108 bytes; t.TempDir() paths of long
	// test names can exceed that, so the daemon lives in a short directory.
	dir, err := os.MkdirTemp("", "wfctd-")
	if err != nil {
		tb.Fatalf("containerd dir: %v", err)
	}
	tb.Cleanup(func() {
		if err := removeContainerdDir(dir); err != nil {
			tb.Errorf("remove containerd dir: %v", err)
		}
	})
	return startForTest(tb, "containerd", ctrStartTimeout, func(ctx context.Context) (*Containerd, func() error, error) {
		return StartContainerdProcess(ctx, dir)
	})
}

// ContainerdPath finds the containerd binary in the repository's bin/ or PATH.
func ContainerdPath() (string, error) {
	return ToolPath("containerd", "Debian package containerd")
}

// StartContainerdProcess starts containerd with everything under dir
// (created if missing; keep it short, socket paths are limited to 108 bytes)
// and waits until its gRPC socket accepts connections or ctx ends. ctx
// bounds only the start. stop terminates the daemon and unmounts what it
// left mounted under dir; it removes no files. It is for benchmarks and
// commands; tests use StartContainerd.
func StartContainerdProcess(ctx context.Context, dir string) (*Containerd, func() error, error) {
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("containerd needs root")
	}
	bin, err := ContainerdPath()
	if err != nil {
		return nil, nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, nil, err
	}
	c := &Containerd{
		Address: filepath.Join(dir, "c.sock"),
		Root:    filepath.Join(dir, "root"),
		State:   filepath.Join(dir, "state"),
		Config:  filepath.Join(dir, "config.toml"),
	}
	if len(c.Address)+len(".ttrpc") >= 108 {
		return nil, nil, fmt.Errorf("containerd socket path %s is too long for a unix socket", c.Address)
	}
	for _, d := range []string{c.Root, c.State} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, nil, fmt.Errorf("containerd dir: %w", err)
		}
	}
	c.Snapshotter = "native"
	if err := probeOverlay(c.Root); err == nil {
		c.Snapshotter = "overlayfs"
	}
	if err := os.WriteFile(c.Config, []byte(containerdConfig(c)), 0o600); err != nil {
		return nil, nil, fmt.Errorf("containerd config: %w", err)
	}

	cmd := exec.Command(bin, "--config", c.Config, "--log-level", "warn")
	// Only the config decides where it lives; CONTAINERD_* from the caller
	// (for example CONTAINERD_ADDRESS) must not leak in.
	cmd.Env = filteredEnv(os.Environ(), "CONTAINERD_")
	svc, err := startService(cmd, 16<<10)
	if err != nil {
		return nil, nil, err
	}
	c.PID = cmd.Process.Pid
	stop := func() error {
		var err error
		if svc.stop(10 * time.Second) {
			err = fmt.Errorf("containerd at %s ignored SIGTERM for 10s; killed", c.Address)
		}
		// Snapshots that were mounted by the daemon's differ are unmounted
		// by it; anything left (a crash) must not keep dir busy.
		return errors.Join(err, unmountUnder(dir))
	}
	if err := waitUnixSocket(ctx, c.Address, svc.exited); err != nil {
		return nil, nil, errors.Join(svc.startFailed("containerd at "+c.Address, err), unmountUnder(dir))
	}
	return c, stop, nil
}

// ContainerdConfig is the config.toml StartContainerdProcess writes, for a
// containerd elsewhere (a virtual machine's) with its root, state and gRPC
// socket at these paths.
func ContainerdConfig(root, state, address string) string {
	return containerdConfig(&Containerd{Root: root, State: state, Address: address})
}

// containerdConfig renders a version 2 config (understood by 1.6 through
// 2.x). Plugins that would need host setup (CRI wants CNI, devmapper a thin
// pool) or that would write outside dir (opt) are disabled.
func containerdConfig(c *Containerd) string {
	disabled := []string{
		"io.containerd.grpc.v1.cri",
		"io.containerd.snapshotter.v1.aufs",
		"io.containerd.snapshotter.v1.btrfs",
		"io.containerd.snapshotter.v1.zfs",
		"io.containerd.snapshotter.v1.devmapper",
		"io.containerd.internal.v1.opt",
		"io.containerd.tracing.processor.v1.otlp",
		"io.containerd.internal.v1.tracing",
	}
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	quoted := make([]string, len(disabled))
	for i, d := range disabled {
		quoted[i] = q(d)
	}
	return fmt.Sprintf(`version = 2
root = %s
state = %s
disabled_plugins = [%s]

[grpc]
  address = %s

[ttrpc]
  address = %s

[debug]
  address = ""

[metrics]
  address = ""
`, q(c.Root), q(c.State), strings.Join(quoted, ", "), q(c.Address), q(c.Address+".ttrpc"))
}

// probeOverlay mounts a tiny overlay under root: the overlayfs snapshotter
// loads on kernels that list overlay but fails later where the backing file
// system (or a user namespace) refuses the mount.
func probeOverlay(root string) error {
	dir, err := os.MkdirTemp(root, "overlay-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var paths [4]string
	for i, n := range []string{"lower", "upper", "work", "merged"} {
		paths[i] = filepath.Join(dir, n)
		if err := os.Mkdir(paths[i], 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", paths[0], paths[1], paths[2])
	if err := syscall.Mount("overlay", paths[3], "overlay", 0, opts); err != nil {
		return fmt.Errorf("overlay mount: %w", err)
	}
	return syscall.Unmount(paths[3], 0)
}

// waitUnixSocket polls until path accepts a connection, the process exits
// or ctx ends. containerd creates its socket only after every plugin has
// loaded, so a connection means it serves.
func waitUnixSocket(ctx context.Context, path string, exited <-chan struct{}) error {
	var d net.Dialer
	var last error
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn.Close()
		}
		last = err
		select {
		case <-exited:
			return errors.New("exited before serving its socket")
		case <-ctx.Done():
			return fmt.Errorf("socket not served: %w (last error: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	var points []string
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	for line := range strings.SplitSeq(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if strings.HasPrefix(mp, prefix) {
			points = append(points, mp)
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountinfo reverses the octal escapes (\040 for a space) that
// the kernel uses in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// removeContainerdDir removes a stopped daemon's directory, first making
// sure nothing below it is still mounted.
func removeContainerdDir(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
