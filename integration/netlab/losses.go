package netlab

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// TCPCounters are a host's TCP segment counts since its namespace was
// made (its /proc/net/snmp).
type TCPCounters struct {
	OutSegs     uint64 // segments sent, retransmissions not included
	RetransSegs uint64 // segments sent again
}

// TCPCounters reads the host's TCP counters from a thread inside its
// namespace.
func (h *Host) TCPCounters() (TCPCounters, error) {
	text, err := h.readNetFile("snmp")
	if err != nil {
		return TCPCounters{}, fmt.Errorf("tcp counters of %s: %w", h.Name, err)
	}
	return parseSNMP(string(text))
}

// parseSNMP reads the Tcp counters from /proc/net/snmp text: a line of
// names and a line of values, both starting with "Tcp:".
func parseSNMP(text string) (TCPCounters, error) {
	var rows [][]string
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "Tcp:"); ok {
			rows = append(rows, strings.Fields(rest))
		}
	}
	if len(rows) != 2 || len(rows[0]) != len(rows[1]) {
		return TCPCounters{}, fmt.Errorf("parse /proc/net/snmp: want a Tcp line of names and one of values, got %d lines", len(rows))
	}
	var c TCPCounters
	var out, retrans bool
	for i, name := range rows[0] {
		var dst *uint64
		switch {
		case name == "OutSegs" && !out:
			dst, out = &c.OutSegs, true
		case name == "RetransSegs" && !retrans:
			dst, retrans = &c.RetransSegs, true
		default:
			continue
		}
		v, err := strconv.ParseUint(rows[1][i], 10, 64)
		if err != nil {
			return TCPCounters{}, fmt.Errorf("parse /proc/net/snmp: Tcp %s: %w", name, err)
		}
		*dst = v
	}
	if !out || !retrans {
		return TCPCounters{}, fmt.Errorf("parse /proc/net/snmp: Tcp OutSegs or RetransSegs missing")
	}
	return c, nil
}

// LinkDrops counts the packets the link's shapers dropped, each way. A
// packet the kernel handed over whole for segmentation offload counts once,
// however many segments it held.
type LinkDrops struct {
	Up   uint64 // sent by the host, dropped at its end
	Down uint64 // sent to the host, dropped at the bridge's end
}

// Drops reads the qdisc drop counters of both ends of the link.
func (k *Link) Drops(ctx context.Context) (LinkDrops, error) {
	var d LinkDrops
	for _, e := range []struct {
		ns  Netns
		dev string
		dst *uint64
	}{{k.host.NS, "eth0", &d.Up}, {k.bridge, k.port, &d.Down}} {
		out, err := tc(ctx, "-n", string(e.ns), "-s", "-j", "qdisc", "show", "dev", e.dev)
		if err != nil {
			return LinkDrops{}, fmt.Errorf("drops of %s: %w", k.host.Name, err)
		}
		n, err := parseQdiscDrops([]byte(out))
		if err != nil {
			return LinkDrops{}, fmt.Errorf("drops of %s: %w", k.host.Name, err)
		}
		*e.dst = n
	}
	return d, nil
}

// parseQdiscDrops sums the drops of every qdisc in `tc -s -j qdisc show`
// output.
func parseQdiscDrops(out []byte) (uint64, error) {
	var qdiscs []struct {
		Kind  string  `json:"kind"`
		Drops *uint64 `json:"drops"`
	}
	if err := json.Unmarshal(out, &qdiscs); err != nil {
		return 0, fmt.Errorf("parse tc qdisc stats: %w", err)
	}
	var sum uint64
	for _, q := range qdiscs {
		if q.Drops == nil {
			return 0, fmt.Errorf("parse tc qdisc stats: %s qdisc without drops (tc run without -s?)", q.Kind)
		}
		sum += *q.Drops
	}
	return sum, nil
}
