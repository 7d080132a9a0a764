package testenv

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// RepoRoot counts directories up from this file: moving the package must
// move the count with it, or every tool in bin/ goes missing and the tests
// that need one skip.
func TestRepoRootHoldsGoMod(t *testing.T) {
	root := RepoRoot()
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("RepoRoot() = %s, which holds no go.mod: %v", root, err)
	}
}

// FreeAddr's ports lie outside the kernel's ephemeral range, where an
// outgoing connection could take one before the server binds it, and are
// free over TCP and UDP.
func TestFreeAddrAvoidsEphemeralPorts(t *testing.T) {
	lo, hi, err := ephemeralPorts()
	if err != nil {
		Missing(t, "%v", err)
	}
	for range 50 {
		addr := FreeAddr(t)
		_, ps, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.Atoi(ps)
		if err != nil {
			t.Fatal(err)
		}
		if p >= lo && p <= hi {
			t.Fatalf("FreeAddr = %s: port in the ephemeral range %d-%d", addr, lo, hi)
		}
		if !bindable(addr) {
			t.Fatalf("FreeAddr = %s: not free over TCP and UDP", addr)
		}
	}
}

// Picks made one after another, before any is bound, never repeat: a
// caller that needs two ports (a VM's two forwards) binds them only later.
func TestPickFreeAddrNeverRepeats(t *testing.T) {
	if lo, _, err := ephemeralPorts(); err != nil || lo-freePortMin < 1000 {
		Missing(t, "no room below the ephemeral range (%v): the kernel picks, and may repeat", err)
	}
	seen := make(map[string]bool)
	for range 2000 {
		addr, err := PickFreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("PickFreeAddr handed out %s twice in %d picks", addr, len(seen)+1)
		}
		seen[addr] = true
	}
}
