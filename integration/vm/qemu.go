package vm

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
)

// VMSpec says how to boot one virtual machine.
type VMSpec struct {
	// Qemu is qemu-system-x86_64.
	Qemu string
	// Kernel and Initramfs are what it boots; Tools the read-only tools
	// disk (BuildToolsImage).
	Kernel, Initramfs, Tools string
	// QMP is the path of qemu's machine-protocol socket (AttachDisk,
	// Save); it must not exist yet.
	QMP string
	// Restore is a state saved by Save: the machine resumes from it
	// instead of booting the kernel. The rest of the spec must be the
	// saved machine's.
	Restore string
	// APIAddr and AgentAddr are loopback host:port the daemon's API and
	// the agent are forwarded to.
	APIAddr, AgentAddr string
	// CPUs and MemoryMiB size the guest (default 2 and 768).
	CPUs, MemoryMiB int
}

// VM is a running qemu. Its console (the guest's serial port: kernel
// messages, init's and the daemon's output) is kept for error messages.
type VM struct {
	cmd     *exec.Cmd
	console *consoleBuffer
	exited  chan struct{}
	waitErr error
	qmpPath string
}

// dataPort is the PCIe root port the data disk is plugged into.
const dataPort = "dataport"

// Start boots a VM under software emulation (TCG: the test machines have
// no KVM), or resumes a saved one (spec.Restore), with the tools disk, a
// free hot-plug slot for the data disk (AttachDisk) and qemu's user
// networking, from which the guest reaches the host's loopback as
// HostFromVM. qemu dies with the test process.
func Start(spec VMSpec) (*VM, error) {
	if spec.CPUs == 0 {
		spec.CPUs = 2
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 768
	}
	fwd, err := hostForward(spec.APIAddr, APIPort)
	if err != nil {
		return nil, err
	}
	afwd, err := hostForward(spec.AgentAddr, AgentPort)
	if err != nil {
		return nil, err
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-machine", "q35", "-accel", "tcg", "-cpu", "max",
		"-smp", fmt.Sprint(spec.CPUs), "-m", fmt.Sprint(spec.MemoryMiB),
		"-kernel", spec.Kernel, "-initrd", spec.Initramfs,
		"-append", "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init " +
			// Less for an emulated CPU to do at boot: no side-channel
			// mitigations, crypto self-tests or probing of absent devices.
			"mitigations=off cryptomgr.notests i8042.noaux i8042.nokbd 8250.nr_uarts=1 no_timer_check tsc=reliable",
		"-drive", "file=" + spec.Tools + ",format=raw,if=none,id=tools,readonly=on", "-device", "virtio-blk-pci,drive=tools",
		// The slot the data disk is plugged into (AttachDisk).
		"-device", "pcie-root-port,id=" + dataPort + ",chassis=1,slot=1",
		"-netdev", "user,id=net0," + fwd + "," + afwd, "-device", "virtio-net-pci,netdev=net0",
		"-qmp", "unix:" + spec.QMP + ",server=on,wait=off",
	}
	if spec.Restore != "" {
		args = append(args, "-incoming", "exec:cat "+shellQuote(spec.Restore))
	}
	v := &VM{cmd: exec.Command(spec.Qemu, args...), console: &consoleBuffer{max: 256 << 10}, exited: make(chan struct{}), qmpPath: spec.QMP}
	v.cmd.Stdout, v.cmd.Stderr = v.console, v.console
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		return nil, fmt.Errorf("vm: start qemu: %w", err)
	}
	go func() { v.waitErr = v.cmd.Wait(); close(v.exited) }()
	return v, nil
}

func hostForward(hostAddr string, guestPort int) (string, error) {
	host, port, err := net.SplitHostPort(hostAddr)
	if err != nil {
		return "", fmt.Errorf("vm: forward %q: %w", hostAddr, err)
	}
	return fmt.Sprintf("hostfwd=tcp:%s:%s-%s:%d", host, port, GuestIP, guestPort), nil
}

// Save saves the running guest's state (its memory and devices, not its
// disks) to path, for Start's spec.Restore, and leaves the guest paused.
// It is qemu's migration into a file: every boot that restores it skips
// the firmware, the kernel's start and init up to where the state was
// saved.
func (v *VM) Save(ctx context.Context, path string) error {
	q, err := dialQMP(ctx, v.qmpPath, v.exited)
	if err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	defer q.close()
	if err := q.run(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	// Paused, nothing changes: one pass at the host's speed.
	if err := q.run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	if err := q.run(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(path)}, nil); err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	var st struct {
		Status    string `json:"status"`
		ErrorDesc string `json:"error-desc"`
	}
	err = q.poll(ctx, "query-migrate", &st, func() (bool, error) {
		switch st.Status {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			return false, fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	return nil
}

// AttachDisk waits until a restored guest's state is loaded, plugs in the
// data disk and lets the guest run: the disk is
// virtio-blk over NBD from the unix socket. qemu's default write-back
// cache mode makes the guest see a volatile write cache, so it sends
// flushes, which reach the NBD server as FLUSH. The guest never saw the
// disk before, so no page of it is in the guest's cache.
func (v *VM) AttachDisk(ctx context.Context, socket string) error {
	q, err := dialQMP(ctx, v.qmpPath, v.exited)
	if err != nil {
		return fmt.Errorf("vm: attach disk: %w", err)
	}
	defer q.close()
	// The state loads first (status inmigrate); the guest saved paused
	// stays paused after it.
	var st struct{ Status string }
	err = q.poll(ctx, "query-status", &st, func() (bool, error) {
		switch st.Status {
		case "running", "paused":
			return true, nil
		case "inmigrate", "prelaunch", "restore-vm":
			return false, nil
		}
		return false, fmt.Errorf("guest %s", st.Status)
	})
	if err != nil {
		return fmt.Errorf("vm: attach disk: %w", err)
	}
	// The raw format over the nbd protocol driver.
	err = q.run(ctx, "blockdev-add", map[string]any{
		"driver": "raw", "node-name": "data",
		"file": map[string]any{"driver": "nbd", "server": map[string]any{"type": "unix", "path": socket}},
	}, nil)
	if err == nil {
		err = q.run(ctx, "device_add", map[string]any{"driver": "virtio-blk-pci", "drive": "data", "bus": dataPort, "id": "datadisk"}, nil)
	}
	if err == nil && st.Status == "paused" {
		err = q.run(ctx, "cont", nil, nil)
	}
	if err != nil {
		return fmt.Errorf("vm: attach disk: %w", err)
	}
	return nil
}

// Exited is closed when qemu has exited.
func (v *VM) Exited() <-chan struct{} { return v.exited }

// ExitErr is qemu's exit status, once Exited is closed.
func (v *VM) ExitErr() error { return v.waitErr }

// Console returns the tail of the guest's console.
func (v *VM) Console() string { return v.console.String() }

// ConsoleHas tells whether the console showed s (in its kept tail or
// before).
func (v *VM) ConsoleHas(s string) bool { return v.console.saw(s) }

// Kill cuts the power: qemu gets SIGKILL, so the guest flushes nothing
// more. It returns once qemu is gone.
func (v *VM) Kill() {
	_ = v.cmd.Process.Kill()
	<-v.exited
}

// consoleBuffer keeps the tail of the console and the markers seen.
type consoleBuffer struct {
	mu    sync.Mutex
	max   int
	b     []byte
	lines []string // every console line starting with "warmfleet-vm:"
	part  []byte   // the unfinished last line
}

func (c *consoleBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b = append(c.b, p...)
	if len(c.b) > c.max {
		c.b = append(c.b[:0], c.b[len(c.b)-c.max:]...)
	}
	c.part = append(c.part, p...)
	for {
		i := strings.IndexByte(string(c.part), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(c.part[:i]), "\r")
		if strings.HasPrefix(line, "warmfleet-vm:") && len(c.lines) < 1000 {
			c.lines = append(c.lines, line)
		}
		c.part = c.part[i+1:]
	}
	if len(c.part) > 64<<10 { // a line without end: keep the memory bounded
		c.part = c.part[:0]
	}
	return len(p), nil
}

func (c *consoleBuffer) saw(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func (c *consoleBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.b)
}
