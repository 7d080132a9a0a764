package vm

import (
	"encoding/json"
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
	// DiskSocket is the unix socket of the NBD server holding the data disk.
	DiskSocket string
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
}

// Start boots a VM under software emulation (TCG: the test machines have
// no KVM), with the data disk on virtio-blk over NBD and qemu's user
// networking, from which the guest reaches the host's loopback as
// HostFromVM. qemu dies with the test process.
func Start(spec VMSpec) (*VM, error) {
	if spec.CPUs == 0 {
		spec.CPUs = 2
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 768
	}
	// The raw format over the nbd protocol driver. qemu's default cache
	// mode is writeback, so the guest sees a volatile write cache and
	// sends flushes, which reach the NBD server as FLUSH.
	disk, err := json.Marshal(map[string]any{
		"driver": "raw", "node-name": "data",
		"file": map[string]any{"driver": "nbd", "server": map[string]any{"type": "unix", "path": spec.DiskSocket}},
	})
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
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
		// The data disk first: the guest names it vda, the tools vdb.
		"-blockdev", string(disk), "-device", "virtio-blk-pci,drive=data",
		"-drive", "file=" + spec.Tools + ",format=raw,if=none,id=tools,readonly=on", "-device", "virtio-blk-pci,drive=tools",
		"-netdev", "user,id=net0," + fwd + "," + afwd, "-device", "virtio-net-pci,netdev=net0",
	}
	v := &VM{cmd: exec.Command(spec.Qemu, args...), console: &consoleBuffer{max: 256 << 10}, exited: make(chan struct{})}
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
