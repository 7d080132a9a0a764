package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
)

// TestTopologyIsolation builds three hosts, an S3 host and a registry host
// and checks that they reach each other, reach nothing else, and leave
// nothing behind.
func TestTopologyIsolation(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 3, Link: 200 * netlab.Mbit, S3: true, Registry: true})
	ctx := t.Context()

	// The root namespace blackholes the lab's subnet.
	if out := mustRun(t, "ip", "route", "show", "exact", lab.Subnet().String(), "table", "main"); !strings.HasPrefix(out, "blackhole ") {
		t.Fatalf("root namespace route for %s = %q, want a blackhole route", lab.Subnet(), out)
	}
	if err := exec.Command("ip", "route", "get", lab.Hosts()[0].IP.String()).Run(); err == nil {
		t.Errorf("root namespace has a usable route to lab host %s", lab.Hosts()[0].IP)
	}

	for _, h := range append(slices.Clone(lab.Hosts()), lab.S3().Host, lab.Registry().Host) {
		// Only the lab's /24 is routable from a host: nothing can leave.
		for _, dst := range routeDsts(t, h.NS.Name()) {
			if !lab.Subnet().Overlaps(dst) && !loopback.Overlaps(dst) || dst.Bits() < lab.Subnet().Bits() && !loopback.Overlaps(dst) {
				t.Errorf("host %s has a route to %s, outside the lab", h.Name, dst)
			}
		}
		if err := exec.Command("ip", "-n", h.NS.Name(), "route", "get", "192.0.2.1").Run(); err == nil {
			t.Errorf("host %s has a route to an address outside the lab", h.Name)
		}
	}

	// h0 reaches h1 and h2 over TCP.
	for _, dst := range lab.Hosts()[1:] {
		if err := echoRoundTrip(ctx, lab.Hosts()[0], dst); err != nil {
			t.Errorf("h0 -> %s: %v", dst.Name, err)
		}
	}
	// h0 reaches the S3 server and the registry over HTTP.
	h0 := lab.Hosts()[0]
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: h0.NS.DialContext}, Timeout: 10 * time.Second}
	for _, url := range []string{lab.S3().Endpoint + "/", "http://" + lab.Registry().Addr + "/v2/"} {
		resp, err := client.Get(url)
		if err != nil {
			t.Errorf("h0 GET %s: %v", url, err)
			continue
		}
		_ = resp.Body.Close()
		t.Logf("h0 GET %s: %s", url, resp.Status)
	}

	// Close removes the namespaces, the route and the run's state.
	names := lab.Namespaces()
	if len(names) != 6 {
		t.Errorf("lab has namespaces %v, want bridge + 3 hosts + s3 + registry", names)
	}
	if err := lab.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s left after Close (stat: %v)", n, err)
		}
	}
	if out := mustRun(t, "ip", "route", "show", "exact", lab.Subnet().String(), "table", "main"); out != "" {
		t.Errorf("route %q left after Close", out)
	}
	if out := mustRun(t, "ip", "-br", "link"); strings.Contains(out, lab.RunID()) || strings.Contains(out, "p-h0") {
		t.Errorf("links left in the root namespace after Close:\n%s", out)
	}
	if _, err := os.Stat(lab.RunDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir %s left after Close", lab.RunDir())
	}
}

// echoRoundTrip sends a line from src to a listener on dst and reads it
// back, with both sockets created inside their hosts.
func echoRoundTrip(ctx context.Context, src, dst *netlab.Host) error {
	ln, err := dst.NS.Listen("tcp", dst.Addr(0))
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := src.NS.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	msg := "hello from " + src.Name + "\n"
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg {
		return fmt.Errorf("echo = %q, want %q", got, msg)
	}
	if la := c.LocalAddr().(*net.TCPAddr).IP.String(); la != src.IP.String() {
		return fmt.Errorf("connection came from %s, want %s", la, src.IP)
	}
	return nil
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

var loopback = netip.MustParsePrefix("127.0.0.0/8")

// routeDsts lists the IPv4 route destinations of every table in namespace
// ns; "default" is reported as 0.0.0.0/0.
func routeDsts(t *testing.T, ns string) []netip.Prefix {
	t.Helper()
	var routes []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ip", "-n", ns, "-4", "-j", "route", "show", "table", "all")), &routes); err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for _, r := range routes {
		switch {
		case r.Dst == "default":
			out = append(out, netip.MustParsePrefix("0.0.0.0/0"))
		case strings.Contains(r.Dst, "/"):
			out = append(out, netip.MustParsePrefix(r.Dst))
		default:
			a := netip.MustParseAddr(r.Dst)
			out = append(out, netip.PrefixFrom(a, 32))
		}
	}
	return out
}
