package daemon

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/spec"
)

// Capacity rules. A model cache that needs more space than is free (less
// the reserve, after retired revisions went) may evict ready caches of
// this node: never a pinned one, never one of a higher priority than its
// own; of those, the lowest priority first, then the least recently used.
// It evicts only when that makes it fit; otherwise it evicts nothing and
// waits in the insufficient-space state with the numbers. An evicted cache
// stays desired, in the evicted state, and comes back only when it fits
// without evicting anything: two caches that do not fit together never
// take turns. A ready cache that a fetch (a re-check, an update, or the
// end of its own download) or a Verify works on keeps its place in that
// order: when it is next to go, the newcomer waits for that work to end
// (up to busyVictimWait) rather than evict a more recently used cache in
// its place, and then fails the attempt in the insufficient-space state,
// naming it, to try again after its backoff.

// evictable is a ready cache that might make room for another.
type evictable struct {
	Name     string
	Bytes    int64
	Pin      bool
	Priority int
	// LastUsed is the later of when it became ready and when its files
	// were last read (their access time).
	LastUsed time.Time
	// Busy is a cache a fetch or a Verify works on: it is evicted only
	// once that work ends.
	Busy bool
}

// eviction is what pickEvictions decided.
type eviction struct {
	// Victims are the caches to evict, in order; empty when the need fits
	// as it is or cannot fit at all.
	Victims []string
	Fits    bool
	// Needed, Free and Evictable are the numbers behind the decision:
	// Evictable is what the caches this one may evict hold together.
	Needed, Free, Evictable int64
	// WaitFor is the first of the victims that is busy: none may be
	// evicted until it is not.
	WaitFor string
}

// pickEvictions decides which caches to evict so that need bytes fit in
// free, for a cache of the given priority (see the capacity rules).
func pickEvictions(need, free int64, priority int, cands []evictable) eviction {
	e := eviction{Needed: need, Free: free}
	var order []evictable
	for _, c := range cands {
		if !c.Pin && c.Priority <= priority {
			order = append(order, c)
			e.Evictable += max(0, c.Bytes)
		}
	}
	if need <= free {
		e.Fits = true
		return e
	}
	if free+e.Evictable < need {
		return e
	}
	slices.SortFunc(order, func(a, b evictable) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), a.LastUsed.Compare(b.LastUsed), cmp.Compare(a.Name, b.Name))
	})
	freed := int64(0)
	for _, c := range order {
		if free+freed >= need {
			break
		}
		e.Victims = append(e.Victims, c.Name)
		freed += max(0, c.Bytes)
		if c.Busy && e.WaitFor == "" {
			e.WaitFor = c.Name
		}
	}
	e.Fits = true
	return e
}

// spaceError is a cache that does not fit even after evicting what it
// may, or whose next victim stayed busy: its state is insufficient-space
// (or stays evicted).
type spaceError struct {
	api.SpaceShortage
	// busy names the victim that stayed busy, if that is why.
	busy string
}

func (e *spaceError) Error() string {
	msg := fmt.Sprintf("insufficient space: need %s, %s free, %s evictable (unpinned caches of this priority or lower)",
		bytesize.Format(e.Needed), bytesize.Format(e.Free), bytesize.Format(e.Evictable))
	if e.busy != "" {
		msg += fmt.Sprintf("; %s, next to evict, is busy (a fetch or a verify works on it)", e.busy)
	}
	return msg
}

func (e *spaceError) Unwrap() error { return nvme.ErrNoSpace }

// evictables lists the ready caches of this node but keep that another
// may evict, marking those a fetch or a Verify works on as busy.
func (d *Daemon) evictables(keep string) ([]evictable, error) {
	recs, err := d.state.records()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	busy := map[string]bool{}
	for name := range d.fetches {
		if d.runningFetch(name) != nil {
			busy[name] = true
		}
	}
	for name := range d.claimed {
		busy[name] = true
	}
	d.mu.Unlock()
	var out []evictable
	for name, rec := range recs {
		if name == keep || rec.State != api.StateReady || rec.Path == "" {
			continue
		}
		n, err := d.store.RevisionBytes(name, rec.RevisionID)
		if err != nil || n <= 0 {
			n = rec.BytesTotal
		}
		// The desired spec's settings are the current ones: the record's
		// may predate a change of pin or priority.
		s := rec.Spec
		if cur, ok := d.desired.Get(s.Key()); ok {
			s = cur
		}
		out = append(out, evictable{Name: name, Bytes: n, Pin: s.Pin, Priority: s.Priority,
			LastUsed: lastRead(rec.Path, rec.ReadyAt), Busy: busy[name]})
	}
	return out, nil
}

// lastRead is the latest access time of the files under dir, or since
// when that is later. With the usual relatime mount option, a file's first
// read after it was written moves its access time, and later reads at
// most once a day: enough to tell caches in use from forgotten ones.
func lastRead(dir string, since time.Time) time.Time {
	last := since
	_ = fs.WalkDir(os.DirFS(dir), ".", func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return nil
		}
		fi, err := de.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if at := time.Unix(st.Atim.Sec, st.Atim.Nsec); at.After(last) {
				last = at
			}
		}
		return nil
	})
	return last
}

// evict frees a ready cache's space for another: its files go, its record
// stays, in the evicted state, so the loop does not fetch it straight
// back (see the capacity rules). The record moves from ready to evicted in
// one write, and no fetch of it starts meanwhile (it is claimed): when the
// record was deleted and written again, a loop pass in between saw a
// cache with no record, a new one, and fetched it at once, evicting
// others to make it fit.
func (d *Daemon) evict(name, forWhom string) error {
	rec, found, err := d.state.record(name)
	if err != nil || !found {
		return err
	}
	if err := d.claimVictim(name, rec.Spec, forWhom); err != nil {
		return err
	}
	defer d.unclaim(name)
	// Again: a fetch the claim stopped may have written it.
	if rec, found, err = d.state.record(name); err != nil || !found {
		return err
	}
	now := d.now()
	next := cacheRecord{
		Spec: rec.Spec, State: api.StateEvicted, BytesTotal: rec.BytesTotal, UpdatedAt: now,
		Error:    fmt.Sprintf("evicted to make room for %s; comes back when it fits without evicting others", forWhom),
		Attempts: 1, NextTry: now.Add(retryDelay(1)),
	}
	// The record first: a crash before the files go leaves an evicted
	// cache whose revision is still published, which its next attempt
	// makes ready again without a download, never a ready record over
	// deleted files.
	if err := d.state.putRecord(next); err != nil {
		return err
	}
	if err := d.removeFiles(name, rec, true); err != nil {
		return err
	}
	d.releaseRetry(name)
	d.metrics.forget(name)
	d.oldBytes.DeleteLabelValues(name)
	d.metrics.setState(name, api.StateEvicted)
	d.metrics.evictions.Inc()
	d.log.Warn("cache evicted", "model", name, "for", forWhom, "bytes", rec.BytesTotal, "priority", rec.Spec.Priority)
	return nil
}

// claimVictim stops any fetch of name and claims it, as Verify does, so
// the loop starts none until unclaim. It fails with ErrBusy when a Verify
// holds it.
func (d *Daemon) claimVictim(name string, s spec.Spec, forWhom string) error {
	for {
		ok, f := d.claim(name, s)
		if ok {
			return nil
		}
		if f == nil {
			return fmt.Errorf("evict %s: %w", name, ErrBusy)
		}
		f.log.Info("stopping fetch", "reason", "evicted to make room for "+forWhom)
		f.cancel()
		<-f.exited
	}
}
