package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Host is one machine of the lab: a network namespace with one interface
// (eth0) on the lab's bridge, and its own directory.
type Host struct {
	Name string
	NS   Netns
	IP   netip.Addr
	// Dir holds the host's logs and DataDir.
	Dir string
	// DataDir is the host's disk for its daemon.
	DataDir string

	lab  *Lab
	link *Link
}

// Link is the host's cable to the bridge.
func (h *Host) Link() *Link { return h.link }

// Addr joins the host's IP and port.
func (h *Host) Addr(port int) string {
	return netip.AddrPortFrom(h.IP, uint16(port)).String()
}

// Command returns a command that runs inside the host's namespace. Prefer
// Start for long-running processes: the lab then stops them at Close.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return h.NS.Command(ctx, name, args...)
}

// Proxy starts a TCP proxy listening on listenAddr inside this host that
// forwards to upstream (an IP:port reachable from this host), for faults
// such as a peer that corrupts what it serves. The lab closes it.
func (h *Host) Proxy(listenAddr, upstream string) (*Proxy, error) {
	ln, err := h.NS.Listen("tcp", listenAddr)
	if err != nil {
		return nil, err
	}
	p := NewProxy(ln, func(ctx context.Context) (net.Conn, error) {
		return h.NS.DialContext(ctx, "tcp", upstream)
	})
	h.lab.onClose(p.Close)
	return p, nil
}

// LimitDisk mounts a tmpfs of size bytes over DataDir, making it a small
// disk that can run full. Do it while no process uses DataDir; whatever was
// in it is hidden until Close unmounts.
func (h *Host) LimitDisk(size Size) error {
	if size <= 0 {
		return fmt.Errorf("limit disk of %s: size %d", h.Name, size)
	}
	if err := h.lab.addMount(h.DataDir); err != nil {
		return fmt.Errorf("limit disk of %s: %w", h.Name, err)
	}
	if err := syscall.Mount("tmpfs", h.DataDir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+strconv.FormatInt(int64(size), 10)+",mode=0755"); err != nil {
		return fmt.Errorf("limit disk of %s: mount tmpfs: %w", h.Name, err)
	}
	return nil
}

// fillName is the file FillDisk grows.
const fillName = ".netlab-fill"

// FillDisk grows a filler file in DataDir until at most leave bytes are
// free on its file system. Use it on a LimitDisk host: on a real disk it
// would fill the machine.
func (h *Host) FillDisk(leave Size) error {
	mounted, err := isMountPoint(h.DataDir)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("fill disk of %s: %s is not a LimitDisk mount; refusing to fill the machine's disk", h.Name, h.DataDir)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(h.DataDir, &st); err != nil {
		return fmt.Errorf("fill disk of %s: %w", h.Name, err)
	}
	free := int64(st.Bavail) * st.Bsize
	grow := free - int64(leave)
	if grow <= 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(h.DataDir, fillName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("fill disk of %s: %w", h.Name, err)
	}
	buf := make([]byte, 1<<20)
	for grow > 0 {
		n, err := f.Write(buf[:min(int64(len(buf)), grow)])
		grow -= int64(n)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("fill disk of %s: %w", h.Name, err)
		}
	}
	return f.Close()
}

// FreeDisk removes FillDisk's filler file.
func (h *Host) FreeDisk() error {
	err := os.Remove(filepath.Join(h.DataDir, fillName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Link is a host's veth pair into the bridge, shaped on both ends: the host
// end's egress limits what the host sends, the bridge end's egress what it
// receives.
type Link struct {
	host   *Host
	bridge Netns
	port   string // the bridge end's name inside the bridge namespace

	mu   sync.Mutex
	rate Rate
}

// Rate is the current shaping rate (zero: unshaped).
func (k *Link) Rate() Rate {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rate
}

// Shape sets both directions to r; zero removes the shaping.
func (k *Link) Shape(ctx context.Context, r Rate) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ends := []struct {
		ns  Netns
		dev string
	}{{k.host.NS, "eth0"}, {k.bridge, k.port}}
	for _, e := range ends {
		var err error
		if r == 0 {
			_, err = tc(ctx, "-n", string(e.ns), "qdisc", "del", "dev", e.dev, "root")
			if err != nil && k.rate == 0 {
				err = nil // there was nothing to delete
			}
		} else {
			_, err = tc(ctx, append([]string{"-n", string(e.ns), "qdisc", "replace", "dev", e.dev, "root"}, tbfArgs(r)...)...)
		}
		if err != nil {
			return fmt.Errorf("shape link of %s: %w", k.host.Name, err)
		}
	}
	k.rate = r
	return nil
}

// tbfArgs returns the tbf qdisc for rate r. The bucket holds about 4 ms of
// traffic (at least a few full frames, so small rates still pass jumbo GSO
// segments in pieces) and the queue about 20 ms, which keeps a TCP flow
// near the rate without a bloated buffer.
func tbfArgs(r Rate) []string {
	bps := r.BytesPerSecond()
	burst := max(int64(bps*0.004), 16<<10)
	limit := max(int64(bps*0.020), 2*burst)
	return []string{"tbf", "rate", strconv.FormatUint(uint64(r), 10) + "bit",
		"burst", strconv.FormatInt(burst, 10), "limit", strconv.FormatInt(limit, 10)}
}

// Cut takes the bridge's end of the link down: the host loses carrier as
// if its cable were pulled, and nothing passes either way until Restore.
func (k *Link) Cut(ctx context.Context) error {
	if _, err := ip(ctx, "-n", string(k.bridge), "link", "set", k.port, "down"); err != nil {
		return fmt.Errorf("cut link of %s: %w", k.host.Name, err)
	}
	return nil
}

// Restore brings a cut link back up.
func (k *Link) Restore(ctx context.Context) error {
	if _, err := ip(ctx, "-n", string(k.bridge), "link", "set", k.port, "up"); err != nil {
		return fmt.Errorf("restore link of %s: %w", k.host.Name, err)
	}
	return nil
}

// LinkCounters are byte counts of the host's interface.
type LinkCounters struct {
	RxBytes uint64 // received by the host
	TxBytes uint64 // sent by the host
}

// Counters reads the host's interface counters. It reads the namespace's
// /proc/net/dev from a thread inside it (no process is started), so it is
// cheap enough to sample often.
func (k *Link) Counters(ctx context.Context) (LinkCounters, error) {
	text, err := k.host.readNetFile("dev")
	if err != nil {
		return LinkCounters{}, fmt.Errorf("counters of %s: %w", k.host.Name, err)
	}
	return parseNetDev(string(text), "eth0")
}

// readNetFile reads /proc/net/name as the host's namespace sees it, from a
// thread inside the namespace (no process is started).
func (h *Host) readNetFile(name string) ([]byte, error) {
	var text []byte
	err := h.NS.Do(func() error {
		var err error
		text, err = os.ReadFile("/proc/thread-self/net/" + name)
		return err
	})
	return text, err
}

// parseNetDev finds dev's byte counters in /proc/net/dev text.
func parseNetDev(text, dev string) (LinkCounters, error) {
	for line := range strings.SplitSeq(text, "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != dev {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 16 {
			return LinkCounters{}, fmt.Errorf("parse /proc/net/dev: %d fields for %s", len(f), dev)
		}
		rx, err1 := strconv.ParseUint(f[0], 10, 64)
		tx, err2 := strconv.ParseUint(f[8], 10, 64)
		if err1 != nil || err2 != nil {
			return LinkCounters{}, fmt.Errorf("parse /proc/net/dev: bad counters for %s: %q", dev, line)
		}
		return LinkCounters{RxBytes: rx, TxBytes: tx}, nil
	}
	return LinkCounters{}, fmt.Errorf("parse /proc/net/dev: no device %s", dev)
}
