package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/bytesize"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// Origin is what the daemon needs from where a model's files come from:
// listing, downloads that resume, and, for the swarm, range reads (an origin
// node streams shard ranges) and end-to-end checks of an assembled file.
type Origin = origin.Origin

// RevisionID names a revision's content: the user's label, if any, and a
// digest of every object's path, size, ETag and version, so a changed source
// gets a new directory and never serves stale weights.
func RevisionID(label string, objs []origin.Object) string {
	sorted := append([]origin.Object(nil), objs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	h := sha256.New()
	for _, o := range sorted {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\n", o.Path, o.Size, o.ETag, o.VersionID)
	}
	id := hex.EncodeToString(h.Sum(nil))[:16]
	if label != "" {
		return label + "-" + id
	}
	return id
}

// fetch is one run of caching a model: list, compare, download what is
// missing, verify, publish.
type fetch struct {
	d      *Daemon
	spec   spec.Spec
	log    *slog.Logger
	origin Origin       // the origin of spec's source
	done   atomic.Int64 // bytes complete, for live progress
	cancel context.CancelFunc
	exited chan struct{}

	// Swarm fetches: every shard of the revision, in order, and their
	// origins for the member set last seen (see originRank).
	shards     []swarmShard
	originsMu  sync.Mutex
	originsKey string
	origins    map[string]string
	// bypassed are the members seen holding the revision without serving
	// its shards (see noteBypass): they read nothing from S3 for the
	// fleet, so no shard ranks them as its origin.
	bypassed map[string]bool
	// wasEvicted: the cache was evicted, so this fetch may not evict
	// others (see the capacity rules in evict.go).
	wasEvicted bool
}

// progress reports live bytes done.
func (f *fetch) progress() int64 { return f.done.Load() }

func (f *fetch) run(ctx context.Context) {
	defer close(f.exited)
	start := f.d.now()
	result, err := f.cache(ctx)
	elapsed := f.d.now().Sub(start).Seconds()
	switch {
	case err == nil:
		f.d.releaseRetry(f.spec.Name)
		f.d.metrics.fetches.WithLabelValues(result).Inc()
		if result == "ready" {
			f.d.metrics.downloadTime.WithLabelValues("ready").Observe(elapsed)
		}
	case ctx.Err() != nil:
		f.d.metrics.fetches.WithLabelValues("canceled").Inc()
		f.log.Info("fetch stopped", "reason", context.Cause(ctx))
	default:
		f.d.metrics.fetches.WithLabelValues("failed").Inc()
		f.d.metrics.downloadTime.WithLabelValues("failed").Observe(elapsed)
		if errors.Is(err, origin.ErrCorrupt) {
			f.d.metrics.originCorrupt.WithLabelValues(sourceKind(f.spec.Source)).Inc()
		}
		f.fail(err)
	}
}

func (f *fetch) fail(cause error) {
	rec, _, err := f.d.state.record(f.spec.Name)
	if err != nil {
		f.log.Error("read state", "err", err)
		rec = cacheRecord{Spec: f.spec, State: api.StatePending}
	}
	// A published revision of the same files stays ready and served when
	// re-checking or updating it fails (S3 unreachable, say): only the
	// error is reported, and the attempt retried with backoff.
	keepReady := rec.State == api.StateReady && sameContent(rec.Spec, f.spec) && f.d.store.Published(f.spec.Name, rec.RevisionID)
	rec.Spec = f.spec // same files when keepReady: new targets need no new try
	rec.Space = nil
	if !keepReady {
		rec.State = api.StateFailed
		if se := (*spaceError)(nil); errors.As(cause, &se) {
			rec.State, rec.Space = api.StateInsufficientSpace, &se.SpaceShortage
			if f.wasEvicted {
				rec.State = api.StateEvicted
			}
		}
		// What the attempt left on disk, in finished parts (kept for the
		// retry): the record still says 0 from the attempt's start.
		rec.BytesDone = max(rec.BytesDone, f.progress())
	}
	if held, ok := f.d.heldRetry(f.spec.Name); ok {
		rec.Attempts = max(rec.Attempts, held.Attempts)
	}
	rec.Error, rec.NeedsAction = cause.Error(), needsAction(cause)
	rec.Attempts++
	rec.NextTry = f.d.now().Add(retryDelay(rec.Attempts))
	rec.UpdatedAt = f.d.now()
	if err := f.d.state.putRecord(rec); err != nil {
		// A full disk cannot take the backoff either: keep it in memory, or
		// the loop retries at once, forever.
		f.log.Error("write state", "err", err)
		rec.Error = fmt.Sprintf("%s (and the state cannot be saved: %v)", rec.Error, err)
		f.d.holdRetry(rec)
	} else {
		f.d.releaseRetry(f.spec.Name)
	}
	if !keepReady {
		f.d.metrics.setState(f.spec.Name, rec.State)
	}
	f.log.Warn("fetch failed", "err", cause, "attempts", rec.Attempts, "retry_at", rec.NextTry)
}

// needsAction tells whether a failed attempt's error is one that retrying
// alone will not fix: the source or the credentials must change first.
func needsAction(err error) bool {
	for _, kind := range []error{origin.ErrEmpty, origin.ErrNoSuchBucket, origin.ErrCredentials, origin.ErrNoCredentials,
		origin.ErrAccessDenied, origin.ErrUnsafeKey, origin.ErrNoOrigin} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

// cache returns "ready" after publishing a new revision or "unchanged" when
// the published one still matches the source.
func (f *fetch) cache(ctx context.Context) (string, error) {
	var err error
	if f.origin, err = f.d.origins.For(f.spec.Source); err != nil {
		return "", err
	}
	objs, err := f.origin.List(ctx, f.spec.Source)
	if err != nil {
		return "", err // every origin's List names the listing already
	}
	if objs, err = keepFiles(f.spec, objs); err != nil {
		return "", err
	}
	for _, o := range objs {
		if err := nvme.CheckRelPath(o.Path); err != nil {
			return "", fmt.Errorf("object %q cannot be cached: %w", o.Key, err)
		}
	}
	revision := RevisionID(f.spec.Revision, objs)
	rec, _, err := f.d.state.record(f.spec.Name)
	if err != nil {
		return "", err
	}
	now := f.d.now()
	f.wasEvicted = rec.State == api.StateEvicted
	verdict := judgeListing(rec, f.spec, objs, now)
	if verdict.record {
		rec.Listing, rec.FilesChanged = verdict.listing, verdict.change
		if err := f.d.state.putRecord(rec); err != nil {
			return "", err
		}
	}
	if !verdict.accept {
		return "", fmt.Errorf("%w: %s; waiting for the next listing to agree", errFileSetChanged, describeChange(verdict.change))
	}
	if rec.State == api.StateReady && rec.RevisionID == revision && rec.Spec.Equal(f.spec) && f.d.store.Published(f.spec.Name, revision) {
		// The source is unchanged; the copy must be too (stat only here).
		dmg, err := f.d.inspect(rec)
		if err != nil {
			return "", err
		}
		if dmg.OK() {
			rec.CheckedAt, rec.Error, rec.Attempts, rec.NextTry, rec.NeedsAction = now, "", 0, time.Time{}, false
			return "unchanged", f.d.state.putRecord(rec)
		}
		if err := f.d.repair(rec, dmg); err != nil {
			return "", err
		}
		if rec, _, err = f.d.state.record(f.spec.Name); err != nil {
			return "", err
		}
	}

	files := make([]fileRecord, len(objs))
	var total int64
	for i, o := range objs {
		files[i] = fileRecord{Key: o.Key, Path: o.Path, Size: o.Size, ETag: o.ETag, VersionID: o.VersionID}
		total += o.Size
	}
	if rec.PartSize != f.d.cfg.PartSize || rec.fetching() != revision {
		// Part bitmaps only mean something for the same revision and part size.
		if err := f.d.state.deleteParts(f.spec.Name, ""); err != nil {
			return "", err
		}
	}
	next := cacheRecord{
		Spec: f.spec, RevisionID: revision, State: api.StateDownloading, Files: files,
		PartSize: f.d.cfg.PartSize, BytesTotal: total, Attempts: rec.Attempts, UpdatedAt: now,
		FilesChanged: rec.FilesChanged,
	}
	// A ready revision stays ready, and its path served, while a new one
	// downloads: the record keeps describing it until the new one is ready.
	keepReady := rec.State == api.StateReady && f.d.store.Published(f.spec.Name, rec.RevisionID)
	if keepReady {
		rec.Updating, rec.PartSize, rec.UpdatedAt = revision, f.d.cfg.PartSize, now
		if err := f.d.state.putRecord(rec); err != nil {
			return "", err
		}
	} else {
		if err := f.d.state.putRecord(next); err != nil {
			return "", err
		}
		f.d.metrics.setState(f.spec.Name, api.StateDownloading)
	}
	f.d.metrics.cacheTotal.WithLabelValues(f.spec.Name).Set(float64(total))

	// Content already on disk (an earlier revision came back, maybe still in
	// its grace period): only the current link moves.
	if ok, err := f.publishExisting(revision); ok || err != nil {
		if err != nil {
			return "", err
		}
		f.done.Store(next.BytesTotal)
		return "ready", f.markReady(revision, next, f.d.store.RevisionDir(f.spec.Name, revision))
	}

	stage, err := f.d.store.Stage(f.spec.Name, revision)
	if err != nil {
		return "", err
	}
	defer stage.Close()
	allocated, err := stage.Allocated()
	if err != nil {
		return "", err
	}
	if err := f.d.makeRoom(ctx, total-allocated, f.spec, !f.wasEvicted); err != nil {
		return "", fmt.Errorf("model %s (%s): %w", f.spec.Name, bytesize.Format(total), err)
	}
	f.log.Info("fetching", "revision", revision, "files", len(files), "bytes", total)

	g, gctx := errgroup.WithContext(ctx)
	fetchFile := f.fetchFile
	f.awaitFleet(ctx, allocated > 0)
	viaSwarm, err := f.useSwarm(revision)
	if err != nil {
		return "", err
	}
	if viaSwarm {
		// Every file at once: shards wait on manifests, not on each other.
		fetchFile = f.fetchFileSwarm
		if f.shards, err = planShards(revision, files); err != nil {
			return "", err
		}
		f.log.Info("fetching through the swarm", "shards", len(f.shards))
	} else {
		g.SetLimit(max(1, f.d.cfg.FileConcurrency))
	}
	for i, o := range objs {
		g.Go(func() error { return fetchFile(gctx, stage, revision, o, files[i]) })
	}
	if err := g.Wait(); err != nil {
		return "", err
	}

	if !keepReady {
		f.d.metrics.setState(f.spec.Name, api.StateVerifying)
	}
	path, err := f.d.store.Publish(stage)
	if err != nil {
		return "", err
	}
	if err := f.markReady(revision, next, path); err != nil {
		return "", err
	}
	return "ready", f.d.state.deleteManifests(f.spec.Name, []string{rec.RevisionID, rec.Updating}, revision)
}

// keepFiles keeps the objects the spec's include/exclude patterns ask for.
func keepFiles(s spec.Spec, objs []origin.Object) ([]origin.Object, error) {
	if len(s.Include) == 0 && len(s.Exclude) == 0 {
		return objs, nil
	}
	kept := slices.DeleteFunc(slices.Clone(objs), func(o origin.Object) bool { return !s.Keeps(o.Path) })
	if len(kept) == 0 {
		return nil, fmt.Errorf("list %s: %w: none of its %d files matches include %q / exclude %q", s.Source, origin.ErrEmpty, len(objs), s.Include, s.Exclude)
	}
	return kept, nil
}

// publishExisting makes a revision that is already published current
// again; false means it is not on disk. The check and the link swap happen
// under revMu, so the revision cannot be pruned as it becomes current.
func (f *fetch) publishExisting(revision string) (bool, error) {
	f.d.revMu.Lock()
	defer f.d.revMu.Unlock()
	if !f.d.store.Published(f.spec.Name, revision) {
		return false, nil
	}
	stage, err := f.d.store.Stage(f.spec.Name, revision)
	if err != nil {
		return true, err
	}
	if _, err := f.d.store.Publish(stage); err != nil {
		return true, err
	}
	// After the swap: a crash in between leaves a current revision marked
	// retired, which pruning refuses and forgets, never a lost schedule.
	return true, f.d.state.unretire(f.spec.Name, revision)
}

func (f *fetch) markReady(revision string, rec cacheRecord, path string) error {
	now := f.d.now()
	// The other revisions are retired before the record moves on, so a
	// crash in between resumes this fetch, which retires them again, and
	// never leaves one on disk that nothing would delete.
	if err := f.d.retireOthers(f.spec.Name, revision); err != nil {
		return err
	}
	rec.State, rec.Path, rec.Error, rec.Attempts, rec.Updating = api.StateReady, path, "", 0, ""
	rec.BytesDone, rec.ReadyAt, rec.CheckedAt, rec.UpdatedAt = rec.BytesTotal, now, now, now
	// The gauges move before the record: the API reads the record, and
	// whoever it tells the cache is ready must find the metrics saying so
	// too. Set after, they lagged behind it by the clean-up below.
	f.d.setMetrics(f.spec.Name, rec)
	if err := f.d.state.putRecord(rec); err != nil {
		// The record did not move: neither do the gauges.
		f.d.setStoredMetrics(f.spec.Name)
		return err
	}
	if err := f.d.state.deleteParts(f.spec.Name, ""); err != nil {
		return err
	}
	if err := f.d.pruneRetired(0); err != nil { // with no grace, the old revisions go now
		f.log.Warn("prune old revisions", "err", err)
	}
	if err := f.d.swarm.release(f.spec.Name, revision); err != nil {
		f.log.Warn("stop serving old revisions", "err", err)
	}
	f.log.Info("ready", "revision", revision, "path", path, "bytes", rec.BytesTotal)
	return nil
}

// fetchFile downloads the parts of one object that no earlier run finished,
// recording each finished part so a restart resumes after it.
func (f *fetch) fetchFile(ctx context.Context, stage *nvme.Staging, revision string, obj origin.Object, fr fileRecord) error {
	file, err := stage.OpenFile(fr.Path, fr.Size)
	if err != nil {
		return err
	}
	done, err := f.d.state.parts(f.spec.Name, revision, fr.Path)
	if err != nil {
		return err
	}
	partSize := f.d.cfg.PartSize
	for i := range origin.Parts(fr.Size, partSize) {
		if done.has(i) {
			f.done.Add(min(partSize, fr.Size-int64(i)*partSize))
		}
	}
	// A part counts as done only once its bytes are durable: finished parts
	// are recorded in batches, each after an fsync of the file, so a power
	// loss never leaves a part recorded over bytes that never reached disk.
	var mu sync.Mutex
	var persistErr error
	lastFlush := f.d.now()
	flush := func() { // with mu held
		err := file.Sync()
		if err == nil {
			err = f.d.state.putParts(f.spec.Name, revision, fr.Path, done)
		}
		if err != nil && persistErr == nil {
			persistErr = err
		}
		lastFlush = f.d.now()
	}
	plan := origin.Plan{
		Done: done.has,
		OnPart: func(part int, n int64) {
			f.done.Add(n)
			f.d.metrics.cacheBytes.WithLabelValues(f.spec.Name).Set(float64(f.done.Load()))
			mu.Lock()
			defer mu.Unlock()
			done = done.with(part)
			if f.d.now().Sub(lastFlush) >= partFlushInterval {
				flush()
			}
		},
	}
	dst := &countingFile{File: file, written: func(n int) { f.d.metrics.written.Add(int64(n)) }}
	err = f.origin.Download(ctx, obj, dst, plan)
	mu.Lock()
	defer mu.Unlock()
	if errors.Is(err, origin.ErrCorrupt) {
		// The bytes on disk do not match the source: start this file over.
		done = nil
		if derr := f.d.state.putParts(f.spec.Name, revision, fr.Path, nil); derr != nil {
			err = errors.Join(err, derr)
		}
	} else {
		flush() // keep what finished, also when the download stops half way
	}
	if err != nil {
		return fmt.Errorf("%s: %w", fr.Path, err)
	}
	return persistErr
}

// partFlushInterval is how often finished parts are made durable and
// recorded while a file downloads.
const partFlushInterval = 2 * time.Second

// countingFile counts the bytes written through it.
type countingFile struct {
	origin.File
	written func(int)
}

func (c *countingFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := c.File.WriteAt(p, off)
	c.written(n)
	return n, err
}

// now is the daemon's clock, injectable for tests.
func (d *Daemon) now() time.Time { return d.clock() }

// retireOthers starts the grace period of every published revision of
// name but current, and deletes its abandoned staged downloads at once:
// nobody reads those.
func (d *Daemon) retireOthers(name, current string) error {
	d.revMu.Lock()
	defer d.revMu.Unlock()
	if err := d.store.PruneStaged(name, current); err != nil {
		d.log.Warn("delete abandoned downloads", "model", name, "err", err)
	}
	revs, err := d.store.Revisions(name)
	if err != nil {
		return err
	}
	old := map[string]int64{}
	for _, rev := range revs {
		if rev == current {
			continue
		}
		n, err := d.store.RevisionBytes(name, rev)
		if err != nil {
			// The bytes only rank it for early deletion: still retire it.
			d.log.Warn("measure old revision", "model", name, "revision", rev, "err", err)
		}
		old[rev] = n
	}
	if len(old) == 0 {
		return nil
	}
	if err := d.state.retire(name, old, d.now()); err != nil {
		return err
	}
	// The gauge counts them from now: the new revision is reported ready
	// before any prune pass would count them.
	if all, err := d.state.retired(); err == nil {
		d.setOldBytes(all)
	}
	if d.cfg.OldRevisionGrace > 0 {
		d.log.Info("keeping old revisions for readers", "model", name, "revisions", len(old), "grace", d.cfg.OldRevisionGrace)
	}
	return nil
}

// pruneRetired deletes the retired revisions whose grace has passed and,
// when short > 0, as many more as it takes to free short bytes (see
// pickPrunes).
func (d *Daemon) pruneRetired(short int64) error {
	d.revMu.Lock()
	defer d.revMu.Unlock()
	return d.pruneRetiredLocked(short)
}

func (d *Daemon) pruneRetiredLocked(short int64) error {
	old, err := d.state.retired()
	if err != nil {
		return err
	}
	now := d.now()
	var errs []error
	gone := map[retiredRevision]bool{}
	for _, r := range pickPrunes(old, now, d.cfg.OldRevisionGrace, short) {
		err := d.store.RemoveRevision(r.Model, r.Revision)
		switch {
		case errors.Is(err, nvme.ErrCurrent):
			// Current again (a crash came between publish and unretire).
		case err != nil:
			errs = append(errs, err)
			continue
		default:
			why := "grace over"
			if now.Before(r.RetiredAt.Add(d.cfg.OldRevisionGrace)) {
				why = "space needed"
			}
			d.log.Info("old revision deleted", "model", r.Model, "revision", r.Revision,
				"bytes", r.Bytes, "retired_at", r.RetiredAt, "reason", why)
		}
		if err := d.state.unretire(r.Model, r.Revision); err != nil {
			errs = append(errs, err)
			continue
		}
		gone[r] = true
	}
	if len(gone) > 0 {
		old = slices.DeleteFunc(old, func(r retiredRevision) bool { return gone[r] })
	}
	d.setOldBytes(old)
	return errors.Join(errs...)
}

// setOldBytes publishes the space retired revisions hold, per model.
func (d *Daemon) setOldBytes(old []retiredRevision) {
	byModel := map[string]int64{}
	for _, r := range old {
		byModel[r.Model] += max(0, r.Bytes)
	}
	d.oldBytes.Reset()
	for m, n := range byModel {
		d.oldBytes.WithLabelValues(m).Set(float64(n))
	}
}

// busyVictimWait bounds how long a cache waits for the fetch working on
// its next victim to end (see the capacity rules).
const busyVictimWait = 30 * time.Second

// makeRoom checks that need more bytes fit for the cache s, deleting
// retired revisions first (oldest first, in their grace period or not)
// when they hold the space: kept revisions must never make a download
// fail. When that is not enough it evicts other caches, if mayEvict, by
// the capacity rules (evict.go), or fails with a *spaceError.
func (d *Daemon) makeRoom(ctx context.Context, need int64, s spec.Spec, mayEvict bool) error {
	if need <= 0 {
		return nil
	}
	waitCtx, cancel := context.WithTimeout(ctx, busyVictimWait)
	defer cancel()
	for {
		free, err := d.makeRoomOnce(ctx, need, s, mayEvict)
		if free == nil {
			return err
		}
		select {
		case <-free: // the victim's fetch ended: decide again
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}

// makeRoomOnce is one decision of makeRoom. When the next victim is busy
// it evicts nothing and returns, with the error to report if it stays
// busy, a channel closed when the fetch on it ends; a nil channel when
// only giving up is left.
func (d *Daemon) makeRoomOnce(ctx context.Context, need int64, s spec.Spec, mayEvict bool) (<-chan struct{}, error) {
	select {
	case d.evictSem <- struct{}{}:
		defer func() { <-d.evictSem }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	free, err := d.freeAfterPrunes(need)
	if err != nil {
		return nil, err
	}
	if need <= free {
		// Measured again: a deleted file whose reader still holds it open
		// frees its space only when closed.
		return nil, d.store.CheckFits(need)
	}
	cands, err := d.evictables(s.Name)
	if err != nil {
		return nil, err
	}
	e := pickEvictions(need, free, s.Priority, cands)
	short := api.SpaceShortage{Needed: e.Needed, Free: e.Free, Evictable: e.Evictable}
	if !e.Fits || (!mayEvict && len(e.Victims) > 0) {
		return nil, &spaceError{SpaceShortage: short}
	}
	if e.WaitFor != "" {
		return d.whenIdle(e.WaitFor), &spaceError{SpaceShortage: short, busy: e.WaitFor}
	}
	for _, v := range e.Victims {
		if err := d.evict(v, s.Name); err != nil {
			return nil, fmt.Errorf("evict %s: %w", v, err)
		}
	}
	return nil, d.store.CheckFits(need)
}

// whenIdle returns a channel closed when no fetch works on name: the
// running fetch's own, or a closed one when none runs now. It is nil while
// a Verify works on name, which signals no end.
func (d *Daemon) whenIdle(name string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.fetches[name]; f != nil {
		return f.exited
	}
	if _, ok := d.claimed[name]; ok {
		return nil
	}
	done := make(chan struct{})
	close(done)
	return done
}

// freeAfterPrunes deletes retired revisions when need does not fit and
// returns the space free then, less the reserve.
func (d *Daemon) freeAfterPrunes(need int64) (int64, error) {
	d.revMu.Lock()
	defer d.revMu.Unlock()
	sp, err := d.store.Space()
	if err != nil {
		return 0, err
	}
	if short := need - (sp.Free - d.store.Reserve(sp)); short > 0 {
		if err := d.pruneRetiredLocked(short); err != nil {
			d.log.Warn("delete old revisions for space", "err", err)
		}
		if sp, err = d.store.Space(); err != nil {
			return 0, err
		}
	}
	return sp.Free - d.store.Reserve(sp), nil
}
