package vm

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// nbdClient is the client side of the protocol as qemu speaks it, enough
// to drive the server: fixed newstyle, NBD_OPT_GO with a block-size
// request, simple replies.
type nbdClient struct {
	t    *testing.T
	c    net.Conn
	next uint64
}

// dialNBD serves d and connects to it; protocolError says the test makes
// the server end with an error.
func dialNBD(t *testing.T, d *Disk, protocolError bool) *nbdClient {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "nbd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ServeNBD(l, d) }()
	t.Cleanup(func() {
		l.Close()
		if err := <-served; (err != nil) != protocolError {
			t.Errorf("ServeNBD: %v (want an error: %v)", err, protocolError)
		}
	})
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &nbdClient{t: t, c: c}
}

func (n *nbdClient) read(v any) {
	n.t.Helper()
	if err := binary.Read(n.c, binary.BigEndian, v); err != nil {
		n.t.Fatalf("nbd client: %v", err)
	}
}

func (n *nbdClient) write(b []byte) {
	n.t.Helper()
	if _, err := n.c.Write(b); err != nil {
		n.t.Fatalf("nbd client: %v", err)
	}
}

func (n *nbdClient) option(opt uint32, data []byte) {
	n.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, nbdOptMagic)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	n.write(append(b, data...))
}

// reply reads one option reply and returns its type and data.
func (n *nbdClient) reply() (uint32, []byte) {
	n.t.Helper()
	var h struct {
		Magic        uint64
		Option, Type uint32
		Length       uint32
	}
	n.read(&h)
	if h.Magic != nbdRepMagic || h.Length > maxOption {
		n.t.Fatalf("option reply %+v", h)
	}
	data := make([]byte, h.Length)
	if _, err := io.ReadFull(n.c, data); err != nil {
		n.t.Fatal(err)
	}
	return h.Type, data
}

// handshake negotiates as qemu does and returns the export's size and
// transmission flags and the minimum block size announced.
func (n *nbdClient) handshake() (size uint64, flags uint16, minBlock uint32) {
	n.t.Helper()
	var hello struct {
		Magic, OptMagic uint64
		Flags           uint16
	}
	n.read(&hello)
	if hello.Magic != nbdMagic || hello.OptMagic != nbdOptMagic || hello.Flags&nbdFlagFixedNewstyle == 0 {
		n.t.Fatalf("hello %+v", hello)
	}
	n.write(binary.BigEndian.AppendUint32(nil, nbdFlagFixedNewstyle|nbdFlagNoZeroes))
	n.option(8, nil) // NBD_OPT_STRUCTURED_REPLY: qemu asks, the server declines
	if typ, _ := n.reply(); typ != nbdRepErrUnsup {
		n.t.Fatalf("structured replies: reply type %#x, want unsupported", typ)
	}
	goData := binary.BigEndian.AppendUint32(nil, 0) // the unnamed export
	goData = binary.BigEndian.AppendUint16(goData, 1)
	goData = binary.BigEndian.AppendUint16(goData, nbdInfoBlockSize)
	n.option(nbdOptGo, goData)
	for {
		typ, data := n.reply()
		if typ == nbdRepAck {
			return size, flags, minBlock
		}
		if typ != nbdRepInfo || len(data) < 2 {
			n.t.Fatalf("GO: reply type %#x %x", typ, data)
		}
		switch binary.BigEndian.Uint16(data) {
		case nbdInfoExport:
			size, flags = binary.BigEndian.Uint64(data[2:]), binary.BigEndian.Uint16(data[10:])
		case nbdInfoBlockSize:
			minBlock = binary.BigEndian.Uint32(data[2:])
		}
	}
}

// requestHeader is a request's 28 bytes.
func requestHeader(typ uint16, handle, off uint64, length uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, nbdRequestMagic)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, handle)
	b = binary.BigEndian.AppendUint64(b, off)
	return binary.BigEndian.AppendUint32(b, length)
}

// request sends one command and returns the reply's error and data.
func (n *nbdClient) request(typ uint16, off uint64, length uint32, payload []byte) (uint32, []byte) {
	n.t.Helper()
	n.next++
	n.write(append(requestHeader(typ, n.next, off, length), payload...))
	var r struct {
		Magic, Error uint32
		Handle       uint64
	}
	n.read(&r)
	if r.Magic != nbdReplyMagic || r.Handle != n.next {
		n.t.Fatalf("reply %+v to request %d", r, n.next)
	}
	var data []byte
	if typ == nbdCmdRead && r.Error == 0 {
		data = make([]byte, length)
		if _, err := io.ReadFull(n.c, data); err != nil {
			n.t.Fatal(err)
		}
	}
	return r.Error, data
}

// TestNBDServesTheDisk: after the handshake, reads return what was
// written, a flush makes it durable, out-of-range requests get EIO and
// the connection goes on; DISC ends it.
func TestNBDServesTheDisk(t *testing.T) {
	d, path := newDisk(t, 16)
	n := dialNBD(t, d, false)
	size, flags, minBlock := n.handshake()
	if size != 16*SectorSize || flags&nbdFlagSendFlush == 0 || minBlock != SectorSize {
		t.Fatalf("export: size %d, flags %#x, min block %d", size, flags, minBlock)
	}
	payload := fill(5, 2*SectorSize)
	if e, _ := n.request(nbdCmdWrite, SectorSize, uint32(len(payload)), payload); e != 0 {
		t.Fatalf("write: error %d", e)
	}
	if e, got := n.request(nbdCmdRead, SectorSize, uint32(len(payload)), nil); e != 0 || !bytes.Equal(got, payload) {
		t.Fatalf("read back: error %d, equal %v", e, bytes.Equal(got, payload))
	}
	if e, _ := n.request(nbdCmdRead, 16*SectorSize, SectorSize, nil); e != nbdEIO {
		t.Errorf("read beyond the end: error %d, want EIO", e)
	}
	if e, _ := n.request(nbdCmdTrim, 0, SectorSize, nil); e != 0 {
		t.Errorf("trim: error %d", e)
	}
	if e, _ := n.request(nbdCmdFlush, 0, 0, nil); e != 0 {
		t.Fatalf("flush: error %d", e)
	}
	if d.Stats().Flushes != 1 {
		t.Errorf("stats %+v: want the flush counted", d.Stats())
	}
	n.write(requestHeader(nbdCmdDisc, 0, 0, 0))
	if _, err := n.c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after DISC: read %v, want EOF", err)
	}
	if img := readFile(t, path); !bytes.Equal(img[SectorSize:3*SectorSize], payload) {
		t.Errorf("the flushed write is not on the medium")
	}
}

// TestNBDRefusesHugeRequest: a request longer than the bound ends the
// connection instead of allocating what it asks.
func TestNBDRefusesHugeRequest(t *testing.T) {
	d, _ := newDisk(t, 16)
	n := dialNBD(t, d, true)
	n.handshake()
	n.write(requestHeader(nbdCmdWrite, 1, 0, 1<<31))
	if _, err := n.c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after a 2 GiB write request: read %v, want the connection closed", err)
	}
}

// TestNBDClientKilledMidRequest: qemu killed in the middle of a write's
// payload is a client gone, not a server error.
func TestNBDClientKilledMidRequest(t *testing.T) {
	d, _ := newDisk(t, 16)
	n := dialNBD(t, d, false)
	n.handshake()
	n.write(append(requestHeader(nbdCmdWrite, 1, 0, 8*SectorSize), fill(3, 100)...))
	n.c.Close()
	// dialNBD's clean-up fails the test if ServeNBD ended with an error.
}
