//go:build linux

package p2p

import (
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"
)

// pipeSize is the pipe capacity a splicer asks for: one splice then moves
// up to 1 MiB rather than the default 64 KiB. 1 MiB is also the default
// fs.pipe-max-size, the most an unprivileged process may set.
const pipeSize = 1 << 20

// mapWindow bounds how much of a piece is mapped at once while hashing it
// from the file, whatever the piece length.
const mapWindow = 4 << 20

// splicer moves piece bodies from a TCP socket into the shard file through
// a pipe with splice(2): the kernel copies socket buffers into the page
// cache once, instead of socket to user space and user space to page cache.
// One per connection; not safe for concurrent use.
type splicer struct {
	conn syscall.RawConn
	r, w int // the pipe's ends
	size int // the pipe's capacity
}

// newSplicer returns a splicer for c, or an error wrapping
// errors.ErrUnsupported when c is not plain TCP.
func newSplicer(c net.Conn) (*splicer, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, fmt.Errorf("p2p: splice from %T: %w", c, errors.ErrUnsupported)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("p2p: pipe: %w", err)
	}
	sp := &splicer{conn: rc, r: p[0], w: p[1]}
	// Past fs.pipe-max-size or the user's pipe quota this fails; the
	// default capacity still works, with more syscalls.
	if sp.size, err = unix.FcntlInt(uintptr(sp.w), unix.F_SETPIPE_SZ, pipeSize); err != nil {
		sp.size, err = unix.FcntlInt(uintptr(sp.w), unix.F_GETPIPE_SZ, 0)
	}
	if err != nil {
		sp.Close()
		return nil, fmt.Errorf("p2p: pipe size: %w", err)
	}
	return sp, nil
}

// Close closes the pipe.
func (sp *splicer) Close() error {
	return errors.Join(unix.Close(sp.r), unix.Close(sp.w))
}

// capacity is the most one receive call may move.
func (sp *splicer) capacity() int { return sp.size }

// receive moves exactly n bytes (at most capacity) from the socket into the
// shard file at off, getting the file from withFile only to write, so the
// file is not held while the peer is slow. It waits for the socket through
// the runtime poller: read deadlines and closing the connection interrupt
// it. Failures on the file side wrap errStore. After an error the pipe may
// hold bytes: the connection must be dropped.
func (sp *splicer) receive(withFile func(func(*os.File) error) error, off int64, n int) error {
	for n > 0 {
		got, err := sp.fill(n)
		if err != nil {
			return err
		}
		if err := withFile(func(file *os.File) error { return sp.drain(file, &off, got) }); err != nil {
			return err
		}
		n -= got
	}
	return nil
}

// drain splices the n bytes the pipe holds into file at *off, advancing it.
// It does not block on the pipe; it may on the disk, as pwrite would.
func (sp *splicer) drain(file *os.File, off *int64, n int) error {
	fc, err := file.SyscallConn()
	if err != nil {
		return fmt.Errorf("%w: %w", errStore, err)
	}
	var opErr error
	ctlErr := fc.Control(func(fd uintptr) {
		for n > 0 && opErr == nil {
			k, err := unix.Splice(sp.r, nil, int(fd), off, n, unix.SPLICE_F_MOVE)
			switch {
			case err == unix.EINTR:
			case err != nil:
				opErr = fmt.Errorf("%w: splice to %s: %w", errStore, file.Name(), err)
			case k == 0:
				opErr = fmt.Errorf("%w: splice to %s: no progress", errStore, file.Name())
			default:
				n -= int(k)
			}
		}
	})
	if opErr == nil && ctlErr != nil {
		opErr = fmt.Errorf("%w: %w", errStore, ctlErr)
	}
	return opErr
}

// fill splices up to n bytes from the socket into the empty pipe: all the
// socket has, waiting only while it has nothing.
func (sp *splicer) fill(n int) (int, error) {
	got := 0
	var opErr error
	err := sp.conn.Read(func(fd uintptr) bool {
		for got < n {
			k, err := unix.Splice(int(fd), nil, sp.w, nil, n-got, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case err == unix.EINTR:
			case err == unix.EAGAIN:
				return got > 0 // nothing more now: move what we have, or wait
			case err != nil:
				opErr = fmt.Errorf("p2p: splice from socket: %w", err)
				return true
			case k == 0:
				opErr = io.ErrUnexpectedEOF // the peer closed mid-piece
				return true
			default:
				got += int(k)
			}
		}
		return true
	})
	if opErr == nil {
		opErr = err
	}
	return got, opErr
}

// hashMapped hashes n bytes of file at off from read-only mappings of the
// page cache, mapWindow at a time. It returns an error wrapping
// errors.ErrUnsupported when the file cannot be mapped (the caller then
// reads it instead). A fault while hashing, as when someone truncates the
// file meanwhile, is an error rather than a crash.
func hashMapped(h hash.Hash, file *os.File, off, n int64) (err error) {
	fc, err := file.SyscallConn()
	if err != nil {
		return err
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			fault, ok := r.(interface {
				error
				Addr() uintptr
			})
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("p2p: %s changed while being hashed: %w", file.Name(), fault)
		}
	}()
	page := int64(os.Getpagesize())
	var opErr error
	ctlErr := fc.Control(func(fd uintptr) {
		for pos, end := off, off+n; pos < end && opErr == nil; {
			// Mappings start on a page boundary; a piece need not.
			base := pos &^ (page - 1)
			k := min(end-pos, mapWindow-(pos-base))
			m, err := unix.Mmap(int(fd), base, int(pos-base+k), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
			if err != nil {
				opErr = fmt.Errorf("p2p: mmap %s: %w (%w)", file.Name(), err, errors.ErrUnsupported)
				return
			}
			func() {
				defer func() { _ = unix.Munmap(m) }() // only fails for a bad address
				_, _ = h.Write(m[pos-base:])
			}()
			pos += k
		}
	})
	if opErr == nil {
		opErr = ctlErr
	}
	return opErr
}
