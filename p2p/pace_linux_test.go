//go:build linux

package p2p

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

func pacingOf(t *testing.T, c *net.TCPConn) uint64 {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v uint64
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		v, gerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

func TestSetPacing(t *testing.T) {
	c, _ := tcpPair(t)
	tc := c.(*net.TCPConn)

	if err := setPacing(c, 3<<20); err != nil {
		t.Fatal(err)
	}
	if got := pacingOf(t, tc); got != 3<<20 {
		t.Errorf("pacing %d, want %d", got, 3<<20)
	}
	// Through TLS: the socket under it is paced.
	if err := setPacing(tls.Client(c, &tls.Config{}), 5<<20); err != nil {
		t.Fatal(err)
	}
	if got := pacingOf(t, tc); got != 5<<20 {
		t.Errorf("pacing through TLS %d, want %d", got, 5<<20)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if err := setPacing(a, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("pacing a pipe: %v, want ErrUnsupported", err)
	}
}

// A limited node paces each upload at its share of the limit among the
// uploads in progress.
func TestUploadPacedAtItsShare(t *testing.T) {
	const limit = 8 << 20
	n, err := NewNode(Config{NodeID: "n", ClusterKey: testKey, UploadLimit: limit, MaxUploads: 4})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := tcpPair(t)
	sc := &serverConn{c: c, n: n, peer: "p"}
	for _, tt := range []struct {
		uploads int
		want    uint64
	}{{1, limit}, {2, limit / 2}, {4, limit / 4}} {
		for len(n.uploads) < tt.uploads {
			n.uploads <- struct{}{}
		}
		sc.pace()
		if got := pacingOf(t, c.(*net.TCPConn)); got != tt.want {
			t.Errorf("%d uploads: paced at %d, want %d", tt.uploads, got, tt.want)
		}
	}
	// The same share again is not set again: no system call per chunk.
	if err := setPacing(c, 1); err != nil {
		t.Fatal(err)
	}
	sc.pace()
	if got := pacingOf(t, c.(*net.TCPConn)); got != 1 {
		t.Errorf("an unchanged share was set again (pacing %d)", got)
	}
}
