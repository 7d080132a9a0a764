package gossip

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

func TestFingerprint(t *testing.T) {
	k1, _ := GenerateKey()
	k2, _ := GenerateKey()
	if Fingerprint(k1) == Fingerprint(k2) || Fingerprint(k1) != Fingerprint(slices.Clone(k1)) {
		t.Fatal("fingerprints do not tell keys apart")
	}
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{Fingerprint(k1), true},
		{"sha256:0011223344556677", true},
		{"sha256:001122334455667", false},
		{"sha256:00112233445566zz", false},
		{"md5:0011223344556677", false},
		{EncodeKey(k1), false},
	} {
		if got := ValidFingerprint(tc.s); got != tc.ok {
			t.Errorf("ValidFingerprint(%q) = %v", tc.s, got)
		}
	}
}

func TestParseKeyOp(t *testing.T) {
	for _, s := range []string{"list", "install", "use", "remove"} {
		if op, err := ParseKeyOp(s); err != nil || string(op) != s {
			t.Errorf("ParseKeyOp(%q) = %q, %v", s, op, err)
		}
	}
	for _, s := range []string{"", "LIST", "delete"} {
		if _, err := ParseKeyOp(s); err == nil {
			t.Errorf("ParseKeyOp(%q) accepted", s)
		}
	}
}

func fingerprintsOK(t *testing.T, step string, res []KeyResult, want []string, members int) {
	t.Helper()
	if len(res) != members {
		t.Fatalf("%s: %d answers, want %d: %+v", step, len(res), members, res)
	}
	for _, r := range res {
		if r.Err != "" || !slices.Equal(r.Keys, want) {
			t.Fatalf("%s: %s answered err=%q keys=%v, want keys %v", step, r.Node, r.Err, r.Keys, want)
		}
	}
}

// TestFleetKeyRotation rotates the cluster key fleet-wide from one member:
// install, use, remove. Gossip keeps working throughout, the key file is
// rewritten, and a node that only has the old key is then out.
func TestFleetKeyRotation(t *testing.T) {
	names := []string{"a", "b", "c", "d", "stale"}
	c := newMockCluster(t, names...)
	keyFile := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(keyFile, []byte(EncodeKey(c.key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nodes := startCluster(t, c, names[:4], func(name string, cfg *Config) {
		if name == "a" {
			cfg.KeyFile = keyFile
		}
	})
	// Every member answers at once unless the machine is starved: a long
	// deadline costs nothing when all is well.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := nodes[0]
	oldFP := Fingerprint(c.key)
	k2, _ := GenerateKey()
	newFP := Fingerprint(k2)

	res, err := a.FleetKeys(ctx, KeyRequest{Op: KeyList})
	if err != nil {
		t.Fatal(err)
	}
	fingerprintsOK(t, "list", res, []string{oldFP}, 4)

	res, err = a.FleetKeys(ctx, KeyRequest{Op: KeyInstall, Key: k2})
	if err != nil {
		t.Fatal(err)
	}
	fingerprintsOK(t, "install", res, []string{oldFP, newFP}, 4)

	if _, err := a.FleetKeys(ctx, KeyRequest{Op: KeyRemove, Key: c.key}); !errors.Is(err, ErrPrimaryKey) {
		t.Fatalf("removing the key in use: err %v, want ErrPrimaryKey", err)
	}

	res, err = a.FleetKeys(ctx, KeyRequest{Op: KeyUse, Fingerprint: newFP})
	if err != nil {
		t.Fatal(err)
	}
	fingerprintsOK(t, "use", res, []string{newFP, oldFP}, 4)

	res, err = a.FleetKeys(ctx, KeyRequest{Op: KeyRemove, Key: c.key})
	if err != nil {
		t.Fatal(err)
	}
	fingerprintsOK(t, "remove", res, []string{newFP}, 4)

	// An unknown key is reported per member, nothing changes.
	k3, _ := GenerateKey()
	if _, err := a.FleetKeys(ctx, KeyRequest{Op: KeyUse, Key: k3}); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("using a key nobody has: %v", err)
	}

	loaded, err := LoadKeyFile(keyFile)
	if err != nil || len(loaded) != 1 || string(loaded[0]) != string(k2) {
		t.Fatalf("key file after rotation: %d keys, %v", len(loaded), err)
	}

	// Gossip still flows with the new key.
	if err := nodes[3].SetLocalInventory(Inventory{DiskFreeBytes: 42}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		wait.For(t, n.LocalName()+" sees d's inventory", func() bool {
			m, _ := member(n, "d")
			return m.Inventory != nil && m.Inventory.DiskFreeBytes == 42 && aliveCount(n) == 4
		})
	}

	// A node with only the old key cannot join any more.
	stale := c.start("stale", func(cfg *Config) { cfg.Keyring = [][]byte{c.key} })
	if _, err := stale.Join(ctx, []string{c.addr("b")}); err == nil {
		t.Fatal("a node with the removed key joined")
	}
	for _, n := range nodes {
		if _, ok := member(n, "stale"); ok {
			t.Fatalf("%s lists the stale node", n.LocalName())
		}
	}
}

// TestFleetKeysReportsUnreachable: a member that does not answer is
// reported, not hidden, and the others still apply the operation.
func TestFleetKeysReportsUnreachable(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := newMockCluster(t, names...)
	nodes := startCluster(t, c, names, nil)
	c.stop("c", false) // crashed, not yet declared dead
	k2, _ := GenerateKey()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := nodes[0].FleetKeys(ctx, KeyRequest{Op: KeyInstall, Key: k2})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range res {
		got[r.Node] = r.Err
	}
	if got["a"] != "" || got["b"] != "" {
		t.Fatalf("live members failed: %v", got)
	}
	if e, ok := got["c"]; !ok || e == "" {
		t.Fatalf("the crashed member reported success: %v", got)
	}
}

// TestFleetKeysAskSuspects: a member held as suspect (it missed probes,
// no proof that it is gone) is asked, and it answers a requester it holds
// as suspect; skipping it would leave it on the old key unreported.
func TestFleetKeysAskSuspects(t *testing.T) {
	names := []string{"a", "b"}
	c := newMockCluster(t, names...)
	nodes := startCluster(t, c, names, nil)
	for i, peer := range []string{"b", "a"} {
		nodes[i].mu.Lock()
		nodes[i].peers[peer].state = MemberSuspect
		nodes[i].mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := nodes[0].FleetKeys(ctx, KeyRequest{Op: KeyList})
	if err != nil {
		t.Fatal(err)
	}
	fingerprintsOK(t, "list", res, []string{Fingerprint(c.key)}, 2)
}

func TestFleetKeysInsecure(t *testing.T) {
	names := []string{"a"}
	c := newMockCluster(t, names...)
	n := c.start("a", func(cfg *Config) { cfg.Keyring = nil; cfg.Insecure = true })
	if _, err := n.FleetKeys(context.Background(), KeyRequest{Op: KeyList}); !errors.Is(err, ErrInsecure) {
		t.Fatalf("insecure node: %v", err)
	}
	k, _ := GenerateKey()
	if _, err := n.FleetKeys(context.Background(), KeyRequest{Op: KeyInstall, Key: k}); err == nil {
		t.Fatal("insecure node installed a key")
	}
}

// TestKeyOpFromOutsiderIgnored: a node without the cluster key sends
// keyring operations straight to a member; none is applied.
func TestKeyOpFromOutsiderIgnored(t *testing.T) {
	names := []string{"a", "b", "outsider", "plain"}
	c := newMockCluster(t, names...)
	nodes := startCluster(t, c, names[:2], nil)
	otherKey, _ := GenerateKey()
	outsider := c.start("outsider", func(cfg *Config) { cfg.Keyring = [][]byte{otherKey} })
	plain := c.start("plain", func(cfg *Config) { cfg.Keyring = nil; cfg.Insecure = true })
	evil, _ := GenerateKey()
	a := nodes[0]
	a.mu.Lock()
	target := &memberlistNode{Name: "a", Addr: a.peers["a"].ip, Port: a.peers["a"].port}
	a.mu.Unlock()
	for _, from := range []*Node{outsider, plain} {
		for _, op := range []keyOpMsg{
			{ID: "x1", From: "b", Op: KeyInstall, Key: EncodeKey(evil)},
			{ID: "x2", From: "b", Op: KeyRemove, Fingerprint: Fingerprint(c.key)},
		} {
			msg, err := encodeMsg(msgKeyOp, op)
			if err != nil {
				t.Fatal(err)
			}
			_ = from.ml.SendReliable(target, msg)
			_ = from.ml.SendBestEffort(target, msg)
		}
	}
	for range 20 {
		if ks := a.KeyFingerprints(); len(ks) != 1 || ks[0] != Fingerprint(c.key) {
			t.Fatalf("an outsider changed the keyring: %v", ks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
