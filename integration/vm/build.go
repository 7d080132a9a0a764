package vm

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// BuildStatic builds the Go package pkg (a path relative to the module
// root, ./cmd/warmfleet say) as a static binary (CGO_ENABLED=0) into dir
// and returns its path: the guest has no C library.
func BuildStatic(ctx context.Context, moduleRoot, pkg, dir string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
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

// MakeImage creates an ext4 file system image of size bytes at path with
// mkfs.ext4. Lazy initialisation is off, so the guest's kernel writes
// nothing in the background that the power-loss model would count.
func MakeImage(ctx context.Context, mkfs, path string, size int64) error {
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
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", "-L", "warmfleet", path)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w\n%s", path, err, b)
	}
	return nil
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
