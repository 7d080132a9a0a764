package memnet

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestStreamsAndPackets(t *testing.T) {
	var n Network
	a, b := n.NewTransport("a"), n.NewTransport("b")
	go func() {
		c := <-b.StreamCh()
		_, _ = c.Write([]byte("hi"))
		_ = c.Close()
	}()
	c, err := a.DialTimeout(b.Addr(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(c); string(got) != "hi" {
		t.Fatalf("read %q", got)
	}
	if _, err := a.WriteToAddress([]byte("p"), memberlist.Address{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if p := <-b.PacketCh(); string(p.Buf) != "p" || p.From.String() != a.Addr() {
		t.Fatalf("packet %q from %s", p.Buf, p.From)
	}
	if _, err := a.WriteTo([]byte("x"), "127.0.0.1:1"); err == nil {
		t.Fatal("a packet to an unknown address was accepted")
	}
}

// A node that is gone refuses dials at once and drops packets; a node that
// does not accept makes a dial wait its timeout, never longer.
func TestGoneAndSlowPeersNeverBlock(t *testing.T) {
	var n Network
	a, b, slow := n.NewTransport("a"), n.NewTransport("b"), n.NewTransport("slow")
	_ = b.Shutdown()
	if _, err := a.DialTimeout(b.Addr(), 0); !errors.Is(err, errRefused) {
		t.Fatalf("dial to a node that is gone: %v", err)
	}
	for range packetBuffer + 1 {
		if _, err := a.WriteTo([]byte("p"), b.Addr()); err != nil {
			t.Fatal(err)
		}
		if _, err := a.WriteTo([]byte("p"), slow.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.DialTimeout(slow.Addr(), 10*time.Millisecond); err == nil {
		t.Fatal("a dial nobody accepted succeeded")
	}
	// A restart is a new incarnation at the same address.
	b2 := n.NewTransport("b")
	if b2.Addr() != b.Addr() {
		t.Fatalf("restart moved b from %s to %s", b.Addr(), b2.Addr())
	}
	if _, err := a.WriteTo([]byte("again"), b2.Addr()); err != nil {
		t.Fatal(err)
	}
	if p := <-b2.PacketCh(); string(p.Buf) != "again" {
		t.Fatalf("packet %q", p.Buf)
	}
}

// Streams behave like TCP on loopback: a write does not wait for the
// reader, a read waits its deadline at most, and a node that shuts down
// closes its end (the peer reads what was sent, then EOF).
func TestStreamsBufferAndEndWithTheirNode(t *testing.T) {
	var n Network
	a, b := n.NewTransport("a"), n.NewTransport("b")
	accepted := make(chan net.Conn, 1)
	go func() { accepted <- <-b.StreamCh() }()
	c, err := a.DialTimeout(b.Addr(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(make([]byte, 1<<20)); err != nil {
		t.Fatalf("a write nobody reads yet: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	remote := <-accepted
	if _, err := remote.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	_ = b.Shutdown()
	_ = c.SetReadDeadline(time.Time{})
	if got, err := io.ReadAll(c); string(got) != "bye" || err != nil {
		t.Fatalf("after the peer's node shut down: read %q, %v", got, err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("a write to a closed stream succeeded")
	}
}
