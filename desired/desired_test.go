package desired

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testutil/testbolt"
	"github.com/warmfleet/warmfleet/internal/testutil/testclock"
	"github.com/warmfleet/warmfleet/spec"
	"go.etcd.io/bbolt"
)

func TestHLCMonotonic(t *testing.T) {
	clk := testclock.New()
	c := newHLC("a", clk.Now, time.Minute)
	prev := c.next(Timestamp{})
	for i := range 100 {
		if i%10 == 0 {
			clk.Advance(-time.Second) // wall clock steps back
		}
		ts := c.next(Timestamp{})
		if ts.Compare(prev) <= 0 {
			t.Fatalf("step %d: %+v not after %+v", i, ts, prev)
		}
		prev = ts
	}
	floor := Timestamp{Wall: prev.Wall + 5000, Logical: 7, Node: "zzz"}
	if ts := c.next(floor); ts.Compare(floor) <= 0 {
		t.Fatalf("next(%+v) = %+v, not after the floor", floor, ts)
	}
	if c.observe(Timestamp{Wall: clk.Now().Add(time.Hour).UnixMilli(), Node: "b"}) {
		t.Fatal("observe accepted a timestamp an hour ahead")
	}
	ahead := Timestamp{Wall: clk.Now().Add(30 * time.Second).UnixMilli(), Logical: 3, Node: "b"}
	if !c.observe(ahead) {
		t.Fatal("observe refused a timestamp within the drift bound")
	}
	if ts := c.next(Timestamp{}); ts.Compare(ahead) <= 0 {
		t.Fatalf("after observing %+v, next gave %+v", ahead, ts)
	}
}

func TestDesiredPutListDelete(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	db := testbolt.OpenTemp(t)
	d := newDesired(t, db, "a", clk.Now)

	if err := d.Put(ctx, spec.Spec{Kind: spec.KindModel, Name: "../x", Source: "s3://b/"}); err == nil {
		t.Fatal("Put accepted an invalid spec")
	}
	for _, n := range []string{"zeta", "alpha", "mid"} {
		if err := d.Put(ctx, modelSpec(n)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-d.Changed():
	default:
		t.Fatal("Changed did not fire after Put")
	}
	if got, want := keys(d.List()), []string{"model/alpha", "model/mid", "model/zeta"}; !slices.Equal(got, want) {
		t.Fatalf("List = %v, want %v", got, want)
	}
	before := d.Records()
	if err := d.Put(ctx, modelSpec("mid")); err != nil {
		t.Fatal(err)
	}
	if after := d.Records(); fmtRecords(after) != fmtRecords(before) {
		t.Fatalf("putting an equal spec changed the state:\n%s\n%s", fmtRecords(before), fmtRecords(after))
	}
	if err := d.Delete(ctx, "model/mid"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "model/mid"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: err = %v, want ErrNotFound", err)
	}
	if _, ok := d.Get("model/mid"); ok {
		t.Fatal("Get found a deleted spec")
	}
	if w, ok := d.Writer("model/alpha"); !ok || w != "a" {
		t.Fatalf("Writer(model/alpha) = %q, %v; want a", w, ok)
	}
	if _, ok := d.Writer("model/mid"); ok {
		t.Fatal("Writer named the writer of a deleted spec")
	}

	// A restart keeps specs and tombstones.
	d2 := newDesired(t, db, "a", clk.Now)
	if got, want := keys(d2.List()), []string{"model/alpha", "model/zeta"}; !slices.Equal(got, want) {
		t.Fatalf("after reload List = %v, want %v", got, want)
	}
	if got, want := fmtRecords(d2.Records()), fmtRecords(d.Records()); got != want {
		t.Fatalf("reload lost records:\n got %s\nwant %s", got, want)
	}
	// The reloaded clock continues past the saved writes even if the wall
	// clock went back.
	clk.Advance(-time.Hour)
	if err := d2.Put(ctx, modelSpec("mid")); err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.Get("model/mid"); !ok {
		t.Fatal("re-adding a deleted spec with a clock behind the tombstone lost")
	}
}

func TestDesiredLocalWriteBeatsFutureRecord(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	d := newDesired(t, testbolt.OpenTemp(t), "a", clk.Now)
	s := modelSpec("m")
	s.Revision = "future"
	// Ahead of our clock by more than the drift bound, within MaxFuture.
	future := Record{Key: s.Key(), TS: Timestamp{Wall: clk.Now().Add(40 * time.Minute).UnixMilli(), Node: "ahead"}, Spec: &s}
	if _, _, err := d.Merge(ctx, []Record{future}); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, s.Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Get(s.Key()); ok {
		t.Fatal("a local delete lost against a record from a clock 40 minutes ahead")
	}
}

func TestDesiredMergeRejectsInvalid(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	d := newDesired(t, testbolt.OpenTemp(t), "a", clk.Now)
	good := modelSpec("good")
	bad := spec.Spec{Kind: spec.KindModel, Name: "../../etc", Source: "s3://b/"}
	other := modelSpec("other")
	ts := Timestamp{Wall: clk.Now().UnixMilli(), Node: "b"}
	in := []Record{
		{Key: good.Key(), TS: ts, Spec: &good},
		{Key: bad.Key(), TS: ts, Spec: &bad},
		{Key: "model/mismatch", TS: ts, Spec: &other},
		{Key: "model/x", TS: Timestamp{Wall: -1, Node: "b"}},
		{Key: "model/y", TS: Timestamp{Wall: 1, Node: ""}},
	}
	applied, badN, err := d.Merge(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 1 || badN != 4 {
		t.Fatalf("applied %d, bad %d; want 1 and 4", len(applied), badN)
	}
	if got := keys(d.List()); !slices.Equal(got, []string{"model/good"}) {
		t.Fatalf("List = %v", got)
	}
}

func TestTombstoneExpires(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	db := testbolt.OpenTemp(t)
	d := newDesired(t, db, "a", clk.Now)
	if err := d.Put(ctx, modelSpec("m")); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "model/m"); err != nil {
		t.Fatal(err)
	}
	st, err := d.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Records) != 1 || !st.Records[0].Deleted() {
		t.Fatalf("snapshot before the TTL = %s, want the tombstone", fmtRecords(st.Records))
	}
	clk.Advance(72*time.Hour + time.Minute)
	if st, err = d.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.Records) != 0 {
		t.Fatalf("snapshot after the TTL = %s, want nothing", fmtRecords(st.Records))
	}
	if d2 := newDesired(t, db, "a", clk.Now); len(d2.Records()) != 0 {
		t.Fatalf("expired tombstone still on disk: %s", fmtRecords(d2.Records()))
	}
}

// A node away for longer than the tombstone TTL must not bring back a spec
// deleted while it was away, and must keep what it wrote itself.
func TestStaleNodeDoesNotResurrect(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	dbA := testbolt.OpenTemp(t)
	a := newDesired(t, dbA, "a", clk.Now)
	b := newDesired(t, testbolt.OpenTemp(t), "b", clk.Now)
	c := newDesired(t, testbolt.OpenTemp(t), "c", clk.Now)
	for _, n := range []string{"keep", "doomed"} {
		if err := b.Put(ctx, modelSpec(n)); err != nil {
			t.Fatal(err)
		}
	}
	sync := func(from, to *State) {
		t.Helper()
		st, err := from.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := to.MergeFull(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	all := func(nodes ...*State) {
		for _, x := range nodes {
			for _, y := range nodes {
				if x != y {
					sync(x, y)
				}
			}
		}
	}
	all(a, b, c)
	clk.Advance(2 * time.Minute)
	all(a, b, c) // persists the sync times (rate-limited to once a minute)

	// a goes down; b deletes "doomed"; days pass, b and c keep syncing and
	// forget the delete.
	if err := b.Delete(ctx, "model/doomed"); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		clk.Advance(24 * time.Hour)
		all(b, c)
	}
	if st, _ := b.Snapshot(ctx); fmtRecords(st.Records) != fmtRecords(b.Records()) || len(st.Records) != 1 || st.Records[0].Key != "model/keep" {
		t.Fatalf("b offers %s, want only model/keep", fmtRecords(st.Records))
	}

	// a restarts: stale. It still serves its specs locally...
	a = newDesired(t, dbA, "a", clk.Now)
	if got := keys(a.List()); !slices.Equal(got, []string{"model/doomed", "model/keep"}) {
		t.Fatalf("stale a lists %v", got)
	}
	// ...writes something new while stale...
	if err := a.Put(ctx, modelSpec("fresh")); err != nil {
		t.Fatal(err)
	}
	// ...and offers peers only what it wrote since its last sync.
	st, err := a.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Stale || st.Synced || len(st.Records) != 1 || st.Records[0].Key != "model/fresh" {
		t.Fatalf("stale snapshot = stale %v synced %v %s", st.Stale, st.Synced, fmtRecords(st.Records))
	}
	sync(a, b)
	if got := keys(b.List()); !slices.Equal(got, []string{"model/fresh", "model/keep"}) {
		t.Fatalf("b after merging stale a lists %v", got)
	}
	// The synced peer settles a: "doomed" was deleted, "fresh" stays.
	sync(b, a)
	if got := keys(a.List()); !slices.Equal(got, []string{"model/fresh", "model/keep"}) {
		t.Fatalf("a after merging synced b lists %v", got)
	}
	if st, _ := a.Snapshot(ctx); st.Stale || !st.Synced {
		t.Fatalf("a still stale after a synced merge")
	}
	if got := keys(newDesired(t, dbA, "a", clk.Now).List()); !slices.Equal(got, []string{"model/fresh", "model/keep"}) {
		t.Fatalf("a after restart lists %v", got)
	}
}

// A lone survivor cannot tell whether it missed deletes, so it keeps its
// tombstones past the TTL: when its peer comes back, the delete still wins.
func TestLoneSurvivorKeepsTombstones(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	dbA := testbolt.OpenTemp(t)
	a := newDesired(t, dbA, "a", clk.Now)
	b := newDesired(t, testbolt.OpenTemp(t), "b", clk.Now)
	if err := b.Put(ctx, modelSpec("doomed")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, p := range [][2]*State{{b, a}, {a, b}} {
			st, _ := p[0].Snapshot(ctx)
			if _, _, err := p[1].MergeFull(ctx, st); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(2 * time.Minute)
	}
	if err := b.Delete(ctx, "model/doomed"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * 24 * time.Hour)
	a = newDesired(t, dbA, "a", clk.Now)
	stB, _ := b.Snapshot(ctx)
	if len(stB.Records) != 1 || !stB.Records[0].Deleted() {
		t.Fatalf("lone b offers %s, want its tombstone", fmtRecords(stB.Records))
	}
	for range 3 {
		stA, _ := a.Snapshot(ctx)
		stB, _ := b.Snapshot(ctx)
		if _, _, err := a.MergeFull(ctx, stB); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.MergeFull(ctx, stA); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Minute + time.Second) // past the stale grace period
	}
	for _, d := range []*State{a, b} {
		if got := d.List(); len(got) != 0 {
			t.Fatalf("deleted spec came back: %v", keys(got))
		}
	}
}

func TestStaleGraceWithOnlyNewPeers(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	db := testbolt.OpenTemp(t)
	st, err := NewBoltStore(db, "desired")
	if err != nil {
		t.Fatal(err)
	}
	s := modelSpec("old")
	rec := Record{Key: s.Key(), TS: Timestamp{Wall: clk.Now().UnixMilli(), Node: "a"}, Spec: &s}
	if err := st.Save(ctx, StoreChange{Put: []Record{rec}, LastSync: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(100 * time.Hour)
	a := newDesired(t, db, "a", clk.Now)
	fresh := newDesired(t, testbolt.OpenTemp(t), "new", clk.Now)
	for range 2 {
		snap, _ := fresh.Snapshot(ctx)
		if _, _, err := a.MergeFull(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if got, _ := a.Snapshot(ctx); !got.Stale || len(got.Records) != 0 {
			t.Fatalf("a left stale mode before the grace period: %+v", got)
		}
		clk.Advance(time.Minute + time.Second)
	}
	snap, _ := fresh.Snapshot(ctx)
	if _, _, err := a.MergeFull(ctx, snap); err != nil {
		t.Fatal(err)
	}
	got, _ := a.Snapshot(ctx)
	if got.Stale || len(got.Records) != 1 {
		t.Fatalf("after the grace period a offers %s (stale %v), want its spec", fmtRecords(got.Records), got.Stale)
	}
}

// randomRecords draws writes to few keys from few nodes, with colliding
// timestamps, so ties and tombstones are common.
func randomRecords(r *rand.Rand, base int64, n int) []Record {
	nodes := []string{"a", "b", "c"}
	names := []string{"k1", "k2", "k3", "k4"}
	revs := []string{"r1", "r2", "r3"}
	out := make([]Record, n)
	for i := range out {
		s := modelSpec(names[r.IntN(len(names))])
		rec := Record{Key: s.Key(), TS: Timestamp{Wall: base + int64(r.IntN(4)), Logical: uint32(r.IntN(2)), Node: nodes[r.IntN(len(nodes))]}}
		if r.IntN(3) > 0 {
			s.Revision = revs[r.IntN(len(revs))]
			rec.Spec = &s
		}
		out[i] = rec
	}
	return out
}

func TestWinnerProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := testclock.New().Now().UnixMilli()
	for i := range 5000 {
		rs := randomRecords(r, base, 3)
		a, b, c := rs[0], rs[1], rs[2+0]
		b.Key, c.Key = a.Key, a.Key // winner compares writes to one key
		if b.Spec != nil {
			s := *b.Spec
			s.Name = a.Key[len("model/"):]
			b.Spec = &s
		}
		if !sameRecord(winner(a, b), winner(b, a)) {
			t.Fatalf("case %d: not commutative: %s vs %s", i, fmtRecords([]Record{a}), fmtRecords([]Record{b}))
		}
		if !sameRecord(winner(a, a), a) {
			t.Fatalf("case %d: not idempotent", i)
		}
		if !sameRecord(winner(winner(a, b), c), winner(a, winner(b, c))) {
			t.Fatalf("case %d: not associative", i)
		}
	}
}

// Any order, with duplicates, of any set of writes gives the same state.
func TestMergeOrderIndependent(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	clk := testclock.New()
	base := clk.Now().UnixMilli()
	db := testbolt.OpenTemp(t)
	for trial := range 30 {
		recs := randomRecords(r, base, 12)
		var want string
		for variant := range 4 {
			st, err := NewBoltStore(db, "t"+string(rune('a'+variant))+string(rune('A'+trial%26))+string(rune('0'+trial/26)))
			if err != nil {
				t.Fatal(err)
			}
			d, err := New(ctx, st, Options{NodeName: "x", Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			in := slices.Clone(recs)
			r.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
			if variant%2 == 1 {
				in = append(in, in[:r.IntN(len(in))]...) // duplicates
			}
			// Deliver in random batches, as broadcasts and push/pulls would.
			for len(in) > 0 {
				k := 1 + r.IntN(len(in))
				if variant == 3 {
					if _, _, err := d.MergeFull(ctx, FullState{Records: in[:k]}); err != nil {
						t.Fatal(err)
					}
				} else if _, _, err := d.Merge(ctx, in[:k]); err != nil {
					t.Fatal(err)
				}
				in = in[k:]
			}
			got := fmtRecords(d.Records())
			// The persisted state matches memory too.
			reloaded, err := New(ctx, st, Options{NodeName: "x", Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			if again := fmtRecords(reloaded.Records()); again != got {
				t.Fatalf("trial %d variant %d: disk %s != memory %s", trial, variant, again, got)
			}
			if variant == 0 {
				want = got
			} else if got != want {
				t.Fatalf("trial %d variant %d:\n got %s\nwant %s", trial, variant, got, want)
			}
		}
	}
}

func TestBoltStoreUnreadableRecordSkipped(t *testing.T) {
	ctx := context.Background()
	db := testbolt.Open(t, filepath.Join(t.TempDir(), "x.db"))
	st, err := NewBoltStore(db, "desired")
	if err != nil {
		t.Fatal(err)
	}
	s := modelSpec("ok")
	clk := testclock.New()
	if err := st.Save(ctx, StoreChange{Put: []Record{{Key: s.Key(), TS: Timestamp{Wall: clk.Now().UnixMilli(), Node: "a"}, Spec: &s}}}); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("desired")).Bucket([]byte("records")).Put([]byte("model/bad"), []byte("{not json"))
	}); err != nil {
		t.Fatal(err)
	}
	d, err := New(ctx, st, Options{NodeName: "a", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(d.List()); !slices.Equal(got, []string{"model/ok"}) {
		t.Fatalf("List = %v", got)
	}
}

// TestWriteKeepsFieldsAnOlderNodeDrops: one write seen twice, once as an
// older node passes it on (without the spec fields it does not know), is
// the full write whatever the order it arrives in.
func TestWriteKeepsFieldsAnOlderNodeDrops(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	full := modelSpec("m")
	full.Pin, full.Priority, full.AppliedBy = true, 3, "file:/etc/caches.yaml"
	stripped := modelSpec("m")
	ts := Timestamp{Wall: clk.Now().UnixMilli(), Node: "n1"}
	for i, order := range [][]spec.Spec{{full, stripped}, {stripped, full}} {
		d := newDesired(t, testbolt.OpenTemp(t), "x", clk.Now)
		for _, s := range order {
			if _, _, err := d.Merge(ctx, []Record{{Key: s.Key(), TS: ts, Spec: &s}}); err != nil {
				t.Fatal(err)
			}
		}
		if got, _ := d.Get(full.Key()); !got.Equal(full) {
			t.Errorf("order %d: holds %+v, want the full write", i, got)
		}
	}
}

// Clocks minutes apart (+5 min, -7 min) keep last-writer-wins sane: an
// edit made later on the node whose clock is behind still wins everywhere,
// no entry is lost, and no node's clock goes backwards.
func TestDesiredSkewedClocks(t *testing.T) {
	ctx := context.Background()
	base := testclock.New()
	skews := []time.Duration{0, 5 * time.Minute, -7 * time.Minute}
	var nodes []*State
	for i, skew := range skews {
		nodes = append(nodes, newDesired(t, testbolt.OpenTemp(t), string(rune('a'+i)), func() time.Time { return base.Now().Add(skew) }))
	}
	exchange := func() {
		t.Helper()
		for _, from := range nodes {
			st, err := from.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, to := range nodes {
				if _, _, err := to.MergeFull(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	last := make([]Timestamp, len(nodes))
	write := func(i int, name, rev string) {
		t.Helper()
		s := modelSpec(name)
		s.Revision = rev
		if err := nodes[i].Put(ctx, s); err != nil {
			t.Fatal(err)
		}
		base.Advance(time.Second)
		r := recordOf(t, nodes[i], s.Key())
		if r.TS.Compare(last[i]) <= 0 {
			t.Fatalf("node %d stamped %+v after %+v: its clock went backwards", i, r.TS, last[i])
		}
		last[i] = r.TS
	}
	// Each node adds a model of its own; the one ahead edits a shared one,
	// then the one behind edits it later in real time.
	for i := range nodes {
		write(i, "own-"+string(rune('a'+i)), "1")
	}
	write(1, "shared", "ahead")
	exchange()
	write(2, "shared", "behind-later")
	exchange()
	write(0, "own-a", "2")
	exchange()
	for i, d := range nodes {
		got, ok := d.Get("model/shared")
		if !ok || got.Revision != "behind-later" {
			t.Errorf("node %d: shared is %q (live %v), want the later edit from the node behind", i, got.Revision, ok)
		}
		if n := len(d.List()); n != 4 {
			t.Errorf("node %d holds %d specs, want 4: %v", i, n, keys(d.List()))
		}
		if d.RefusedFuture() != 0 {
			t.Errorf("node %d refused %d records from clocks minutes apart", i, d.RefusedFuture())
		}
	}
}

func recordOf(t *testing.T, d *State, key string) Record {
	t.Helper()
	for _, r := range d.Records() {
		if r.Key == key {
			return r
		}
	}
	t.Fatalf("no record %q", key)
	return Record{}
}
