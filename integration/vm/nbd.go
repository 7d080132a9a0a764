package vm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// The NBD protocol, as far as qemu's client needs it: the fixed newstyle
// handshake (NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_EXPORT_NAME, NBD_OPT_ABORT;
// every other option is refused as unsupported, which qemu accepts) and
// simple replies to READ, WRITE, FLUSH, TRIM and DISC. See
// https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md.
const (
	nbdMagic        = 0x4e42444d41474943 // "NBDMAGIC"
	nbdOptMagic     = 0x49484156454f5054 // "IHAVEOPT"
	nbdRepMagic     = 0x0003e889045565a9
	nbdRequestMagic = 0x25609513
	nbdReplyMagic   = 0x67446698

	nbdFlagFixedNewstyle = 1 << 0
	nbdFlagNoZeroes      = 1 << 1

	nbdOptExportName = 1
	nbdOptAbort      = 2
	nbdOptInfo       = 6
	nbdOptGo         = 7

	nbdRepAck        = 1
	nbdRepInfo       = 3
	nbdRepErrUnsup   = 1<<31 + 1
	nbdRepErrInvalid = 1<<31 + 3

	nbdInfoExport    = 0
	nbdInfoBlockSize = 3

	nbdFlagHasFlags  = 1 << 0
	nbdFlagSendFlush = 1 << 2
	nbdFlagSendTrim  = 1 << 5

	nbdCmdRead  = 0
	nbdCmdWrite = 1
	nbdCmdDisc  = 2
	nbdCmdFlush = 3
	nbdCmdTrim  = 4

	nbdEIO = 5

	// maxRequest bounds one READ or WRITE, qemu's own limit (32 MiB); a
	// larger one ends the connection rather than the test's memory.
	maxRequest = 32 << 20
	// maxOption bounds one handshake option's data.
	maxOption = 4096
)

// errDisconnect ends a connection the client closed on purpose.
var errDisconnect = errors.New("nbd: client disconnected")

// ServeNBD serves d to the clients of l, one at a time, until l is closed.
// A connection ends at the client's DISC, at a protocol error or when the
// disk's power is cut (the request finds no disk, so it gets no reply).
func ServeNBD(l net.Listener, d *Disk) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("nbd: %w", err)
		}
		err = serveConn(c, d)
		c.Close()
		if err != nil && !clientGone(err) {
			return err
		}
	}
}

// clientGone tells whether a connection ended because the client left (a
// DISC, or qemu killed, even in the middle of a request) or the disk lost
// its power, rather than by a protocol error.
func clientGone(err error) bool {
	for _, e := range []error{errDisconnect, ErrPowerLost, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func serveConn(c net.Conn, d *Disk) error {
	if err := handshake(c, d.Size()); err != nil {
		return err
	}
	return transmit(c, d)
}

// handshake runs the fixed newstyle negotiation until the client picks the
// (only, unnamed) export.
func handshake(c net.Conn, size int64) error {
	hello := binary.BigEndian.AppendUint64(nil, nbdMagic)
	hello = binary.BigEndian.AppendUint64(hello, nbdOptMagic)
	hello = binary.BigEndian.AppendUint16(hello, nbdFlagFixedNewstyle|nbdFlagNoZeroes)
	if _, err := c.Write(hello); err != nil {
		return fmt.Errorf("nbd: handshake: %w", err)
	}
	var clientFlags uint32
	if err := binary.Read(c, binary.BigEndian, &clientFlags); err != nil {
		return fmt.Errorf("nbd: handshake: %w", err)
	}
	if clientFlags&nbdFlagFixedNewstyle == 0 {
		return fmt.Errorf("nbd: client flags %#x: want fixed newstyle", clientFlags)
	}
	noZeroes := clientFlags&nbdFlagNoZeroes != 0
	const txFlags = nbdFlagHasFlags | nbdFlagSendFlush | nbdFlagSendTrim
	for {
		var hdr struct {
			Magic  uint64
			Option uint32
			Length uint32
		}
		if err := binary.Read(c, binary.BigEndian, &hdr); err != nil {
			return fmt.Errorf("nbd: option: %w", err)
		}
		if hdr.Magic != nbdOptMagic || hdr.Length > maxOption {
			return fmt.Errorf("nbd: option %d: magic %#x, %d bytes of data", hdr.Option, hdr.Magic, hdr.Length)
		}
		data := make([]byte, hdr.Length)
		if _, err := io.ReadFull(c, data); err != nil {
			return fmt.Errorf("nbd: option %d: %w", hdr.Option, err)
		}
		switch hdr.Option {
		case nbdOptExportName:
			reply := binary.BigEndian.AppendUint64(nil, uint64(size))
			reply = binary.BigEndian.AppendUint16(reply, txFlags)
			if !noZeroes {
				reply = append(reply, make([]byte, 124)...)
			}
			_, err := c.Write(reply)
			return err
		case nbdOptAbort:
			_ = optReply(c, hdr.Option, nbdRepAck, nil)
			return errDisconnect
		case nbdOptInfo, nbdOptGo:
			blockSize, err := wantsBlockSize(data)
			if err != nil {
				if err := optReply(c, hdr.Option, nbdRepErrInvalid, nil); err != nil {
					return err
				}
				continue
			}
			info := binary.BigEndian.AppendUint16(nil, nbdInfoExport)
			info = binary.BigEndian.AppendUint64(info, uint64(size))
			info = binary.BigEndian.AppendUint16(info, txFlags)
			if err := optReply(c, hdr.Option, nbdRepInfo, info); err != nil {
				return err
			}
			if blockSize {
				// Whole sectors only: the client aligns what the guest asks.
				bs := binary.BigEndian.AppendUint16(nil, nbdInfoBlockSize)
				bs = binary.BigEndian.AppendUint32(bs, SectorSize)
				bs = binary.BigEndian.AppendUint32(bs, 4096)
				bs = binary.BigEndian.AppendUint32(bs, maxRequest)
				if err := optReply(c, hdr.Option, nbdRepInfo, bs); err != nil {
					return err
				}
			}
			if err := optReply(c, hdr.Option, nbdRepAck, nil); err != nil {
				return err
			}
			if hdr.Option == nbdOptGo {
				return nil
			}
		default:
			if err := optReply(c, hdr.Option, nbdRepErrUnsup, nil); err != nil {
				return err
			}
		}
	}
}

// wantsBlockSize parses NBD_OPT_INFO/GO data (name length, name, info
// requests) and tells whether the client asked for the block sizes.
func wantsBlockSize(data []byte) (bool, error) {
	if len(data) < 6 {
		return false, fmt.Errorf("nbd: info request of %d bytes", len(data))
	}
	nameLen := int(binary.BigEndian.Uint32(data))
	if nameLen > len(data)-6 {
		return false, fmt.Errorf("nbd: info request: name of %d bytes in %d", nameLen, len(data))
	}
	rest := data[4+nameLen:]
	n := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*n {
		return false, fmt.Errorf("nbd: info request: %d requests in %d bytes", n, len(rest))
	}
	for i := range n {
		if binary.BigEndian.Uint16(rest[2*i:]) == nbdInfoBlockSize {
			return true, nil
		}
	}
	return false, nil
}

func optReply(c net.Conn, option, typ uint32, data []byte) error {
	b := binary.BigEndian.AppendUint64(nil, nbdRepMagic)
	b = binary.BigEndian.AppendUint32(b, option)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	if _, err := c.Write(append(b, data...)); err != nil {
		return fmt.Errorf("nbd: option reply: %w", err)
	}
	return nil
}

// transmit answers requests, in order, until DISC or an error.
func transmit(c net.Conn, d *Disk) error {
	var buf []byte
	for {
		var req struct {
			Magic  uint32
			Flags  uint16
			Type   uint16
			Handle uint64
			Offset uint64
			Length uint32
		}
		if err := binary.Read(c, binary.BigEndian, &req); err != nil {
			return fmt.Errorf("nbd: request: %w", err)
		}
		if req.Magic != nbdRequestMagic {
			return fmt.Errorf("nbd: request magic %#x", req.Magic)
		}
		if (req.Type == nbdCmdRead || req.Type == nbdCmdWrite) && req.Length > maxRequest {
			return fmt.Errorf("nbd: request of %d bytes (at most %d)", req.Length, maxRequest)
		}
		off := int64(req.Offset)
		if req.Offset > 1<<62 {
			off = -1 // out of range for every disk; the disk says so
		}
		var err error
		var data []byte
		switch req.Type {
		case nbdCmdRead:
			buf = grow(buf, int(req.Length))
			data = buf[:req.Length]
			err = d.ReadAt(data, off)
		case nbdCmdWrite:
			buf = grow(buf, int(req.Length))
			if _, err := io.ReadFull(c, buf[:req.Length]); err != nil {
				return fmt.Errorf("nbd: write payload: %w", err)
			}
			err = d.WriteAt(buf[:req.Length], off)
		case nbdCmdFlush:
			err = d.Flush()
		case nbdCmdTrim:
			// A trim lets the disk forget data; keeping it is allowed, and
			// keeps the power-loss model to writes alone.
			err = d.Trim(off, int64(req.Length))
		case nbdCmdDisc:
			return errDisconnect
		default:
			err = fmt.Errorf("nbd: unknown command %d", req.Type)
		}
		if errors.Is(err, ErrPowerLost) {
			return err // no reply: the disk is gone
		}
		code := uint32(0)
		if err != nil {
			code, data = nbdEIO, nil
		}
		reply := binary.BigEndian.AppendUint32(make([]byte, 0, 16), nbdReplyMagic)
		reply = binary.BigEndian.AppendUint32(reply, code)
		reply = binary.BigEndian.AppendUint64(reply, req.Handle)
		if _, err := c.Write(reply); err != nil {
			return fmt.Errorf("nbd: reply: %w", err)
		}
		if data != nil {
			if _, err := c.Write(data); err != nil {
				return fmt.Errorf("nbd: reply: %w", err)
			}
		}
	}
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b
}
