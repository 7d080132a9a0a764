package gossip

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/internal/testutil/testbolt"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"go.etcd.io/bbolt"
)

// On real UDP/TCP over loopback: a member restarts with its bbolt state,
// rejoins, catches up on a delete it missed, and a member started before its
// seed joins once the seed is up.
func TestLoopbackRestartRejoins(t *testing.T) {
	ctx := context.Background()
	key, _ := GenerateKey()
	dir := t.TempDir()
	addrs := map[string]string{"a": testenv.FreeAddr(t), "b": testenv.FreeAddr(t), "c": testenv.FreeAddr(t)}
	type running struct {
		n  *Node
		d  *desired.State
		db *bbolt.DB
	}
	start := func(name string, join ...string) running {
		t.Helper()
		db := testbolt.Open(t, filepath.Join(dir, name+".db"))
		d := newDesired(t, db, name, nil)
		var joinAddrs []string
		for _, j := range join {
			joinAddrs = append(joinAddrs, addrs[j])
		}
		n, err := Start(ctx, Config{NodeName: name, BindAddr: addrs[name], Join: joinAddrs, Keyring: [][]byte{key},
			Desired: d, Tuning: fastTuning(), Logger: testLogger(t), Labels: map[string]string{"node": name}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_ = n.Close(cctx)
		})
		return running{n, d, db}
	}
	closeNode := func(r running) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := r.n.Close(cctx); err != nil {
			t.Fatal(err)
		}
		_ = r.db.Close()
	}

	// b starts first, pointing at a seed that is not up yet.
	b := start("b", "a")
	a := start("a")
	wait.For(t, "b joins once a is up", func() bool { return aliveCount(a.n) == 2 && aliveCount(b.n) == 2 })
	c := start("c", "a")
	wait.For(t, "three members", func() bool { return aliveCount(a.n) == 3 && aliveCount(b.n) == 3 && aliveCount(c.n) == 3 })

	for _, n := range []string{"one", "two"} {
		if err := a.d.Put(ctx, modelSpec(n)); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "b has both specs", func() bool { return len(b.d.List()) == 2 })

	closeNode(b)
	wait.For(t, "a sees b leave", func() bool { m, _ := member(a.n, "b"); return m.State == MemberLeft })
	if err := c.d.Delete(ctx, "model/one"); err != nil {
		t.Fatal(err)
	}

	b = start("b", "a", "c") // Start joins before it returns: b may be synced already
	wait.For(t, "restarted b learns the delete it missed", func() bool {
		got := keys(b.d.List())
		return len(got) == 1 && got[0] == "model/two"
	})
	if err := b.n.SetLocalInventory(Inventory{Models: map[string]ModelInventory{"two": {State: StateReady}}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []running{a, c} {
		wait.For(t, r.n.LocalName()+" sees b back with its inventory", func() bool {
			m, _ := member(r.n, "b")
			return m.State == MemberAlive && m.Inventory != nil && m.Inventory.Models["two"].State == StateReady && m.Labels["node"] == "b"
		})
	}
}
