package vm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestModuleLoadOrder: dependencies load first, each once; built-in
// modules and their absence from modules.dep need nothing; an unknown
// module is an error naming it.
func TestModuleLoadOrder(t *testing.T) {
	dir := t.TempDir()
	dep := strings.Join([]string{
		"kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio_ring.ko:",
		"kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko",
		"kernel/net/core/failover.ko:",
	}, "\n")
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/fs/ext4/ext4.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := moduleLoadOrder(dir, []string{"virtio_pci", "virtio_blk", "virtio_net", "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_pci.ko",
		"kernel/drivers/block/virtio_blk.ko", "kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko",
		"kernel/drivers/net/virtio_net.ko",
	}
	if !slices.Equal(got, want) {
		t.Errorf("load order:\n got %v\nwant %v", got, want)
	}
	if _, err := moduleLoadOrder(dir, []string{"virtio_gpu"}); err == nil || !strings.Contains(err.Error(), "virtio_gpu") {
		t.Errorf("unknown module: err %v, want one naming it", err)
	}
}

// TestFindKernelPrefersCloud: the cloud kernel wins over a generic one,
// and a kernel without modules is not picked.
func TestFindKernelPrefersCloud(t *testing.T) {
	root := t.TempDir()
	for _, rel := range []string{"6.1.0-9-amd64", "6.1.0-9-cloud-amd64", "6.2.0-1-cloud-amd64"} {
		if err := os.MkdirAll(filepath.Join(root, "boot"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "boot", "vmlinuz-"+rel), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if rel == "6.2.0-1-cloud-amd64" {
			continue // no modules
		}
		mods := filepath.Join(root, "lib", "modules", rel)
		if err := os.MkdirAll(mods, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mods, "modules.dep"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k, err := FindKernel(root)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(k.Image) != "vmlinuz-6.1.0-9-cloud-amd64" {
		t.Errorf("picked %s, want the cloud kernel with modules", k.Image)
	}
	if _, err := FindKernel(t.TempDir()); err == nil || !strings.Contains(err.Error(), "linux-image-cloud-amd64") {
		t.Errorf("no kernel: err %v, want one naming the package", err)
	}
}

// TestParseLdd: ldd's resolved libraries and loader are listed, the vDSO
// is not, and a library ldd could not find is an error naming it (the
// guest would not start the binary).
func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibseccomp.so.2 => /lib/x86_64-linux-gnu/libseccomp.so.2 (0x00007f64)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f8b)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f8b)\n"
	got, err := parseLdd(out)
	want := []string{"/lib/x86_64-linux-gnu/libseccomp.so.2", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("parseLdd = %q, %v; want %q", got, err, want)
	}
	if _, err := parseLdd("\tlibfoo.so.1 => not found\n"); err == nil || !strings.Contains(err.Error(), "libfoo.so.1") {
		t.Fatalf("a missing library: %v, want an error naming it", err)
	}
}
