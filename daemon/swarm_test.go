package daemon

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/p2p"
	"github.com/warmfleet/warmfleet/spec"
)

func TestPollWait(t *testing.T) {
	for polls, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: manifestPoll, 200: manifestPoll, 1 << 20: manifestPoll} {
		if got := pollWait(polls); got != want {
			t.Errorf("pollWait(%d) = %v, want %v", polls, got, want)
		}
	}
}

func TestManifestAsks(t *testing.T) {
	rank := []string{"a", "b", "c", "d"}
	none := map[string]bool{}
	for _, tc := range []struct {
		name    string
		rank    []string
		self    string
		poll    int
		holders map[string]bool
		want    []string
	}{
		{"cold start, follower: only the origin", rank, "c", 0, none, []string{"a"}},
		{"cold start, origin: nobody", rank, "a", 0, none, []string{}},
		{"warm fleet: the origin and the holders, in rank order", rank, "c", 0, map[string]bool{"d": true, "b": true}, []string{"a", "b", "d"}},
		{"warm fleet, joining origin: the holders", rank, "a", 0, map[string]bool{"c": true}, []string{"c"}},
		{"later poll: the origin", rank, "c", 3, map[string]bool{"d": true}, []string{"a"}},
		{"every probeAllEvery polls: everyone else", rank, "c", probeAllEvery, none, []string{"a", "b", "d"}},
		{"ranked first after the first poll: everyone else", rank, "a", 1, none, []string{"b", "c", "d"}},
		{"alone", nil, "a", 0, none, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := manifestAsks(tc.rank, tc.self, tc.poll, tc.holders)
			if !slices.Equal(got, tc.want) {
				t.Errorf("manifestAsks(%v, %q, %d, %v) = %v, want %v", tc.rank, tc.self, tc.poll, tc.holders, got, tc.want)
			}
		})
	}
}

// TestAskWait: a poll that asks the shard's origin alone, another node,
// asks it to hold the ask until the shard opens; a poll of several members
// (one holding the manifest complete must not be held back) or of nobody
// else does not.
func TestAskWait(t *testing.T) {
	rank := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name  string
		probe []string
		self  string
		want  time.Duration
	}{
		{"the origin alone", []string{"a"}, "c", manifestWait},
		{"the origin and the holders", []string{"a", "b"}, "c", 0},
		{"a holder alone, this node the origin", []string{"c"}, "a", 0},
		{"nobody", nil, "a", 0},
	} {
		if got := askWait(tc.probe, rank, tc.self); got != tc.want {
			t.Errorf("%s: askWait(%v, %v, %q) = %v, want %v", tc.name, tc.probe, rank, tc.self, got, tc.want)
		}
	}
}

// Models cached from identical files share a revision, and so their shard
// manifests: removing one model must keep the manifests the other uses
// (its shards are served again from them after a restart), and drop them
// once no model uses the revision.
func TestDeleteManifestsKeepsThoseAnotherModelUses(t *testing.T) {
	st, err := openState(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	m := &p2p.Manifest{ShardID: "rev1/f0.bin#0", Name: "f0.bin", FileSize: 1 << 20, Length: 1 << 20,
		PieceLength: 1 << 20, Algo: p2p.BLAKE3, Hashes: make([]byte, p2p.BLAKE3.Size())}
	if err := st.putManifest(m.ShardID, m); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if err := st.putRecord(cacheRecord{Spec: spec.Spec{Name: name}, RevisionID: "rev1", State: api.StateReady}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.deleteManifests("a", []string{"rev1"}, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := st.manifest(m.ShardID); err != nil || got == nil {
		t.Fatalf("manifest of the revision b still uses: %v, %v; want it kept", got, err)
	}
	if err := st.deleteRecord("a"); err != nil {
		t.Fatal(err)
	}
	if err := st.deleteManifests("b", []string{"rev1"}, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := st.manifest(m.ShardID); err != nil || got != nil {
		t.Fatalf("manifest of a revision no model uses: %v, %v; want it gone", got, err)
	}
}

// TestSettleWait: only a node that resumes a download and sees no other
// member waits, and only until settle has passed since it started.
func TestSettleWait(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const settle = 10 * time.Second
	for _, tc := range []struct {
		name            string
		resuming, alone bool
		now             time.Time
		want            time.Duration
	}{
		{"a new download does not wait", false, true, t0, 0},
		{"a member in sight", true, false, t0, 0},
		{"resuming alone at start", true, true, t0, settle},
		{"resuming alone 4s in", true, true, t0.Add(4 * time.Second), 6 * time.Second},
		{"resuming alone after settle", true, true, t0.Add(time.Minute), 0},
	} {
		if got := settleWait(tc.resuming, tc.alone, t0, tc.now, settle); got != tc.want {
			t.Errorf("%s: wait %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWriterAway: a fetch waits for the member that asked for the model
// only while that member is a node this node sees gone, or back without
// its inventory yet.
func TestWriterAway(t *testing.T) {
	inv := &gossip.Inventory{}
	for _, tc := range []struct {
		name string
		m    gossip.Member
		want bool
	}{
		{"alive with its inventory", gossip.Member{Name: "w", State: gossip.MemberAlive, Role: gossip.RoleNode, Inventory: inv}, false},
		{"dead: the partition has not healed here yet", gossip.Member{Name: "w", State: gossip.MemberDead, Role: gossip.RoleNode}, true},
		{"left: restarting", gossip.Member{Name: "w", State: gossip.MemberLeft, Role: gossip.RoleNode}, true},
		{"alive, inventory not in yet", gossip.Member{Name: "w", State: gossip.MemberAlive, Role: gossip.RoleNode}, true},
		{"a router has no inventory to wait for", gossip.Member{Name: "w", State: gossip.MemberAlive, Role: gossip.RoleRouter}, false},
		{"this node wrote it", gossip.Member{Name: "w", State: gossip.MemberAlive, Role: gossip.RoleNode, Self: true}, false},
		{"another member", gossip.Member{Name: "x", State: gossip.MemberDead, Role: gossip.RoleNode}, false},
	} {
		if got := writerAway("w", []gossip.Member{tc.m}); got != tc.want {
			t.Errorf("%s: writerAway = %v, want %v", tc.name, got, tc.want)
		}
	}
	if writerAway("w", nil) {
		t.Error("a writer never seen (or gone from the view) is waited for")
	}
}

// TestReadFromOrigin: a shard's origin reads it from S3 at once, unless a
// member gossip says holds it refused this node as a stranger, and then
// only for holderPatience; a follower reads it after originFallback.
func TestReadFromOrigin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rank    []string
		waited  time.Duration
		refused bool
		want    bool
	}{
		{"no member may read it", nil, 0, false, true},
		{"the origin", []string{"me", "b"}, 0, false, true},
		{"another's shard", []string{"b", "me"}, time.Second, false, false},
		{"another's shard, past the fallback", []string{"b", "me"}, originFallback + time.Second, false, true},
		{"the origin, a holder refused it", []string{"me", "b"}, time.Second, true, false},
		{"the origin, a holder refused it past the patience", []string{"me", "b"}, holderPatience + time.Second, true, true},
	} {
		if got := readFromOrigin(tc.rank, "me", tc.waited, tc.refused); got != tc.want {
			t.Errorf("%s: readFromOrigin = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBypassedSwarm: only a member that holds the revision ready and has
// no manifest of the shard bypassed the swarm; one still fetching may yet
// open the shard (an origin builds its shards one after another).
func TestBypassedSwarm(t *testing.T) {
	ready := gossip.ModelInventory{Revision: "r1", State: gossip.StateReady}
	for _, tc := range []struct {
		name       string
		noManifest bool
		inv        gossip.ModelInventory
		want       bool
	}{
		{"ready, no manifest", true, ready, true},
		{"ready, serving the shard", false, ready, false},
		{"ready with another revision", true, gossip.ModelInventory{Revision: "r0", State: gossip.StateReady}, false},
		{"still downloading", true, gossip.ModelInventory{Revision: "r1", State: gossip.StateDownloading}, false},
		{"no inventory yet", true, gossip.ModelInventory{}, false},
	} {
		if got := bypassedSwarm(tc.noManifest, tc.inv, "r1"); got != tc.want {
			t.Errorf("%s: bypassedSwarm = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A shard's layout, stored when it is opened without its manifest, makes
// its revision one the swarm began until the manifest replaces it, and goes
// with the revision's manifests.
func TestShardLayoutState(t *testing.T) {
	st, err := openState(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	spec := p2p.BuildSpec{ShardID: "rev1/f0.bin#0", Name: "f0.bin", FileSize: 5 << 20, Length: 5 << 20, PieceLength: 1 << 20}
	if began, err := st.hasManifests("rev1"); err != nil || began {
		t.Fatalf("hasManifests before any shard = %v, %v", began, err)
	}
	if err := st.putLayout(spec.ShardID, spec.Skeleton()); err != nil {
		t.Fatal(err)
	}
	l, err := st.layout(spec.ShardID)
	if err != nil || l == nil || l.SkeletonID() != spec.Skeleton().SkeletonID() {
		t.Fatalf("layout = %+v, %v; want the skeleton stored", l, err)
	}
	if m, err := st.manifest(spec.ShardID); err != nil || m != nil {
		t.Fatalf("a layout reads as a complete manifest: %v, %v", m, err)
	}
	if began, err := st.hasManifests("rev1"); err != nil || !began {
		t.Fatalf("hasManifests with a layout = %v, %v; want true", began, err)
	}
	m := spec.Skeleton()
	m.Hashes[0] = 1
	if err := st.putManifest(spec.ShardID, m); err != nil {
		t.Fatal(err)
	}
	if l, err := st.layout(spec.ShardID); err != nil || l != nil {
		t.Fatalf("layout after the manifest = %v, %v; want gone", l, err)
	}
	if err := st.putLayout("rev1/f1.bin#0", spec.Skeleton()); err != nil {
		t.Fatal(err)
	}
	if err := st.deleteManifests("m", []string{"rev1"}, ""); err != nil {
		t.Fatal(err)
	}
	if began, err := st.hasManifests("rev1"); err != nil || began {
		t.Fatalf("hasManifests after deleting the revision = %v, %v; want false", began, err)
	}
}
