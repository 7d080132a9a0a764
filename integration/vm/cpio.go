package vm

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// cpioWriter writes the "newc" cpio archive the kernel unpacks as its
// initramfs (uncompressed: a guest under software emulation would spend
// seconds inflating it). Only what an initramfs needs is supported:
// directories, regular files, symlinks and character devices.
type cpioWriter struct {
	w   io.Writer
	n   int64 // bytes written, for the 4-byte padding
	ino uint32
	err error
}

// Mode bits of the entries (the S_IF* file types of stat(2)).
const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// header writes one entry's header and name; size bytes of data must follow.
func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	if size > 0xffffffff {
		c.err = fmt.Errorf("cpio: %s: %d bytes is too large for newc", name, size)
		return
	}
	name = strings.TrimPrefix(name, "/")
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with its NUL), check.
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(h))
	c.write(append([]byte(name), 0))
	c.pad()
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string) {
	c.header(name, cpioDir|0o755, 0, 0, 0)
}

// Bytes adds a regular file holding b.
func (c *cpioWriter) Bytes(name string, perm uint32, b []byte) {
	c.header(name, cpioFile|perm, int64(len(b)), 0, 0)
	c.write(b)
	c.pad()
}

// File adds a regular file with the content of the host file src.
func (c *cpioWriter) File(name string, perm uint32, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = fmt.Errorf("cpio: %w", err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.err = fmt.Errorf("cpio: %w", err)
		return
	}
	c.header(name, cpioFile|perm, st.Size(), 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, io.LimitReader(f, st.Size()))
	c.n += n
	if err == nil && n != st.Size() {
		err = fmt.Errorf("%s shrank while being read", src)
	}
	if err != nil {
		c.err = fmt.Errorf("cpio: %w", err)
		return
	}
	c.pad()
}

// Symlink adds a symbolic link to target.
func (c *cpioWriter) Symlink(name, target string) {
	c.header(name, cpioSymlink|0o777, int64(len(target)), 0, 0)
	c.write([]byte(target))
	c.pad()
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, major, minor uint32) {
	c.header(name, cpioCharDev|0o600, 0, major, minor)
}

// Close writes the trailer and returns the first error met.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}
