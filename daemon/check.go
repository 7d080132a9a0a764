package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// Checking cached files after publish. A published revision is checked
// cheaply (stat only: each file's size, the current link) when the daemon
// starts and at each resync, and fully (every byte re-hashed against the
// digest S3 holds for the recorded object version) on request (Verify). A
// damaged revision is repaired by the reconciler: its damaged files are
// dropped, the revision goes back to staging with its intact files marked
// downloaded, and the cache is not ready until the usual fetch (from peers
// or the origin) has fetched and verified them again.

// wantFiles is what a record says its revision must hold.
func wantFiles(rec cacheRecord) []nvme.WantFile {
	out := make([]nvme.WantFile, len(rec.Files))
	for i, f := range rec.Files {
		out[i] = nvme.WantFile{Path: f.Path, Size: f.Size}
	}
	return out
}

// inspect checks a ready record's published revision cheaply.
func (d *Daemon) inspect(rec cacheRecord) (nvme.Damage, error) {
	return d.store.Inspect(rec.Spec.Name, rec.RevisionID, wantFiles(rec))
}

// checkPublished inspects every ready cache and repairs the damaged ones;
// the daemon runs it at start.
func (d *Daemon) checkPublished() error {
	recs, err := d.state.records()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(recs)) {
		rec := recs[name]
		if rec.State != api.StateReady {
			continue
		}
		dmg, err := d.inspect(rec)
		if err == nil && !dmg.OK() {
			err = d.repair(rec, dmg)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// describeDamage says what is wrong, for the log and the status.
func describeDamage(dmg nvme.Damage) string {
	var parts []string
	if dmg.LinkBroken {
		parts = append(parts, "current link missing or wrong")
	}
	for _, p := range slices.Sorted(maps.Keys(dmg.Files)) {
		parts = append(parts, p+": "+dmg.Files[p])
	}
	return strings.Join(parts, "; ")
}

// repair makes a damaged ready cache not ready and hands it to the
// reconciler: damaged files are dropped (the revision goes back to
// staging, its intact files recorded as downloaded so that only the
// dropped ones are fetched again); a broken link alone is re-made by the
// fetch, which finds the revision still published.
func (d *Daemon) repair(rec cacheRecord, dmg nvme.Damage) error {
	name := rec.Spec.Name
	what := describeDamage(dmg)
	d.log.Warn("cached files damaged: repairing", "model", name, "revision", rec.RevisionID, "damage", what)
	if err := d.swarm.release(name, ""); err != nil {
		d.log.Warn("stop serving damaged revision", "model", name, "err", err)
	}
	if len(dmg.Files) > 0 {
		if err := d.store.Unpublish(name, rec.RevisionID, slices.Collect(maps.Keys(dmg.Files))); err != nil {
			return fmt.Errorf("repair %s: %w", name, err)
		}
		if err := d.state.deleteParts(name, ""); err != nil {
			return fmt.Errorf("repair %s: %w", name, err)
		}
		rec.BytesDone = 0
		for _, f := range rec.Files {
			if _, bad := dmg.Files[f.Path]; bad {
				continue
			}
			var bm bitmap
			for i := range origin.Parts(f.Size, rec.PartSize) {
				bm = bm.with(i)
			}
			if err := d.state.putParts(name, rec.RevisionID, f.Path, bm); err != nil {
				return fmt.Errorf("repair %s: %w", name, err)
			}
			rec.BytesDone += f.Size
		}
	}
	rec.State, rec.Path, rec.Updating = api.StatePending, "", ""
	rec.Error = "damaged, fetching again: " + what
	rec.UpdatedAt = d.now()
	if err := d.state.putRecord(rec); err != nil {
		return fmt.Errorf("repair %s: %w", name, err)
	}
	d.metrics.setState(name, api.StatePending)
	d.metrics.damaged.WithLabelValues(name).Add(float64(max(1, len(dmg.Files))))
	d.metrics.cacheBytes.WithLabelValues(name).Set(float64(rec.BytesDone))
	d.Kick()
	return nil
}

// ErrBusy reports a cache that another verify, or an eviction, holds.
var ErrBusy = errors.New("a verify or an eviction holds this cache")

// ErrNotReady reports a cache with no published revision to check.
var ErrNotReady = errors.New("not ready: nothing published to check")

// Verify re-hashes every file of a ready cache against the digest S3 holds
// for the recorded object version and repairs what does not match (see
// repair). It reads every byte, so it takes as long as reading the model
// from disk; the reconciler does not start a fetch of the cache meanwhile.
func (d *Daemon) Verify(ctx context.Context, name string) (api.VerifyResult, error) {
	rec, found, err := d.state.record(name)
	if err != nil {
		return api.VerifyResult{}, err
	}
	if !found {
		return api.VerifyResult{}, fmt.Errorf("model %q: %w", name, nvme.ErrNotFound)
	}
	// A running fetch (say the one that just made the cache ready, or a
	// resync) is waited for: it may be changing the files.
	for {
		ok, running := d.claim(name, rec.Spec)
		if ok {
			break
		}
		if running == nil {
			return api.VerifyResult{}, fmt.Errorf("verify %s: %w", name, ErrBusy)
		}
		select {
		case <-running.exited:
		case <-ctx.Done():
			return api.VerifyResult{}, fmt.Errorf("verify %s: %w", name, context.Cause(ctx))
		}
	}
	defer d.unclaim(name)
	// Read again under the claim: a fetch may have ended in between.
	if rec, _, err = d.state.record(name); err != nil {
		return api.VerifyResult{}, err
	}
	if rec.State != api.StateReady {
		return api.VerifyResult{}, fmt.Errorf("verify %s (%s): %w", name, rec.State, ErrNotReady)
	}
	res := api.VerifyResult{Name: name, RevisionID: rec.RevisionID, Files: len(rec.Files)}
	dmg, err := d.inspect(rec)
	if err != nil {
		return res, err
	}
	for _, f := range rec.Files {
		if _, bad := dmg.Files[f.Path]; bad {
			continue
		}
		why, err := d.verifyFile(ctx, rec, f, &res)
		if err != nil {
			return res, fmt.Errorf("verify %s: %s: %w", name, f.Path, err)
		}
		if why != "" {
			if dmg.Files == nil {
				dmg.Files = map[string]string{}
			}
			dmg.Files[f.Path] = why
		}
	}
	for _, p := range slices.Sorted(maps.Keys(dmg.Files)) {
		res.Damaged = append(res.Damaged, api.DamagedFile{Path: p, Reason: dmg.Files[p]})
	}
	res.LinkBroken = dmg.LinkBroken
	if dmg.OK() {
		return res, nil
	}
	res.Repairing = true
	return res, d.repair(rec, dmg)
}

// verifyFile re-hashes one intact-looking file; a non-empty answer says how
// it is damaged. A source that changed since is not the file's damage: the
// next resync fetches the new revision.
func (d *Daemon) verifyFile(ctx context.Context, rec cacheRecord, f fileRecord, res *api.VerifyResult) (string, error) {
	src, err := d.store.OpenPublished(rec.Spec.Name, rec.RevisionID, f.Path)
	if err != nil {
		return "", err
	}
	defer src.Close()
	obj, err := objectOf(rec, f)
	if err != nil {
		return "", err
	}
	org, err := d.origins.For(rec.Spec.Source)
	if err != nil {
		return "", err
	}
	v, err := org.Verify(ctx, obj, src)
	switch {
	case errors.Is(err, origin.ErrCorrupt):
		return "content does not match the source's digest", nil
	case errors.Is(err, origin.ErrSourceChanged), errors.Is(err, origin.ErrNotFound):
		res.SourceChanged = append(res.SourceChanged, f.Path)
		return "", nil
	case err != nil:
		return "", err
	case !v.Verified:
		res.Unverifiable = append(res.Unverifiable, api.DamagedFile{Path: f.Path, Reason: v.Detail})
		return "", nil
	}
	res.Checked++
	return "", nil
}

// objectOf is the object version a record's file was fetched from.
func objectOf(rec cacheRecord, f fileRecord) (origin.Object, error) {
	bucket, err := sourceBucket(rec.Spec.Source)
	if err != nil {
		return origin.Object{}, err
	}
	return origin.Object{Bucket: bucket, Key: f.Key, Path: f.Path, Size: f.Size, ETag: f.ETag, VersionID: f.VersionID}, nil
}

// sourceBucket is the Object.Bucket of a source's objects: the S3 bucket,
// or the Hub repository; a torrent's objects need none (their VersionID,
// the info hash, names the torrent).
func sourceBucket(source string) (string, error) {
	if spec.IsTorrentSource(source) {
		_, err := spec.ParseTorrentSource(source)
		return "", err
	}
	if origin.Scheme(source) == "hf" {
		src, err := spec.ParseHFURL(source)
		return src.Repo, err
	}
	src, err := spec.ParseS3URL(source)
	return src.Bucket, err
}

// claim keeps the reconciler from starting a fetch of name while Verify or
// an eviction works on it. It fails when a running fetch holds name
// (running is that fetch; its exited closes when it ends) or another claim
// does (running is nil).
func (d *Daemon) claim(name string, s spec.Spec) (ok bool, running *fetch) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.runningFetch(name); f != nil {
		return false, f
	}
	if _, busy := d.claimed[name]; busy {
		return false, nil
	}
	d.claimed[name] = s
	return true, nil
}

// runningFetch is name's fetch while it may still change its files: nil
// once it has exited, though it may not have left d.fetches yet. With d.mu
// held.
func (d *Daemon) runningFetch(name string) *fetch {
	f := d.fetches[name]
	if f == nil {
		return nil
	}
	select {
	case <-f.exited:
		return nil
	default:
		return f
	}
}

func (d *Daemon) unclaim(name string) {
	d.mu.Lock()
	delete(d.claimed, name)
	d.mu.Unlock()
	d.Kick()
}
