package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/internal/testutil/syncbuf"
	"github.com/warmfleet/warmfleet/internal/testutil/testbolt"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
	"github.com/warmfleet/warmfleet/spec"
)

func startCluster(t *testing.T, c *mockCluster, names []string, edit func(name string, cfg *Config)) []*Node {
	t.Helper()
	var nodes []*Node
	for i, name := range names {
		nodes = append(nodes, c.start(name, func(cfg *Config) {
			if i > 0 {
				cfg.Join = []string{c.addr(names[0])}
			}
			if edit != nil {
				edit(name, cfg)
			}
		}))
	}
	for _, n := range nodes {
		wait.For(t, n.LocalName()+" sees every member", func() bool { return aliveCount(n) == len(names) })
	}
	return nodes
}

func TestClusterSpecsInventoryAndLeave(t *testing.T) {
	ctx := context.Background()
	names := []string{"n0", "n1", "n2", "n3", "n4"}
	c := newMockCluster(t, names...)
	desired := map[string]*desired.State{}
	regs := map[string]*promRegistry{}
	nodes := startCluster(t, c, names, func(name string, cfg *Config) {
		desired[name] = newDesired(t, testbolt.OpenTemp(t), name, nil)
		cfg.Desired = desired[name]
		cfg.Labels = map[string]string{"gpu": "h100"}
		if name == "n4" {
			cfg.Role = RoleRouter
		}
		regs[name] = newRegistry()
		cfg.Registerer = regs[name]
	})

	// A spec added on one node reaches all; a delete on another too.
	s := modelSpec("llama")
	if err := desired["n2"].Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		wait.For(t, name+" has the spec", func() bool { _, ok := desired[name].Get(s.Key()); return ok })
	}
	if err := desired["n4"].Delete(ctx, s.Key()); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		wait.For(t, name+" dropped the spec", func() bool { return len(desired[name].List()) == 0 })
	}

	// A small inventory travels in a broadcast.
	inv := Inventory{
		Models:        map[string]ModelInventory{"llama": {Revision: "r1", State: StateReady, BytesDone: 10, BytesTotal: 10, Path: "/cache/llama"}},
		Images:        map[string]ImageInventory{"vllm/vllm:0.6": {Digest: "sha256:abc", State: StateDownloading, BytesDone: 5, BytesTotal: 9}},
		Endpoints:     []Endpoint{{Model: "llama", URL: "http://10.0.0.1:8000", Speed: 2}},
		DiskFreeBytes: 100, DiskTotalBytes: 200,
	}
	if err := nodes[1].SetLocalInventory(inv); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		wait.For(t, n.LocalName()+" sees n1's inventory", func() bool {
			m, _ := member(n, "n1")
			return m.Inventory != nil && m.Inventory.Models["llama"].State == StateReady &&
				m.Labels["gpu"] == "h100" && m.Inventory.Images["vllm/vllm:0.6"].BytesDone == 5 &&
				len(m.Inventory.Endpoints) == 1 && m.Inventory.Endpoints[0].Speed == 2
		})
	}
	// A big one is announced by version and fetched over a stream.
	big := Inventory{Models: map[string]ModelInventory{}}
	for i := range 200 {
		big.Models[fmt.Sprintf("org/model-%03d", i)] = ModelInventory{Revision: fmt.Sprintf("rev-%d", i*7919), State: StateReady, BytesTotal: int64(i) << 30, Path: fmt.Sprintf("/nvme/cache/org/model-%03d", i)}
	}
	if msg, _ := encodeMsg(msgInventory, invRecord{Node: "n3", Version: 1, Inv: &big}); len(msg) <= nodes[3].tun.MaxBroadcastBytes {
		t.Fatalf("test inventory encodes to %d bytes: too small to exercise the fetch path", len(msg))
	}
	if err := nodes[3].SetLocalInventory(big); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		wait.For(t, n.LocalName()+" sees n3's big inventory", func() bool {
			m, _ := member(n, "n3")
			return m.Inventory != nil && len(m.Inventory.Models) == 200
		})
	}

	// Targets agree everywhere, and skip the router.
	target := modelSpec("x")
	target.Targets.Nodes = 2
	wait.For(t, "every node agrees on 2 targets, no router", func() bool {
		want := Targets(target, nodes[0].Members())
		if len(want) != 2 || slices.Contains(want, "n4") {
			return false
		}
		for _, n := range nodes[1:] {
			if got := Targets(target, n.Members()); !slices.Equal(got, want) {
				t.Logf("%s computes %v, n0 %v", n.LocalName(), got, want)
				for _, m := range n.Members() {
					t.Logf("%s sees %s %s %s", n.LocalName(), m.Name, m.State, m.Role)
				}
				return false
			}
		}
		return true
	})

	// Metrics: members by state and bytes on the wire.
	if got := testutil.ToFloat64(gaugeWithLabel(t, regs["n0"], "warmfleet_gossip_members", "state", "alive")); got != 5 {
		t.Fatalf("alive members metric = %v, want 5", got)
	}
	if got := testutil.ToFloat64(gaugeWithLabel(t, regs["n0"], "warmfleet_gossip_bytes_sent_total", "transport", "packet")); got <= 0 {
		t.Fatalf("bytes sent metric = %v", got)
	}

	// A node that leaves disappears with its inventory.
	c.stop("n1", true)
	for _, n := range []*Node{nodes[0], nodes[2], nodes[3], nodes[4]} {
		wait.For(t, n.LocalName()+" sees n1 leave", func() bool {
			m, ok := member(n, "n1")
			return ok && m.State == MemberLeft && m.Inventory == nil
		})
		if slices.Contains(Targets(modelSpec("y"), n.Members()), "n1") {
			t.Fatalf("%s still targets n1", n.LocalName())
		}
	}
	// A node that crashes is found dead and dropped too.
	c.stop("n3", false)
	for _, n := range []*Node{nodes[0], nodes[2], nodes[4]} {
		wait.For(t, n.LocalName()+" finds n3 dead", func() bool {
			m, ok := member(n, "n3")
			return ok && m.State == MemberDead && m.Inventory == nil
		})
	}
}

func TestLateJoinerGetsStateByPushPull(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b", "c", "late"}
	c := newMockCluster(t, names...)
	desired := map[string]*desired.State{}
	for _, name := range names {
		desired[name] = newDesired(t, testbolt.OpenTemp(t), name, nil)
	}
	nodes := startCluster(t, c, names[:3], func(name string, cfg *Config) { cfg.Desired = desired[name] })
	for i, n := range nodes {
		if err := desired[n.LocalName()].Put(ctx, modelSpec(fmt.Sprintf("m%d", i))); err != nil {
			t.Fatal(err)
		}
		if err := n.SetLocalInventory(Inventory{DiskFreeBytes: int64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names[:3] {
		wait.For(t, name+" has 3 specs", func() bool { return len(desired[name].List()) == 3 })
	}
	// Broadcasts are over by now: the newcomer learns by push/pull only.
	late := c.start("late", func(cfg *Config) { cfg.Desired = desired["late"]; cfg.Join = []string{c.addr("b")} })
	wait.For(t, "late has every spec", func() bool { return len(desired["late"].List()) == 3 })
	wait.For(t, "late has every inventory", func() bool {
		for _, m := range late.Members() {
			if m.Inventory == nil || (!m.Self && m.Inventory.DiskFreeBytes == 0) {
				return false
			}
		}
		return len(late.Members()) == 4
	})
}

func TestWrongKeyCannotJoinOrInject(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b", "intruder", "plain"}
	c := newMockCluster(t, names...)
	da := newDesired(t, testbolt.OpenTemp(t), "a", nil)
	nodes := startCluster(t, c, names[:2], func(name string, cfg *Config) {
		if name == "a" {
			cfg.Desired = da
		}
	})
	otherKey, _ := GenerateKey()
	di := newDesired(t, testbolt.OpenTemp(t), "intruder", nil)
	if err := di.Put(ctx, modelSpec("evil")); err != nil {
		t.Fatal(err)
	}
	intruder := c.start("intruder", func(cfg *Config) { cfg.Keyring = [][]byte{otherKey}; cfg.Desired = di })
	if _, err := intruder.Join(ctx, []string{c.addr("a")}); err == nil {
		t.Fatal("a node with another key joined")
	}
	plain := c.start("plain", func(cfg *Config) { cfg.Keyring = nil; cfg.Insecure = true })
	if _, err := plain.Join(ctx, []string{c.addr("a")}); err == nil {
		t.Fatal("a node without encryption joined")
	}
	// The intruder's own broadcasts never reach a keyed member either.
	if err := intruder.SetLocalInventory(Inventory{DiskFreeBytes: 1}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		for _, n := range nodes {
			for _, m := range n.Members() {
				if m.Name == "intruder" || m.Name == "plain" {
					t.Fatalf("%s lists %s", n.LocalName(), m.Name)
				}
			}
		}
		if len(da.List()) != 0 {
			t.Fatalf("intruder's spec reached a: %v", keys(da.List()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestKeyRotationWithoutDowntime(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b", "c", "new"}
	c := newMockCluster(t, names...)
	desired := map[string]*desired.State{}
	for _, name := range names {
		desired[name] = newDesired(t, testbolt.OpenTemp(t), name, nil)
	}
	nodes := startCluster(t, c, names[:3], func(name string, cfg *Config) { cfg.Desired = desired[name] })
	k2, _ := GenerateKey()
	for _, n := range nodes {
		if err := n.InstallKey(k2); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := n.UseKey(k2); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := n.RemoveKey(c.key); err != nil {
			t.Fatal(err)
		}
		if ks := n.Keys(); len(ks) != 1 || string(ks[0]) != string(k2) {
			t.Fatalf("%s keys after rotation: %d", n.LocalName(), len(ks))
		}
	}
	if err := desired["a"].Put(ctx, modelSpec("after-rotation")); err != nil {
		t.Fatal(err)
	}
	for _, name := range names[:3] {
		wait.For(t, name+" got the spec after rotation", func() bool { return len(desired[name].List()) == 1 })
	}
	for _, n := range nodes {
		if aliveCount(n) != 3 {
			t.Fatalf("%s lost members during rotation: %d alive", n.LocalName(), aliveCount(n))
		}
	}
	newcomer := c.start("new", func(cfg *Config) { cfg.Keyring = [][]byte{k2}; cfg.Desired = desired["new"] })
	if _, err := newcomer.Join(ctx, []string{c.addr("c")}); err != nil {
		t.Fatalf("join with the new key: %v", err)
	}
	wait.For(t, "newcomer has the spec", func() bool { return len(desired["new"].List()) == 1 })
}

func TestGarbageMessagesDroppedAndCounted(t *testing.T) {
	names := []string{"a", "b"}
	c := newMockCluster(t, names...)
	reg := newRegistry()
	nodes := startCluster(t, c, names, func(name string, cfg *Config) {
		if name == "a" {
			cfg.Registerer = reg
			cfg.Desired = newDesired(t, testbolt.OpenTemp(t), name, nil)
		}
	})
	nodes[1].mu.Lock()
	pa := nodes[1].peers["a"]
	toA := &memberlistNode{Name: "a", Addr: pa.ip, Port: pa.port}
	nodes[1].mu.Unlock()
	garbage := [][]byte{
		{},
		{1},
		{9, 1, 0, '{', '}'},
		{1, 99, 0, '{', '}'},
		{1, byte(msgSpecs), 7, 'x'},
		{1, byte(msgSpecs), encJSON, '[', '['},
		{1, byte(msgInventory), encJSON, '{', '}'},
		{1, byte(msgState), encJSON, '{', '}'},
		append([]byte{1, byte(msgSpecs), encJSON}, []byte(strings.Repeat(" ", maxPacketPayload+1))...),
	}
	for _, g := range garbage {
		if len(g) == 0 {
			continue // memberlist does not deliver empty messages
		}
		if err := nodes[1].ml.SendReliable(toA, g); err != nil {
			t.Fatal(err)
		}
	}
	want := float64(len(garbage) - 1)
	wait.For(t, "a counted every dropped message", func() bool {
		total := 0.0
		for _, r := range []string{dropDecode, dropOversize, dropInvalid, dropUnexpected} {
			total += testutil.ToFloat64(nodes[0].met.dropped.WithLabelValues(r))
		}
		return total == want
	})
	if aliveCount(nodes[0]) != 2 {
		t.Fatal("a lost b after garbage")
	}
	// Bad push/pull states are dropped too.
	before := testutil.ToFloat64(nodes[0].met.dropped.WithLabelValues(dropDecode))
	nodes[0].mergeState([]byte("garbage"))
	if testutil.ToFloat64(nodes[0].met.dropped.WithLabelValues(dropDecode)) != before+1 {
		t.Fatal("a bad push/pull state was not counted")
	}
}

func TestStartValidation(t *testing.T) {
	c := newMockCluster(t, "a")
	base := func() Config {
		return Config{NodeName: "a", Keyring: [][]byte{c.key}, Transport: c.transport("a"), Tuning: fastTuning()}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no key", func(cfg *Config) { cfg.Keyring = nil }, "cluster key is required"},
		{"key and insecure", func(cfg *Config) { cfg.Insecure = true }, "exclusive"},
		{"short key", func(cfg *Config) { cfg.Keyring = [][]byte{make([]byte, 16)} }, "want 32"},
		{"big meta", func(cfg *Config) {
			cfg.Meta = Meta{APIAddr: strings.Repeat("a", 200), PeerAddr: strings.Repeat("p", 200), Zone: strings.Repeat("z", 200)}
		}, "at most 512"},
		{"bad role", func(cfg *Config) { cfg.Role = "boss" }, "role"},
		{"bad name", func(cfg *Config) { cfg.NodeName = "has space" }, "node name"},
		{"bad label", func(cfg *Config) { cfg.Labels = map[string]string{"k": "bad value"} }, "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.edit(&cfg)
			_, err := Start(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestProgressUpdatesAreCoalesced(t *testing.T) {
	names := []string{"a", "b"}
	c := newMockCluster(t, names...)
	c.tun.ProgressInterval = time.Hour // only a state change may broadcast
	nodes := startCluster(t, c, names, nil)
	a, b := nodes[0], nodes[1]
	inv := Inventory{Models: map[string]ModelInventory{"m": {State: StateDownloading, BytesTotal: 100}}}
	if err := a.SetLocalInventory(inv); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "b sees the download start", func() bool {
		m, _ := member(b, "a")
		return m.Inventory != nil && m.Inventory.Models["m"].State == StateDownloading
	})
	a.mu.Lock()
	sent := a.sentVersion
	a.mu.Unlock()
	for i := range 10 {
		inv.Models["m"] = ModelInventory{State: StateDownloading, BytesDone: int64(i * 10), BytesTotal: 100}
		if err := a.SetLocalInventory(inv); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	if a.sentVersion != sent {
		t.Fatal("a progress-only update was broadcast at once")
	}
	a.mu.Unlock()
	inv.Models["m"] = ModelInventory{State: StateReady, BytesDone: 100, BytesTotal: 100}
	if err := a.SetLocalInventory(inv); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "b sees the model ready", func() bool {
		m, _ := member(b, "a")
		return m.Inventory != nil && m.Inventory.Models["m"].State == StateReady
	})
}

func TestSetLocalInventoryRejectsInvalid(t *testing.T) {
	c := newMockCluster(t, "a")
	a := c.start("a", nil)
	for _, inv := range []Inventory{
		{Models: map[string]ModelInventory{"m": {State: "bogus"}}},
		{Models: map[string]ModelInventory{"m": {State: StateReady, BytesDone: -1}}},
		{Endpoints: []Endpoint{{Model: "m"}}},
		{Endpoints: []Endpoint{{Model: "m", URL: "http://a", Speed: -1}}},
		{Endpoints: []Endpoint{{Model: "m", URL: "http://a", Speed: 65}}},
		{Labels: map[string]string{"": "x"}},
		{S3Bytes: -1},
		{PeerBytesIn: -1},
		{PeerBytesOut: -1},
	} {
		if err := a.SetLocalInventory(inv); err == nil {
			t.Fatalf("accepted %+v", inv)
		}
	}
	if err := a.SetLocalInventory(Inventory{}); err != nil {
		t.Fatal(err)
	}
	_ = spec.Spec{}
}

// TestDeathSeenWhileClosingIsQuiet: a member reported gone after this node
// began to close is logged at debug, not info; a whole-fleet stop must not
// log each peer as dead on the nodes that stop last.
func TestDeathSeenWhileClosingIsQuiet(t *testing.T) {
	c := newMockCluster(t, "a", "b")
	var logs syncbuf.Buffer
	a := c.start("a", func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ev := (*events)(a)
	ev.NotifyLeave(&memberlist.Node{Name: "x"})
	if !strings.Contains(logs.String(), "member gone") {
		t.Fatalf("a death seen while running was not logged at info: %q", logs.String())
	}
	if err := a.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := logs.String()
	ev.NotifyLeave(&memberlist.Node{Name: "y"})
	if after := logs.String(); after != before {
		t.Fatalf("a death seen while closing was logged at info: %q", after[len(before):])
	}
}

// observingStore saves through a real store and, on the first save that
// brings key, records what check says at that moment.
type observingStore struct {
	desired.Store
	key   string
	check func() bool
	seen  atomic.Int32 // 0 not yet, 1 true, 2 false
}

func (s *observingStore) Save(ctx context.Context, c desired.StoreChange) error {
	for _, r := range c.Put {
		if r.Key == s.key && s.seen.Load() == 0 {
			if s.check() {
				s.seen.Store(1)
			} else {
				s.seen.Store(2)
			}
		}
	}
	return s.Store.Save(ctx, c)
}

// TestPushPullBringsTheSenderBeforeItsSpecs: a node that learns a spec in
// a push/pull already knows the sender's inventory when the spec lands. A
// late node told of a spec before anyone's inventory ranks itself first
// for every shard, knows no holder, and reads the origin.
func TestPushPullBringsTheSenderBeforeItsSpecs(t *testing.T) {
	ctx := context.Background()
	c := newMockCluster(t, "holder", "late")
	s := modelSpec("llama")
	holderDesired := newDesired(t, testbolt.OpenTemp(t), "holder", nil)
	if err := holderDesired.Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	holder := c.start("holder", func(cfg *Config) { cfg.Desired = holderDesired })
	inv := Inventory{Models: map[string]ModelInventory{"llama": {Revision: "r1", State: StateReady, BytesDone: 10, BytesTotal: 10}}}
	if err := holder.SetLocalInventory(inv); err != nil {
		t.Fatal(err)
	}

	bolt, err := desired.NewBoltStore(testbolt.OpenTemp(t), "desired")
	if err != nil {
		t.Fatal(err)
	}
	var late *Node
	store := &observingStore{Store: bolt, key: s.Key(), check: func() bool {
		m, _ := member(late, "holder")
		return m.Inventory != nil && m.Inventory.Models["llama"].State == StateReady
	}}
	lateDesired, err := desired.New(ctx, store, desired.Options{NodeName: "late"})
	if err != nil {
		t.Fatal(err)
	}
	late = c.start("late", func(cfg *Config) { cfg.Desired = lateDesired })
	// The two never meet on the network, so no rumor can come first: late
	// admits holder as memberlist would, then merges its push/pull state.
	late.mu.Lock()
	late.peers["holder"] = &peer{state: MemberAlive}
	late.mu.Unlock()
	late.mergeState(holder.localState())
	if _, ok := lateDesired.Get(s.Key()); !ok {
		t.Fatal("the push/pull did not bring the spec")
	}
	if store.seen.Load() != 1 {
		t.Fatal("the spec was saved before the sender's inventory was known")
	}
}

// TestProgressOnlyInventoryIsNotCompressed: a progress-only inventory change
// that waits for the next flush is checked against the size limit without
// compressing it (the daemon publishes several a second while it fetches;
// each one built a DEFLATE writer, most of a fetching daemon's garbage).
func TestProgressOnlyInventoryIsNotCompressed(t *testing.T) {
	c := newMockCluster(t, "a")
	n := startCluster(t, c, []string{"a"}, func(_ string, cfg *Config) { cfg.Tuning.ProgressInterval = time.Hour })[0]
	inv := Inventory{DiskFreeBytes: 1 << 40, DiskTotalBytes: 2 << 40, Models: map[string]ModelInventory{}}
	for i := range 4 {
		inv.Models[fmt.Sprintf("org/model-%d", i)] = ModelInventory{Revision: strings.Repeat("r", 40), State: StateDownloading, BytesTotal: 1 << 30, Path: "/var/lib/warmfleet/models/org/model"}
	}
	if err := n.SetLocalInventory(inv); err != nil {
		t.Fatal(err)
	}
	const calls = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range calls {
		m := inv.Models["org/model-0"]
		m.BytesDone = int64(i+1) << 20
		inv.Models["org/model-0"] = m
		if err := n.SetLocalInventory(inv); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / calls; per > 64<<10 {
		t.Fatalf("a progress-only inventory update allocated %d bytes, want under 64 KiB (no compression until it is sent)", per)
	}
	self, ok := member(n, "a")
	if !ok || self.Inventory == nil || self.Inventory.Models["org/model-0"].BytesDone != calls<<20 {
		t.Fatalf("own inventory after the updates: %+v", self.Inventory)
	}
}
