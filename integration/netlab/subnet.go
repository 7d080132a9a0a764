package netlab

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
)

// DefaultSubnetBase is the range the harness carves its /24 subnets from.
var defaultSubnetBase = netip.MustParsePrefix("10.213.0.0/16")

// routeProto marks the harness's blackhole routes (`ip route ... proto 213`)
// so a later run can find the ones a crashed run left behind.
const routeProto = "213"

// ipRoute is one entry of `ip -j route show`.
type ipRoute struct {
	Type     string `json:"type"`
	Dst      string `json:"dst"`
	Protocol string `json:"protocol"`
	Table    string `json:"table"`
}

// parseRoutes decodes `ip -4 -j route show table all` output into the
// prefixes the routes cover. The default route is left out: it covers
// everything and is exactly what the blackhole routes override.
func parseRoutes(out []byte) ([]netip.Prefix, []ipRoute, error) {
	var routes []ipRoute
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, nil, fmt.Errorf("parse ip route output: %w", err)
	}
	var prefixes []netip.Prefix
	for _, r := range routes {
		if r.Dst == "default" || r.Dst == "" {
			continue
		}
		p, err := parsePrefix(r.Dst)
		if err != nil {
			return nil, nil, fmt.Errorf("parse ip route output: %w", err)
		}
		prefixes = append(prefixes, p)
	}
	return prefixes, routes, nil
}

// parsePrefix accepts "10.0.0.0/8" or a bare address (a host route).
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return p.Masked(), nil
}

// freeSubnets lists the /24 subnets of base that overlap none of used,
// starting at the one with index start so concurrent runs spread out.
func freeSubnets(base netip.Prefix, used []netip.Prefix, start int) []netip.Prefix {
	base = base.Masked()
	if !base.Addr().Is4() || base.Bits() > 24 {
		return nil
	}
	n := 1 << (24 - base.Bits())
	b := base.Addr().As4()
	var free []netip.Prefix
	for i := range n {
		idx := (start + i) % n
		if idx < 0 {
			idx += n
		}
		a := b
		v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8
		v += uint32(idx) << 8
		cand := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0}), 24)
		if overlapsAny(cand, used) {
			continue
		}
		free = append(free, cand)
	}
	return free
}

func overlapsAny(p netip.Prefix, set []netip.Prefix) bool {
	for _, q := range set {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

// hostAddr returns the address with the last octet set to n.
func hostAddr(subnet netip.Prefix, n byte) netip.Addr {
	a := subnet.Addr().As4()
	a[3] = n
	return netip.AddrFrom4(a)
}
