//go:build linux

package p2p

import (
	"crypto/tls"
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// setPacing caps how fast the kernel sends on c's TCP socket
// (SO_MAX_PACING_RATE), in bytes per second. A TLS connection is paced
// through the TCP connection under it.
func setPacing(c net.Conn, bytesPerSecond uint64) error {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return errors.ErrUnsupported
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, bytesPerSecond)
	}); err != nil {
		return err
	}
	return serr
}
