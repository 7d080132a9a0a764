package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/internal/manifest"
)

// applyDir is the state of the watched directory (WatchApplyDir).
type applyDir struct {
	dir  string
	pool string
	// prefix starts the owner of each of its files: "apply-dir:DIR/", or
	// "apply-dir@POOL:DIR/".
	prefix string

	mu    sync.Mutex
	files map[string]api.ApplyFileStatus // by file name
}

// ApplyDirOwner is the owner the watched directory dir of node pool pool
// ("" for none) applies the file name as: each file is its own source, so
// a broken file holds back only its own objects, and a removed file prunes
// only its own. The pool keeps two pools' daemons apart when both mount
// their own ConfigMap at one path: owners are fleet-wide, and without it
// each pool's daemons would take the other's files for removed ones of
// their own and prune them.
func ApplyDirOwner(pool, dir, name string) string {
	if pool == "" {
		return "apply-dir:" + filepath.Join(dir, name)
	}
	return "apply-dir@" + pool + ":" + filepath.Join(dir, name)
}

// ValidatePool checks an --apply-pool name: 1 to 63 lower-case letters,
// digits, '-', '_' or '.', as a label value.
func ValidatePool(pool string) error {
	ok := len(pool) >= 1 && len(pool) <= 63
	for _, r := range pool {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}
	if !ok {
		return fmt.Errorf("pool %q: want 1 to 63 of a-z, 0-9, '-', '_', '.'", pool)
	}
	return nil
}

// WatchApplyDir applies the manifest files of dir (see package manifest)
// at once and then every interval, until ctx ends. dir is typically a
// mounted ConfigMap; pool names the node pool whose daemons mount it ("":
// the whole fleet mounts one). Each file is applied, with prune, as its
// own owner (ApplyDirOwner) whenever its content differs from what this daemon last
// applied from it; a file that went away is pruned. A file that does not
// decode, or names another owner's object, applies nothing and is
// reported in the log, in warmfleet_apply_dir_errors_total and
// warmfleet_apply_dir_files, and in ApplyDirStatus; it is tried again
// each round. Content that was applied is not applied again until it
// changes: while a new ConfigMap version reaches the nodes one by one, a
// node still holding the old one does not undo what the others applied.
func (d *Daemon) WatchApplyDir(ctx context.Context, dir, pool string, interval time.Duration) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("apply dir: %w", err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return fmt.Errorf("apply dir %s: not a directory: %v", abs, err)
	}
	if interval <= 0 {
		return fmt.Errorf("apply dir: interval %v: want > 0", interval)
	}
	if pool != "" {
		if err := ValidatePool(pool); err != nil {
			return fmt.Errorf("apply dir: %w", err)
		}
	}
	ad := &applyDir{dir: abs, pool: pool, prefix: ApplyDirOwner(pool, abs, ""), files: map[string]api.ApplyFileStatus{}}
	if !strings.HasSuffix(ad.prefix, "/") {
		ad.prefix += "/"
	}
	d.applyDirMu.Lock()
	d.applyDir = ad
	d.applyDirMu.Unlock()
	d.log.Info("watching apply dir", "dir", abs, "interval", interval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		d.syncApplyDir(ctx, ad)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ApplyDirStatus reports the watched directory's files.
func (d *Daemon) ApplyDirStatus() api.ApplyDirStatus {
	d.applyDirMu.Lock()
	ad := d.applyDir
	d.applyDirMu.Unlock()
	if ad == nil {
		return api.ApplyDirStatus{}
	}
	ad.mu.Lock()
	defer ad.mu.Unlock()
	st := api.ApplyDirStatus{Dir: ad.dir}
	for _, name := range slices.Sorted(maps.Keys(ad.files)) {
		st.Files = append(st.Files, ad.files[name])
	}
	return st
}

// dirFile is one file's content as read in a round.
type dirFile struct {
	name   string
	data   []byte
	digest string
}

// syncApplyDir is one round: read every file, apply what changed, prune
// what went away.
func (d *Daemon) syncApplyDir(ctx context.Context, ad *applyDir) {
	paths, err := manifest.Files(ad.dir)
	if err != nil {
		d.log.Warn("apply dir: list files", "err", err)
		return
	}
	var files []dirFile
	for _, p := range paths {
		data, err := readBounded(p, manifest.MaxBytes)
		if err != nil {
			// Most likely a ConfigMap update swapping the files under
			// us: the next round reads the new version whole.
			d.log.Debug("apply dir: read file; trying next round", "file", p, "err", err)
			return
		}
		sum := sha256.Sum256(data)
		files = append(files, dirFile{name: filepath.Base(p), data: data, digest: hex.EncodeToString(sum[:])})
	}
	ad.mu.Lock()
	known := maps.Clone(ad.files)
	ad.mu.Unlock()

	// What a round works through: the files that changed or failed last
	// time, and the owners whose file is gone.
	var todo []dirFile
	present := map[string]bool{}
	for _, f := range files {
		present[f.name] = true
		if st, ok := known[f.name]; ok && st.Digest == f.digest && st.Error == "" {
			continue
		}
		todo = append(todo, f)
	}
	gone := map[string]bool{}
	for name := range known {
		if !present[name] {
			gone[name] = true
		}
	}
	for _, owner := range d.owners() {
		// A name with a slash is a file of another directory below this
		// one, which some other daemon watches.
		if name, ok := strings.CutPrefix(owner, ad.prefix); ok && !present[name] && !strings.Contains(name, "/") {
			gone[name] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(gone)) {
		todo = append(todo, dirFile{name: name, data: nil})
	}
	// An object that moves from one file to another is another owner's
	// until the file it left is applied: retry what conflicted while a
	// pass makes progress.
	for len(todo) > 0 {
		var again []dirFile
		for _, f := range todo {
			var conflict *manifest.ConflictError
			if err := d.applyDirFile(ctx, ad, f); errors.As(err, &conflict) {
				again = append(again, f)
			}
		}
		if len(again) == len(todo) {
			break
		}
		todo = again
	}
}

// applyDirFile applies one file's content (data nil: the file is gone)
// and records the outcome.
func (d *Daemon) applyDirFile(ctx context.Context, ad *applyDir, f dirFile) error {
	owner := ApplyDirOwner(ad.pool, ad.dir, f.name)
	req := api.ApplyRequest{Owner: owner, Prune: true}
	var objs []manifest.Object
	err := manifest.ValidateOwner(owner)
	if err == nil && f.data != nil {
		objs, err = manifest.Parse(f.name, f.data)
		req.Specs, req.Endpoints = manifest.Split(objs)
	}
	var res api.ApplyResult
	if err == nil {
		res, err = d.Apply(ctx, req)
	}
	ad.mu.Lock()
	defer ad.mu.Unlock()
	// The metrics move with the status, under one lock: whoever sees the
	// one sees the other.
	defer d.setApplyDirMetricsLocked(ad)
	prev := ad.files[f.name]
	if err == nil && f.data == nil {
		delete(ad.files, f.name)
		if len(res.Changes) > 0 {
			d.log.Info("apply dir: file removed, its objects pruned", "file", f.name, "deleted", len(res.Changes))
		}
		return nil
	}
	st := api.ApplyFileStatus{File: f.name, Owner: owner, Digest: f.digest, AppliedAt: prev.AppliedAt, Objects: prev.Objects}
	if err != nil {
		st.Error = err.Error()
		if prev.Error != st.Error || prev.Digest != st.Digest {
			d.metrics.applyDirErrors.Inc()
			d.log.Error("apply dir: file not applied; nothing of it changed", "file", f.name, "err", err)
		}
	} else {
		st.AppliedAt, st.Objects = d.now(), len(objs)
		if len(res.Changes) > 0 || prev.Error != "" {
			d.log.Info("apply dir: file applied", "file", f.name, "changes", len(res.Changes), "unchanged", res.Unchanged)
		}
	}
	ad.files[f.name] = st
	return err
}

func (d *Daemon) setApplyDirMetricsLocked(ad *applyDir) {
	var bad int
	for _, st := range ad.files {
		if st.Error != "" {
			bad++
		}
	}
	d.metrics.applyDirFiles.WithLabelValues("ok").Set(float64(len(ad.files) - bad))
	d.metrics.applyDirFiles.WithLabelValues("error").Set(float64(bad))
}

// owners lists every AppliedBy of the specs and endpoints this daemon holds.
func (d *Daemon) owners() []string {
	set := map[string]bool{}
	for _, s := range d.desired.List() {
		set[s.AppliedBy] = true
	}
	if eps, err := d.state.endpoints(); err == nil {
		for _, ep := range eps {
			set[ep.AppliedBy] = true
		}
	}
	delete(set, "")
	return slices.Sorted(maps.Keys(set))
}

// readBounded reads a file, at most limit+1 bytes of it: a longer file
// is for the decoder to refuse, never read whole.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit+1))
}
