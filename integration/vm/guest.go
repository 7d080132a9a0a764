package vm

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Kernel is a host kernel a guest boots, with its modules.
type Kernel struct {
	// Image is the vmlinuz file; Modules its /lib/modules/<release>.
	Image, Modules string
}

// FindKernel picks the kernel to boot from the host's /boot: Debian's
// cloud kernel (small, quick to boot, has the virtio drivers) if
// installed, else any. root is "/" except in tests.
func FindKernel(root string) (Kernel, error) {
	images, err := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil {
		return Kernel{}, fmt.Errorf("find kernel: %w", err)
	}
	slices.SortFunc(images, func(a, b string) int {
		// Cloud kernels first, then the newest-named.
		ca, cb := strings.Contains(a, "-cloud-"), strings.Contains(b, "-cloud-")
		if ca != cb {
			if ca {
				return -1
			}
			return 1
		}
		return strings.Compare(b, a)
	})
	for _, img := range images {
		release := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		mods := filepath.Join(root, "lib", "modules", release)
		if _, err := os.Stat(filepath.Join(mods, "modules.dep")); err == nil {
			return Kernel{Image: img, Modules: mods}, nil
		}
	}
	return Kernel{}, fmt.Errorf("no kernel with modules in %s/boot (Debian package linux-image-cloud-amd64; `make test` installs it)", root)
}

// guestModules are the drivers the guest needs: the data disk and the
// network card. Ext4 and the serial console are built into Debian's
// kernels; when these are too, there is nothing to load.
var guestModules = []string{"virtio_pci", "virtio_blk", "virtio_net"}

// moduleLoadOrder returns the module files (relative to the modules
// directory) to load for names, dependencies first, from modules.dep;
// built-in modules (modules.builtin) need none.
func moduleLoadOrder(modDir string, names []string) ([]string, error) {
	deps, err := readModulesDep(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			builtin[moduleName(line)] = true
		}
	}
	var order []string
	seen := map[string]bool{}
	var visit func(name string, depth int) error
	visit = func(name string, depth int) error {
		if seen[name] || builtin[name] {
			return nil
		}
		if depth > 32 {
			return fmt.Errorf("modules.dep: dependency loop at %s", name)
		}
		m, ok := deps[name]
		if !ok {
			return fmt.Errorf("module %s is neither in %s/modules.dep nor built in", name, modDir)
		}
		for _, d := range m.deps {
			if err := visit(moduleName(d), depth+1); err != nil {
				return err
			}
		}
		seen[name] = true
		order = append(order, m.path)
		return nil
	}
	for _, n := range names {
		if err := visit(n, 0); err != nil {
			return nil, err
		}
	}
	return order, nil
}

type moduleDep struct {
	path string
	deps []string
}

func readModulesDep(path string) (map[string]moduleDep, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("modules: %w", err)
	}
	defer f.Close()
	out := map[string]moduleDep{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mod, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		out[moduleName(mod)] = moduleDep{path: mod, deps: strings.Fields(deps)}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules: %w", err)
	}
	return out, nil
}

// moduleName turns kernel/drivers/block/virtio_blk.ko(.xz) into virtio_blk;
// the kernel treats '-' and '_' in module names alike.
func moduleName(path string) string {
	base := filepath.Base(path)
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

// GuestSpec is what goes into a guest's initramfs.
type GuestSpec struct {
	Kernel Kernel
	// Busybox is a static busybox.
	Busybox string
	// DaemonArgs are the `warmfleet daemon` flags; DaemonEnv its
	// environment (the S3 endpoint and keys).
	DaemonArgs, DaemonEnv []string
	// Files are more files to put in the guest, by guest path.
	Files map[string][]byte
	// Agent is the guest agent's command line before its --listen flag;
	// default /opt/guestagent (see BuildToolsImage).
	Agent []string
	// ContainerdConfig, when set, is the config.toml of a containerd
	// (/opt/containerd on the tools disk) that init starts after the
	// data disk's mount and before the daemon, which it starts once
	// containerd serves its socket; the overlay module is loaded for its
	// snapshotter. Libs are host files (SharedLibs: containerd's) copied
	// to the same paths in the guest.
	ContainerdConfig string
	Libs             []string
}

// GuestContainerdSocket is the guest containerd's socket; the config in
// GuestSpec.ContainerdConfig must serve it.
const GuestContainerdSocket = "/run/containerd/containerd.sock"

// Guest addresses under qemu's user networking: the guest is 10.0.2.15,
// the host's loopback is reachable as 10.0.2.2.
const (
	GuestIP    = "10.0.2.15"
	HostFromVM = "10.0.2.2"
	// APIPort is the daemon's API port in the guest; AgentPort the agent's.
	APIPort   = 7000
	AgentPort = 7001
	// DataDir is where the data disk is mounted in the guest; the daemon's
	// --data-dir is below it.
	DataDir = "/data"
)

// BuildInitramfs writes the guest's initramfs to path: busybox, the
// modules and an init script that loads the modules, sets up the network,
// mounts the tools disk (/dev/vda, see BuildToolsImage) on /opt, reads its
// binaries into the page cache and says so on the console
// (markerWaiting): the state the host saves (VM.Save) and every later
// boot restores. Then it waits for the data disk, which the host plugs in
// after the restore (VM.AttachDisk, /dev/vdb, ext4), sets the clock from
// the emulated RTC (the saved clock is as old as the save), mounts the data
// disk on DataDir, starts the daemon with its output on the console and
// hands over to the agent. The two Go binaries are on the tools disk: in
// the initramfs, the emulated CPU would spend seconds copying them.
func BuildInitramfs(path string, spec GuestSpec) error {
	want := guestModules
	if spec.ContainerdConfig != "" {
		want = append(slices.Clip(want), "overlay")
	}
	mods, err := moduleLoadOrder(spec.Kernel.Modules, want)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	c := &cpioWriter{w: w}
	for _, d := range baseDirs {
		c.Dir(d)
	}
	c.CharDev("dev/console", 5, 1)
	c.File("bin/busybox", 0o755, spec.Busybox)
	var insmods []string
	for _, m := range mods {
		guestPath := "lib/modules/" + filepath.Base(m)
		c.File(guestPath, 0o644, filepath.Join(spec.Kernel.Modules, m))
		insmods = append(insmods, "/"+guestPath)
	}
	files := maps.Clone(spec.Files)
	if spec.ContainerdConfig != "" {
		files = mapsWith(files, guestContainerdConfig, []byte(spec.ContainerdConfig))
	}
	libs := make([]string, len(spec.Libs))
	for i, lib := range spec.Libs {
		libs[i] = strings.TrimPrefix(filepath.Clean(lib), "/")
	}
	// The parents of the files and libraries that the list above lacks:
	// the kernel makes no directory for a file.
	dirs := map[string]bool{}
	for _, d := range baseDirs {
		dirs[d] = true
	}
	var more []string
	for _, p := range slices.Concat(slices.Collect(maps.Keys(files)), libs) {
		for d := filepath.Dir(p); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			more = append(more, d)
		}
	}
	slices.Sort(more) // parents first
	for _, d := range more {
		c.Dir(d)
	}
	for i, lib := range libs {
		c.File(lib, 0o755, spec.Libs[i])
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		c.Bytes(name, 0o600, files[name])
	}
	agent := spec.Agent
	if len(agent) == 0 {
		agent = []string{"/opt/guestagent"}
	}
	c.Bytes("init", 0o755, []byte(initScript(insmods, spec.DaemonArgs, spec.DaemonEnv, agent, spec.ContainerdConfig != "")))
	err = c.Close()
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("initramfs %s: %w", path, err)
	}
	return nil
}

// baseDirs are the directories every initramfs has.
var baseDirs = []string{"bin", "dev", "proc", "sys", "tmp", "run", "etc", "lib", "lib/modules", "opt", strings.TrimPrefix(DataDir, "/")}

// Console markers the init script prints, which the test waits for.
const (
	markerWaiting     = "warmfleet-vm: waiting for the data disk"
	markerMounted     = "warmfleet-vm: data disk mounted"
	markerMountFailed = "warmfleet-vm: data disk mount failed"
	markerContainerd  = "warmfleet-vm: containerd serves its socket, or was given up on"
)

// guestContainerdConfig is where GuestSpec.ContainerdConfig goes.
const guestContainerdConfig = "etc/containerd/config.toml"

// mapsWith returns m (nil: a new map) with k set to v.
func mapsWith[K comparable, V any](m map[K]V, k K, v V) map[K]V {
	if m == nil {
		m = map[K]V{}
	}
	m[k] = v
	return m
}

// initScript is the guest's /init. It waits for the tools disk with a
// bounded poll (the driver probes it asynchronously) and for the data disk
// without a bound (the host plugs it in after a restore, or kills the
// machine); a data disk that does not mount powers the guest off, which
// the test sees as qemu's exit.
func initScript(insmods, daemonArgs, env, agent []string, containerd bool) string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
`)
	for _, m := range insmods {
		fmt.Fprintf(&b, "insmod %s || echo 'warmfleet-vm: insmod %s failed'\n", m, m)
	}
	fmt.Fprintf(&b, `ip link set lo up
ip link set eth0 up
ip addr add %s/24 dev eth0
ip route add default via %s
i=0
while [ ! -b /dev/vda ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
mount -t ext4 -o ro,noload /dev/vda /opt || echo 'warmfleet-vm: tools disk mount failed'
cat /opt/* >/dev/null 2>&1
echo '%s'
while [ ! -b /dev/vdb ]; do sleep 0.02; done
hwclock -s -u
if ! mount -t ext4 /dev/vdb %s; then
	echo '%s'
	poweroff -f
fi
echo "%s (write cache: $(cat /sys/block/vdb/queue/write_cache), guest uptime $(cut -d' ' -f1 /proc/uptime) s)"
`, GuestIP, HostFromVM, markerWaiting, DataDir, markerMountFailed, markerMounted)
	if containerd {
		// Its root and state are on the data disk (the config); the daemon
		// gives up on a containerd that does not answer, so it waits.
		fmt.Fprintf(&b, `mkdir -p %s
/opt/containerd --config /%s --log-level warn >/dev/console 2>&1 &
i=0
while [ ! -S %s ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
echo "%s (guest uptime $(cut -d' ' -f1 /proc/uptime) s)"
`, filepath.Dir(GuestContainerdSocket), guestContainerdConfig, GuestContainerdSocket, markerContainerd)
	}
	for _, kv := range env {
		fmt.Fprintf(&b, "export %s\n", shellQuote(kv))
	}
	b.WriteString("/opt/warmfleet daemon")
	for _, a := range daemonArgs {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString(" >/dev/console 2>&1 &\n")
	b.WriteString("exec")
	for _, a := range agent {
		b.WriteString(" " + shellQuote(a))
	}
	fmt.Fprintf(&b, " --listen %s:%d\n", GuestIP, AgentPort)
	return b.String()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
