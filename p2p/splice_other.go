//go:build !linux

package p2p

import (
	"errors"
	"hash"
	"net"
	"os"
)

// splicer exists on Linux only; elsewhere every connection reads piece
// bodies into buffers.
type splicer struct{}

func newSplicer(net.Conn) (*splicer, error) { return nil, errors.ErrUnsupported }

func (*splicer) Close() error { return nil }

func (*splicer) capacity() int { return 0 }

func (*splicer) receive(func(func(*os.File) error) error, int64, int) error {
	return errors.ErrUnsupported
}

// hashMapped is unsupported here: hashFile reads the file instead.
func hashMapped(hash.Hash, *os.File, int64, int64) error { return errors.ErrUnsupported }
