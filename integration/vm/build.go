package vm

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// BuildStatic builds the Go package pkg (a path relative to the module
// root, ./cmd/warmfleet say) as a static binary (CGO_ENABLED=0) into dir
// and returns its path: the guest has no C library. The flags are `make
// build`'s, so the two share the build cache.
func BuildStatic(ctx context.Context, moduleRoot, pkg, dir string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// IsStatic tells whether the ELF binary at path runs without a dynamic
// loader (Debian's busybox-static does; the busybox package's does not).
func IsStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// SharedLibs lists the shared libraries the dynamically linked binary at
// path loads, its loader included, as ldd resolves them on this host: what
// a guest of busybox alone must be given to run it. A static binary needs
// none.
func SharedLibs(ctx context.Context, path string) ([]string, error) {
	if static, err := IsStatic(path); err != nil || static {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, "ldd", path).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", path, err)
	}
	return parseLdd(string(out))
}

// parseLdd reads ldd's lines: "libc.so.6 => /lib/.../libc.so.6 (0x...)",
// "/lib64/ld-linux-x86-64.so.2 (0x...)" and the vDSO, which has no file.
func parseLdd(out string) ([]string, error) {
	var libs []string
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "linux-vdso") || strings.HasPrefix(f[0], "linux-gate"):
		case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
			libs = append(libs, f[2])
		case filepath.IsAbs(f[0]):
			libs = append(libs, f[0])
		default:
			return nil, fmt.Errorf("ldd: cannot resolve %q", strings.TrimSpace(line))
		}
	}
	return libs, nil
}

// MakeImage creates an ext4 file system image of size bytes at path with
// mkfs.ext4. Lazy initialisation is off, so the guest's kernel writes
// nothing in the background that the power-loss model would count.
func MakeImage(ctx context.Context, mkfs, path string, size int64) error {
	return makeExt4(ctx, mkfs, path, size)
}

func makeExt4(ctx context.Context, mkfs, path string, size int64, args ...string) error {
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	args = append([]string{"-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", "-L", "warmfleet"}, args...)
	cmd := exec.CommandContext(ctx, mkfs, append(args, path)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w\n%s", path, err, b)
	}
	return nil
}

// BuildToolsImage makes the guest's read-only tools disk at path: an ext4
// image holding the static binaries warmfleet and guestagent (mkfs.ext4
// -d copies a directory in); agent "" leaves guestagent out (warmfleet-lab
// is both: its vm-agent command is the agent). extra are more binaries,
// each under its base name (containerd).
func BuildToolsImage(ctx context.Context, mkfs, path, warmfleet, agent string, extra ...string) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), "tools-")
	if err != nil {
		return fmt.Errorf("tools image: %w", err)
	}
	defer os.RemoveAll(dir)
	var size int64 = 16 << 20 // the file system's own blocks, with room
	bins := map[string]string{"warmfleet": warmfleet}
	if agent != "" {
		bins["guestagent"] = agent
	}
	for _, b := range extra {
		bins[filepath.Base(b)] = b
	}
	for name, src := range bins {
		if err := os.Link(src, filepath.Join(dir, name)); err != nil {
			b, rerr := os.ReadFile(src)
			if rerr != nil {
				return fmt.Errorf("tools image: %w", rerr)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
				return fmt.Errorf("tools image: %w", err)
			}
		}
		st, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("tools image: %w", err)
		}
		size += st.Size() * 11 / 10
	}
	return makeExt4(ctx, mkfs, path, size, "-d", dir)
}

// CopyImage copies the image src to dst, keeping its holes: a fresh disk
// for each power cut costs only the blocks mkfs wrote.
func CopyImage(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy image: %w", err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy image: %w", err)
	}
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("copy image: %w", err)
	}
	err = copyData(in, out, st.Size())
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy image %s: %w", src, err)
	}
	return nil
}

// copyData copies the data regions of in (SEEK_DATA/SEEK_HOLE) to the same
// offsets of out and gives out in's size.
func copyData(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for pos := data; pos < hole; {
			n, err := in.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if err != nil {
				return err
			}
			if _, err := out.WriteAt(buf[:n], pos); err != nil {
				return err
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}
