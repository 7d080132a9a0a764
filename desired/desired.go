package desired

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmfleet/warmfleet/spec"
)

// ErrNotFound is returned by Delete when the key holds no live spec.
var ErrNotFound = errors.New("spec not found")

// Options configures a State.
type Options struct {
	// NodeName breaks ties between writes made in the same millisecond.
	NodeName string
	// Now is the wall clock; time.Now when nil.
	Now func() time.Time
	// TombstoneTTL is how long a delete is remembered. It must be much longer
	// than the anti-entropy period and than a normal node outage: a node that
	// was out of touch for longer comes back in stale mode (see
	// State). Default 72h.
	TombstoneTTL time.Duration
	// StaleGrace ends stale mode when only unsynced peers were seen for this
	// long (a fleet rebuilt from scratch has no synced peer). Default 2m.
	StaleGrace time.Duration
	// MaxClockDrift bounds how far ahead of our wall clock a peer's timestamp
	// may pull our clock. Default 1m.
	MaxClockDrift time.Duration
	// MaxFuture bounds how far ahead of our wall clock a peer's record may
	// be stamped and still be merged; a record further ahead is refused
	// and counted (RefusedFuture), and merged by anti-entropy once our
	// clock is within the bound. Without it, one node whose clock says
	// year 9999 would stamp records no later write could beat without
	// moving its own clock there, and every node editing such a key would
	// carry that clock to its other keys. It must be far above the skew
	// of healthy clocks (minutes) and at least MaxClockDrift. Default 1h.
	MaxFuture time.Duration
	Logger    *slog.Logger
}

// State is the fleet-wide set of cache specs: a last-writer-wins map
// from spec key to the latest write (a spec or a tombstone), persisted in a
// Store. It is safe for concurrent use.
//
// Deletes are tombstones kept for TombstoneTTL, then forgotten. Forgetting is
// what could resurrect a deleted spec: a node that was out of touch for
// longer than the TTL still holds the spec live, and its peers no longer hold
// the tombstone that would beat it. So a node whose last full sync with a
// synced peer is older than the TTL enters stale mode: it keeps serving its
// specs locally, keeps its own tombstones, but stops offering its old live
// records to peers. The first full state it merges from a synced peer
// settles it: its old records that the peer does not hold were deleted and
// are dropped; records it wrote since its last sync are kept. If it sees only
// unsynced peers for StaleGrace (the whole fleet is new), it trusts itself
// again. The remaining hole is a node that holds a spec, the whole rest of the
// fleet deleting it and forgetting the tombstone, and that node then meeting
// only unsynced peers for StaleGrace: rare enough to accept, and the
// reason TombstoneTTL defaults to days.
type State struct {
	store  Store
	clock  *hlc
	now    func() time.Time
	ttl    time.Duration
	grace  time.Duration
	future time.Duration
	// refused counts peer records refused for a timestamp beyond future.
	refused atomic.Uint64
	log     *slog.Logger
	changed chan struct{}

	mu        sync.Mutex
	recs      map[string]Record
	lastSync  time.Time // last full merge from a synced peer; zero: never
	savedSync time.Time // lastSync as last persisted
	// staleSince is when stale mode started; zero when not stale.
	staleSince time.Time
	// stalePeerSeen is when stale mode first met an unsynced peer.
	stalePeerSeen time.Time
	// onLocal is called, under mu, with every record this node writes, so
	// that a Node broadcasts writes in the order they were made.
	onLocal func(Record)
}

// New loads the state saved in store.
func New(ctx context.Context, store Store, opt Options) (*State, error) {
	if store == nil {
		return nil, errors.New("desired state: store is required")
	}
	if err := ValidateNodeName(opt.NodeName); err != nil {
		return nil, fmt.Errorf("desired state: %w", err)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.TombstoneTTL <= 0 {
		opt.TombstoneTTL = 72 * time.Hour
	}
	if opt.StaleGrace <= 0 {
		opt.StaleGrace = 2 * time.Minute
	}
	if opt.MaxClockDrift <= 0 {
		opt.MaxClockDrift = time.Minute
	}
	if opt.MaxFuture <= 0 {
		opt.MaxFuture = time.Hour
	}
	if opt.MaxFuture < opt.MaxClockDrift {
		return nil, fmt.Errorf("desired state: max future %v is below the max clock drift %v", opt.MaxFuture, opt.MaxClockDrift)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	d := &State{
		store:   store,
		clock:   newHLC(opt.NodeName, opt.Now, opt.MaxClockDrift),
		now:     opt.Now,
		ttl:     opt.TombstoneTTL,
		future:  opt.MaxFuture,
		grace:   opt.StaleGrace,
		log:     opt.Logger,
		changed: make(chan struct{}, 1),
		recs:    map[string]Record{},
	}
	st, err := store.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("desired state: %w", err)
	}
	for _, r := range st.Records {
		if err := r.validate(); err != nil {
			d.log.Warn("desired state: skipping unreadable saved record", "key", r.Key, "err", err)
			continue
		}
		// Our own saved writes may be ahead of a wall clock that went back:
		// the clock must still move forward from them. No drift bound here.
		d.clock.mu.Lock()
		if r.TS.Wall > d.clock.wall || (r.TS.Wall == d.clock.wall && r.TS.Logical > d.clock.logical) {
			d.clock.wall, d.clock.logical = r.TS.Wall, r.TS.Logical
		}
		d.clock.mu.Unlock()
		d.recs[r.Key] = r
	}
	d.lastSync, d.savedSync = st.LastSync, st.LastSync
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checkStaleLocked(d.now())
	if err := d.gcLocked(ctx, d.now()); err != nil {
		return nil, fmt.Errorf("desired state: %w", err)
	}
	return d, nil
}

// Changed returns the channel that receives a value after the set of live
// specs changed. It has capacity one and coalesces: one consumer should
// drain it and then call List.
func (d *State) Changed() <-chan struct{} { return d.changed }

func (d *State) notify() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// Put sets a spec, replacing any earlier spec with the same key. Putting a
// spec equal to the live one changes nothing.
func (d *State) Put(ctx context.Context, s spec.Spec) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("invalid spec: %w", err)
	}
	s = cloneSpec(s)
	key := s.Key()
	d.mu.Lock()
	defer d.mu.Unlock()
	old, had := d.recs[key]
	if had && !old.Deleted() && old.Spec.Equal(s) {
		return nil
	}
	return d.writeLocked(ctx, Record{Key: key, TS: d.clock.next(old.TS), Spec: &s})
}

// Delete removes the spec with the given key (spec.Spec.Key).
func (d *State) Delete(ctx context.Context, key string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	old, had := d.recs[key]
	if !had || old.Deleted() {
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	return d.writeLocked(ctx, Record{Key: key, TS: d.clock.next(old.TS)})
}

func (d *State) writeLocked(ctx context.Context, r Record) error {
	if err := d.store.Save(ctx, StoreChange{Put: []Record{r}}); err != nil {
		return err
	}
	d.recs[r.Key] = r
	d.notify()
	if d.onLocal != nil {
		d.onLocal(r)
	}
	return nil
}

// Get returns the live spec with the given key.
func (d *State) Get(key string) (spec.Spec, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.recs[key]
	if !ok || r.Deleted() {
		return spec.Spec{}, false
	}
	return cloneSpec(*r.Spec), true
}

// Writer returns the node that wrote the live spec with the given key:
// the one that asked for it, which most likely holds it or is fetching it.
func (d *State) Writer(key string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.recs[key]
	if !ok || r.Deleted() {
		return "", false
	}
	return r.TS.Node, true
}

// List returns the live specs sorted by key.
func (d *State) List() []spec.Spec {
	d.mu.Lock()
	out := make([]spec.Spec, 0, len(d.recs))
	for _, r := range d.recs {
		if !r.Deleted() {
			out = append(out, cloneSpec(*r.Spec))
		}
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b spec.Spec) int { return cmp.Compare(a.Key(), b.Key()) })
	return out
}

// Records returns every record, tombstones included, sorted by key.
func (d *State) Records() []Record {
	d.mu.Lock()
	out := make([]Record, 0, len(d.recs))
	for _, r := range d.recs {
		out = append(out, cloneRecord(r))
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// SetOnLocal installs the hook that sees every local write.
func (d *State) SetOnLocal(f func(Record)) {
	d.mu.Lock()
	d.onLocal = f
	d.mu.Unlock()
}

// FullState is what this node offers in a push/pull.
type FullState struct {
	Records []Record
	// Stale: old live records are withheld, so absence proves nothing.
	Stale bool
	// Synced: this node merged a full state from a synced peer since it last
	// was stale, so it holds every live spec and every unexpired tombstone.
	Synced bool
}

// Snapshot returns the state to offer peers, after expiring tombstones.
func (d *State) Snapshot(ctx context.Context) (FullState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	d.checkStaleLocked(now)
	if err := d.gcLocked(ctx, now); err != nil {
		return FullState{}, err
	}
	st := FullState{Stale: !d.staleSince.IsZero()}
	st.Synced = !st.Stale && !d.lastSync.IsZero()
	horizon := d.lastSync.UnixMilli()
	for _, r := range d.recs {
		if st.Stale && !r.Deleted() && r.TS.Wall <= horizon {
			continue
		}
		st.Records = append(st.Records, cloneRecord(r))
	}
	slices.SortFunc(st.Records, func(a, b Record) int { return cmp.Compare(a.Key, b.Key) })
	return st, nil
}

// Merge applies records from a peer and returns those that changed our
// state (to pass on). Invalid records are skipped and counted in bad.
func (d *State) Merge(ctx context.Context, in []Record) (applied []Record, bad int, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	applied, bad = d.mergeLocked(in)
	if len(applied) == 0 {
		return nil, bad, nil
	}
	if err := d.store.Save(ctx, StoreChange{Put: applied}); err != nil {
		return nil, bad, err
	}
	for _, r := range applied {
		d.recs[r.Key] = r
	}
	d.notify()
	return applied, bad, nil
}

// RefusedFuture returns how many peer records were refused so far because
// their timestamp was further ahead of this node's clock than MaxFuture:
// one of the two clocks is wrong by that much.
func (d *State) RefusedFuture() uint64 { return d.refused.Load() }

// mergeLocked decides which incoming records win, without applying them.
func (d *State) mergeLocked(in []Record) (applied []Record, bad int) {
	pending := map[string]int{}
	limit := d.now().Add(d.future).UnixMilli()
	for _, r := range in {
		if err := r.validate(); err != nil {
			bad++
			continue
		}
		if r.TS.Wall > limit {
			if d.refused.Add(1) == 1 {
				d.log.Warn("desired state: refusing a record stamped too far in the future (a clock is wrong); counting the next ones silently",
					"key", r.Key, "writer", r.TS.Node, "stamp", r.TS.Time(), "max_future", d.future)
			}
			continue
		}
		d.clock.observe(r.TS)
		cur, had := d.recs[r.Key]
		if i, ok := pending[r.Key]; ok {
			cur, had = applied[i], true
		}
		if had && sameRecord(winner(cur, r), cur) {
			continue
		}
		r = cloneRecord(r)
		if i, ok := pending[r.Key]; ok {
			applied[i] = r
		} else {
			pending[r.Key] = len(applied)
			applied = append(applied, r)
		}
	}
	return applied, bad
}

// MergeFull applies a peer's full state (push/pull) and settles stale mode.
func (d *State) MergeFull(ctx context.Context, st FullState) (applied []Record, bad int, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	d.checkStaleLocked(now)
	applied, bad = d.mergeLocked(st.Records)
	var drop []string
	change := StoreChange{Put: applied}
	switch {
	case !d.staleSince.IsZero() && st.Synced:
		// The peer holds every live spec: our old ones it lacks were deleted
		// while we were away, and their tombstones have expired since.
		has := make(map[string]bool, len(st.Records))
		for _, r := range st.Records {
			has[r.Key] = true
		}
		horizon := d.lastSync.UnixMilli()
		for k, r := range d.recs {
			if !has[k] && !r.Deleted() && r.TS.Wall <= horizon {
				drop = append(drop, k)
			}
		}
		change.Delete = drop
		change.LastSync = now
	case !d.staleSince.IsZero():
		if d.stalePeerSeen.IsZero() {
			d.stalePeerSeen = now
		}
		if now.Sub(d.stalePeerSeen) >= d.grace {
			change.LastSync = now
		}
	case !st.Stale:
		// Rate-limit the disk write of the sync time: a minute of error is
		// nothing next to a TTL of days.
		if now.Sub(d.savedSync) >= time.Minute {
			change.LastSync = now
		}
	}
	if len(change.Put) > 0 || len(change.Delete) > 0 || !change.LastSync.IsZero() {
		if err := d.store.Save(ctx, change); err != nil {
			return nil, bad, err
		}
	}
	for _, r := range applied {
		d.recs[r.Key] = r
	}
	for _, k := range drop {
		d.log.Info("desired state: dropping spec deleted while this node was away", "key", k)
		delete(d.recs, k)
	}
	switch {
	case !change.LastSync.IsZero():
		d.lastSync, d.savedSync = change.LastSync, change.LastSync
		if !d.staleSince.IsZero() {
			d.log.Info("desired state: stale mode ended", "stale_since", d.staleSince, "dropped", len(drop))
		}
		d.staleSince, d.stalePeerSeen = time.Time{}, time.Time{}
	case d.staleSince.IsZero() && !st.Stale:
		d.lastSync = now
	}
	if len(applied) > 0 || len(drop) > 0 {
		d.notify()
	}
	return applied, bad, nil
}

// checkStaleLocked enters stale mode when the last sync is too old.
func (d *State) checkStaleLocked(now time.Time) {
	if d.staleSince.IsZero() && !d.lastSync.IsZero() && now.Sub(d.lastSync) > d.ttl {
		d.staleSince = now
		d.log.Warn("desired state: no full sync with a peer for longer than the tombstone TTL; withholding old specs until one", "last_sync", d.lastSync, "ttl", d.ttl)
	}
}

// gcLocked forgets expired tombstones. A stale node keeps them: it may be
// the only one left that remembers a delete.
func (d *State) gcLocked(ctx context.Context, now time.Time) error {
	if !d.staleSince.IsZero() {
		return nil
	}
	var expired []string
	cutoff := now.Add(-d.ttl).UnixMilli()
	for k, r := range d.recs {
		if r.Deleted() && r.TS.Wall < cutoff {
			expired = append(expired, k)
		}
	}
	if len(expired) == 0 {
		return nil
	}
	if err := d.store.Save(ctx, StoreChange{Delete: expired}); err != nil {
		return err
	}
	for _, k := range expired {
		delete(d.recs, k)
	}
	return nil
}
