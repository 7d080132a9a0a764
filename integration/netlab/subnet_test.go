package netlab

import (
	"net/netip"
	"os"
	"slices"
	"testing"
)

func TestParseRoutesAndFreeSubnets(t *testing.T) {
	out, err := os.ReadFile("testdata/routes.json")
	if err != nil {
		t.Fatal(err)
	}
	used, routes, err := parseRoutes(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 7 || len(used) != 6 {
		t.Fatalf("got %d routes, %d prefixes; want 7 and 6 (default left out)", len(routes), len(used))
	}
	free := freeSubnets(netip.MustParsePrefix("10.213.0.0/16"), used, 5)
	if len(free) != 256-1-1-64 {
		t.Fatalf("got %d free subnets, want %d", len(free), 256-1-1-64)
	}
	if free[0] != netip.MustParsePrefix("10.213.5.0/24") {
		t.Errorf("first candidate %v, want 10.213.5.0/24 (the start index)", free[0])
	}
	for _, bad := range []string{"10.213.7.0/24", "10.213.9.0/24", "10.213.64.0/24", "10.213.127.0/24"} {
		if slices.Contains(free, netip.MustParsePrefix(bad)) {
			t.Errorf("%s is taken by a route but was offered", bad)
		}
	}
	if !slices.Contains(free, netip.MustParsePrefix("10.213.128.0/24")) {
		t.Errorf("10.213.128.0/24 is free but was not offered")
	}
}

func TestFreeSubnetsEdges(t *testing.T) {
	tests := []struct {
		name  string
		base  string
		used  []string
		start int
		want  int
		first string
	}{
		{name: "single /24", base: "10.1.2.0/24", want: 1, first: "10.1.2.0/24"},
		{name: "wraps start", base: "10.1.0.0/23", start: 3, want: 2, first: "10.1.1.0/24"},
		{name: "negative start", base: "10.1.0.0/23", start: -1, want: 2, first: "10.1.1.0/24"},
		{name: "all used", base: "10.1.0.0/22", used: []string{"10.0.0.0/8"}, want: 0},
		{name: "narrower than /24", base: "10.1.2.0/25", want: 0},
		{name: "ipv6 base", base: "fd00::/64", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var used []netip.Prefix
			for _, u := range tt.used {
				used = append(used, netip.MustParsePrefix(u))
			}
			got := freeSubnets(netip.MustParsePrefix(tt.base), used, tt.start)
			if len(got) != tt.want {
				t.Fatalf("got %v, want %d subnets", got, tt.want)
			}
			if tt.first != "" && got[0].String() != tt.first {
				t.Errorf("first = %v, want %s", got[0], tt.first)
			}
		})
	}
}

func TestParseRoutesBad(t *testing.T) {
	for _, in := range []string{`not json`, `[{"dst":"10.0.0.0/99"}]`, `[{"dst":"banana"}]`} {
		if _, _, err := parseRoutes([]byte(in)); err == nil {
			t.Errorf("parseRoutes(%q) succeeded, want error", in)
		}
	}
}
