package api

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Addr is a parsed API address.
type Addr struct {
	// Network is "unix" or "tcp".
	Network string
	// Address is a socket path or host:port.
	Address string
}

func (a Addr) String() string {
	if a.Network == "unix" {
		return "unix://" + a.Address
	}
	return a.Address
}

// Loopback reports whether a TCP address only accepts local connections.
func (a Addr) Loopback() bool {
	if a.Network == "unix" {
		return true
	}
	host, _, err := net.SplitHostPort(a.Address)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// ParseAddr parses unix:///path/to.sock, tcp://host:port or host:port.
func ParseAddr(s string) (Addr, error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		p := strings.TrimPrefix(s, "unix://")
		if !strings.HasPrefix(p, "/") {
			return Addr{}, fmt.Errorf("api address %q: want unix:///absolute/path.sock", s)
		}
		if len(p) > 107 {
			return Addr{}, fmt.Errorf("api address %q: socket path longer than 107 bytes", s)
		}
		return Addr{Network: "unix", Address: p}, nil
	case strings.Contains(s, "://") && !strings.HasPrefix(s, "tcp://"):
		return Addr{}, fmt.Errorf("api address %q: want unix:///path.sock or host:port", s)
	}
	hostport := strings.TrimPrefix(s, "tcp://")
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || port == "" {
		return Addr{}, fmt.Errorf("api address %q: want unix:///path.sock or host:port", s)
	}
	if host == "" {
		return Addr{}, fmt.Errorf("api address %q: give a host (0.0.0.0 for every interface)", s)
	}
	return Addr{Network: "tcp", Address: hostport}, nil
}
