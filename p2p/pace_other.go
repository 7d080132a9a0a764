//go:build !linux

package p2p

import (
	"errors"
	"net"
)

// setPacing is Linux only; elsewhere the upload limiter alone paces.
func setPacing(net.Conn, uint64) error { return errors.ErrUnsupported }
