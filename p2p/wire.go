package p2p

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

// Peer protocol after authentication. The dialer downloads, the acceptor
// uploads; every frame is type(1) length(4, big endian) payload. A piece
// frame's payload is the piece index and byte count, and the raw bytes
// follow outside the frame so the sender can sendfile them.
const (
	msgSubscribe    byte = 1 + iota // C->S skeleton id [32], shard id
	msgBitfield                     // S->C bitfield of verified pieces, then their hashes in order
	msgNotFound                     // S->C shard not open here
	msgHave                         // S->C piece index u32, piece hash
	msgRequest                      // C->S piece index u32
	msgPiece                        // S->C piece index u32, length u32, then bytes
	msgBusy                         // S->C piece index u32: no upload slot, ask later
	msgGetManifest                  // C->S shard id (first frame instead of subscribe)
	msgManifest                     // S->C encoded manifest
	msgInProgress                   // S->C shard open but incomplete: pieces held u32
	msgWaitManifest                 // C->S wait ms u32, shard id: msgGetManifest answered once the shard opens here (or the wait ends)
	msgUnsubscribe                  // C->S the shard is complete here: send nothing more of it
	msgUnsubscribed                 // S->C after msgUnsubscribe: nothing more of the shard follows, the connection may carry another exchange
)

// maxManifestFrame bounds a manifest frame: every piece hash plus names.
const maxManifestFrame = MaxPieces*64 + 4096

const maxFramePayload = MaxPieces/8 + 64

// maxBitfieldFrame bounds a bitfield frame: the bits and a hash per piece.
const maxBitfieldFrame = MaxPieces/8 + MaxPieces*64

var errProtocol = errors.New("p2p: protocol violation")

type frame struct {
	typ     byte
	payload []byte
}

func writeFrame(w io.Writer, typ byte, payload []byte) error {
	b := make([]byte, 5+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	copy(b[5:], payload)
	_, err := w.Write(b)
	return err
}

func u32(v int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }

func readFrame(r *bufio.Reader) (frame, error) { return readFrameMax(r, maxFramePayload) }

func readFrameMax(r *bufio.Reader, limit uint32) (frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > limit {
		return frame{}, fmt.Errorf("%w: frame of %d bytes", errProtocol, n)
	}
	// The buffer grows with the bytes that arrive: the header costs the
	// peer five bytes, and must not make us allocate up to limit for them.
	payload, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return frame{}, err
	}
	if len(payload) < int(n) {
		return frame{}, io.ErrUnexpectedEOF
	}
	return frame{typ: hdr[0], payload: payload}, nil
}

// index decodes a frame whose payload starts with a piece index below n.
func (f frame) index(n int) (int, error) {
	if len(f.payload) < 4 {
		return 0, fmt.Errorf("%w: short frame type %d", errProtocol, f.typ)
	}
	i := binary.BigEndian.Uint32(f.payload)
	if int64(i) >= int64(n) {
		return 0, fmt.Errorf("%w: piece %d of %d", errProtocol, i, n)
	}
	return int(i), nil
}

// sendRange writes n bytes of f at off to c. On a plain TCP connection the
// kernel copies page cache to socket (sendfile) without a user-space pass;
// TLS connections get a buffered copy.
func sendRange(c net.Conn, f *os.File, off, n int64, buf []byte) (int64, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return io.CopyBuffer(struct{ io.Writer }{c}, io.NewSectionReader(f, off, n), buf)
	}
	sc, err := tc.SyscallConn()
	if err != nil {
		return 0, err
	}
	fc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var sent int64
	var opErr error
	ctlErr := fc.Control(func(infd uintptr) {
		err := sc.Write(func(outfd uintptr) bool {
			for sent < n {
				w, err := syscall.Sendfile(int(outfd), int(infd), &off, int(min(n-sent, 1<<30)))
				if w > 0 {
					sent += int64(w)
				}
				switch {
				case err == syscall.EAGAIN:
					return false // wait until the socket is writable
				case err == syscall.EINTR:
					continue
				case err != nil:
					opErr = err
					return true
				case w == 0:
					opErr = io.ErrUnexpectedEOF // file shorter than expected
					return true
				}
			}
			return true
		})
		if opErr == nil {
			opErr = err
		}
	})
	if opErr == nil {
		opErr = ctlErr
	}
	return sent, opErr
}
