package integration

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
)

// TestContainerdPerHost runs a containerd on each of two hosts and checks
// that each answers on its own socket with its own root.
func TestContainerdPerHost(t *testing.T) {
	bin := testenv.Bin(t, "containerd")
	ctr := testenv.Bin(t, "ctr")
	lab := netlabtest.New(t, netlab.Options{Hosts: 2})
	ctx := t.Context()
	var addrs []string
	for _, h := range lab.Hosts() {
		c, err := h.StartContainerd(ctx, bin)
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, c.Address)
		out, err := h.Command(ctx, ctr, "--address", c.Address, "version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Server:") {
			t.Fatalf("ctr version on %s: %v\n%s", h.Name, err, out)
		}
		out, err = h.Command(ctx, ctr, "--address", c.Address, "plugins", "ls").CombinedOutput()
		if err != nil {
			t.Fatalf("ctr plugins ls on %s: %v\n%s", h.Name, err, out)
		}
		if !pluginOK(string(out), "overlayfs") {
			t.Errorf("containerd on %s has no working overlayfs snapshotter:\n%s", h.Name, out)
		}
	}
	if addrs[0] == addrs[1] {
		t.Errorf("both hosts' containerd share the socket %s", addrs[0])
	}
}

// pluginOK finds a plugin's line in `ctr plugins ls` and checks its status.
func pluginOK(out, id string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[1] == id {
			return f[len(f)-1] == "ok"
		}
	}
	return false
}
