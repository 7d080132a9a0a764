// Package nvme is the node-local cache store: where cached model revisions
// live on disk, how a download is staged and atomically published, and how
// much space the cache may use.
//
// Layout under the data directory, stable for serving frameworks to point at:
//
//	models/<name>/<revision>/<files as below the S3 prefix>   published, complete, verified
//	models/<name>/current -> <revision>                        symlink to the ready revision
//	partial/<name>/<revision>/...                              downloads in progress
//
// where <name> is the model name with the '/' of "org/model" written "--".
//
// A revision appears under models/ only through a rename of its complete,
// verified staging directory, so a reader can never see a partial revision.
// Inspect checks a published revision cheaply (sizes, the current link);
// Unpublish takes a damaged one back to staging, unlinked, to be repaired.
// Every path below the root is opened through an os.Root, so no object key
// and no planted symlink can reach outside the data directory.
package nvme

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

const (
	modelsDir  = "models"
	partialDir = "partial"
	// CurrentLink is the name of the symlink to a model's ready revision.
	CurrentLink = "current"
)

// ErrNoSpace reports that a cache does not fit in the space the store may use.
var ErrNoSpace = errors.New("not enough space")

// ErrNotFound reports a model or revision that is not in the store.
var ErrNotFound = errors.New("not in the cache")

// Options tune a Store.
type Options struct {
	// ReserveBytes is kept free on the file system for everybody else.
	ReserveBytes int64
	// ReserveFraction of the file system's size is kept free too; the larger
	// of the two reserves applies.
	ReserveFraction float64
	// StatFS reports the file system's space; nil means statfs(2).
	StatFS func(path string) (Space, error)
}

// Store is the cache directory of one node.
type Store struct {
	dir    string
	root   *os.Root
	opts   Options
	statFS func(string) (Space, error)
}

// Open opens (creating if needed) the store rooted at dir.
func Open(dir string, opts Options) (*Store, error) {
	if opts.ReserveBytes < 0 || !(opts.ReserveFraction >= 0 && opts.ReserveFraction < 1) { // NaN too
		return nil, fmt.Errorf("nvme: reserve must be >= 0 bytes and a fraction in [0, 1)")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("nvme: data dir %q: %w", dir, err)
	}
	for _, d := range []string{abs, filepath.Join(abs, modelsDir), filepath.Join(abs, partialDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("nvme: %w", err)
		}
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("nvme: %w", err)
	}
	s := &Store{dir: abs, root: root, opts: opts, statFS: opts.StatFS}
	if s.statFS == nil {
		s.statFS = statFS
	}
	return s, nil
}

// Close releases the store's directory handle.
func (s *Store) Close() error { return s.root.Close() }

// Dir is the absolute data directory.
func (s *Store) Dir() string { return s.dir }

// ModelDir is where a model's revisions and current link live.
func (s *Store) ModelDir(name string) string { return filepath.Join(s.dir, modelsDir, dirName(name)) }

// RevisionDir is where a published revision lives.
func (s *Store) RevisionDir(name, revision string) string {
	return filepath.Join(s.dir, modelsDir, dirName(name), revision)
}

// Current returns the revision the model's current link points at.
func (s *Store) Current(name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	target, err := s.root.Readlink(filepath.Join(modelsDir, dirName(name), CurrentLink))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("model %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("nvme: %w", err)
	}
	if CheckRevision(target) != nil {
		return "", fmt.Errorf("nvme: model %q: current link points outside the model (%q)", name, target)
	}
	return target, nil
}

// Published reports whether a revision is published. An invalid name or
// revision is never published (".." would otherwise find models/ itself).
func (s *Store) Published(name, revision string) bool {
	if CheckName(name) != nil || CheckRevision(revision) != nil {
		return false
	}
	st, err := s.root.Stat(filepath.Join(modelsDir, dirName(name), revision))
	return err == nil && st.IsDir()
}

// Stage opens the staging area of a revision, creating it if needed; what an
// earlier, interrupted download left there is kept so it can resume.
func (s *Store) Stage(name, revision string) (*Staging, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := CheckRevision(revision); err != nil {
		return nil, err
	}
	rel := filepath.Join(partialDir, dirName(name), revision)
	if err := s.root.MkdirAll(rel, 0o755); err != nil {
		return nil, fmt.Errorf("nvme: staging %s: %w", rel, err)
	}
	sub, err := s.root.OpenRoot(rel)
	if err != nil {
		return nil, fmt.Errorf("nvme: staging %s: %w", rel, err)
	}
	return &Staging{store: s, name: name, revision: revision, rel: rel, root: sub}, nil
}

// Publish makes a staged revision the model's current one: the staging
// directory is renamed into models/ (atomic on one file system) and the
// current link is swapped by renaming a new link over it. Call it only when
// every file is complete and verified.
func (s *Store) Publish(st *Staging) (string, error) {
	if err := st.syncAll(); err != nil {
		return "", err
	}
	if err := st.root.Close(); err != nil {
		return "", fmt.Errorf("nvme: %w", err)
	}
	modelRel := filepath.Join(modelsDir, dirName(st.name))
	if err := s.root.MkdirAll(modelRel, 0o755); err != nil {
		return "", fmt.Errorf("nvme: %w", err)
	}
	final := filepath.Join(modelRel, st.revision)
	if s.Published(st.name, st.revision) {
		// The same content was published before (the revision names its
		// content): keep the published copy and drop the staged one.
		if err := s.root.RemoveAll(st.rel); err != nil {
			return "", fmt.Errorf("nvme: %w", err)
		}
	} else if err := s.root.Rename(st.rel, final); err != nil {
		return "", fmt.Errorf("nvme: publish %s: %w", final, err)
	}
	// POSIX makes a new directory entry durable only once its parent is
	// synced: models/ holds the model's directory (created above for a first
	// revision), partial/<model> lost the staged one. ext4's journal happens
	// to commit both with the fsync below; other file systems need not.
	for _, dir := range []string{modelsDir, filepath.Dir(st.rel)} {
		if err := syncDir(filepath.Join(s.dir, dir)); err != nil {
			return "", err
		}
	}
	tmpLink := filepath.Join(modelRel, ".current.tmp")
	_ = s.root.Remove(tmpLink)
	if err := s.root.Symlink(st.revision, tmpLink); err != nil {
		return "", fmt.Errorf("nvme: %w", err)
	}
	if err := s.root.Rename(tmpLink, filepath.Join(modelRel, CurrentLink)); err != nil {
		return "", fmt.Errorf("nvme: swap current link: %w", err)
	}
	if err := syncDir(filepath.Join(s.dir, modelRel)); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, final), nil
}

// Remove deletes a model: its current link, every revision and any staged
// download, freeing the space.
func (s *Store) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	var errs []error
	for _, base := range []string{modelsDir, partialDir} {
		if err := s.root.RemoveAll(filepath.Join(base, dirName(name))); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nvme: remove %s: %w", name, err)
	}
	return nil
}

// PruneStaged deletes a model's staged downloads other than keep's: once a
// revision is published, a half-downloaded other one is abandoned.
func (s *Store) PruneStaged(name, keep string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	dir := filepath.Join(partialDir, dirName(name))
	entries, err := fs.ReadDir(s.root.FS(), dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nvme: prune %s: %w", name, err)
	}
	var errs []error
	for _, e := range entries {
		if e.Name() == keep || !e.IsDir() {
			continue
		}
		if err := s.root.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nvme: prune %s: %w", name, err)
	}
	return nil
}

// ErrCurrent reports an attempt to delete the revision a model's current
// link points at.
var ErrCurrent = errors.New("is the current revision")

// Revisions lists a model's published revisions, the current one included.
func (s *Store) Revisions(name string) ([]string, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(s.root.FS(), filepath.Join(modelsDir, dirName(name)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nvme: list %s: %w", name, err)
	}
	var revs []string
	for _, e := range entries {
		if e.IsDir() && CheckRevision(e.Name()) == nil {
			revs = append(revs, e.Name())
		}
	}
	return revs, nil
}

// RemoveRevision deletes one published revision of a model. The current
// revision is refused (ErrCurrent): only a model's removal takes it. A
// revision that is not there is no error. Readers that still hold its files
// open keep reading them; the space is freed when they close them.
func (s *Store) RemoveRevision(name, revision string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if err := CheckRevision(revision); err != nil {
		return err
	}
	cur, err := s.Current(name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	if err == nil && cur == revision {
		return fmt.Errorf("nvme: remove %s revision %s: %w", name, revision, ErrCurrent)
	}
	if err := s.root.RemoveAll(filepath.Join(modelsDir, dirName(name), revision)); err != nil {
		return fmt.Errorf("nvme: remove %s revision %s: %w", name, revision, err)
	}
	return nil
}

// RevisionBytes reports the space a published revision's files take on
// disk (allocated blocks, as the file system counts them).
func (s *Store) RevisionBytes(name, revision string) (int64, error) {
	if err := CheckName(name); err != nil {
		return 0, err
	}
	if err := CheckRevision(revision); err != nil {
		return 0, err
	}
	return allocatedUnder(s.root.FS(), filepath.Join(modelsDir, dirName(name), revision))
}

// Models lists the published models (those with a current link).
func (s *Store) Models() ([]string, error) {
	entries, err := fs.ReadDir(s.root.FS(), modelsDir)
	if err != nil {
		return nil, fmt.Errorf("nvme: list: %w", err)
	}
	var names []string
	for _, e := range entries {
		name := nameOfDir(e.Name())
		if !e.IsDir() || CheckName(name) != nil {
			continue
		}
		if _, err := s.root.Lstat(filepath.Join(modelsDir, e.Name(), CurrentLink)); err == nil {
			names = append(names, name)
		}
	}
	return names, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("nvme: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("nvme: sync %s: %w", dir, err)
	}
	return nil
}

// allocatedUnder sums the allocated blocks of the files below dir.
func allocatedUnder(fsys fs.FS, dir string) (int64, error) {
	var total int64
	err := fs.WalkDir(fsys, dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			total += sys.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("nvme: %w", err)
	}
	return total, nil
}

// WantFile is a file a published revision must hold: its path below the
// revision and its size.
type WantFile struct {
	Path string
	Size int64
}

// Damage is what Inspect found wrong with a published revision.
type Damage struct {
	// LinkBroken is true when the current link is missing or points at
	// another revision.
	LinkBroken bool
	// Files maps each damaged file's path to what is wrong with it.
	Files map[string]string
}

// OK reports whether nothing was found wrong.
func (d Damage) OK() bool { return !d.LinkBroken && len(d.Files) == 0 }

// Inspect checks, cheaply (stat only, no reading), that revision is the
// model's current one and holds files at their sizes: what a deleted or
// truncated file or a deleted link breaks. A changed byte needs a re-hash.
func (s *Store) Inspect(name, revision string, files []WantFile) (Damage, error) {
	if err := CheckName(name); err != nil {
		return Damage{}, err
	}
	if err := CheckRevision(revision); err != nil {
		return Damage{}, err
	}
	var dmg Damage
	// A link pointing outside the model is as broken as a missing one.
	cur, err := s.Current(name)
	dmg.LinkBroken = err != nil || cur != revision
	dir := filepath.Join(modelsDir, dirName(name), revision)
	for _, f := range files {
		if err := CheckRelPath(f.Path); err != nil {
			return Damage{}, err
		}
		why := ""
		st, err := s.root.Lstat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			why = "missing"
		case err != nil:
			why = err.Error()
		case !st.Mode().IsRegular():
			why = "not a regular file (" + st.Mode().Type().String() + ")"
		case st.Size() != f.Size:
			why = fmt.Sprintf("size %d, want %d", st.Size(), f.Size)
		}
		if why != "" {
			if dmg.Files == nil {
				dmg.Files = map[string]string{}
			}
			dmg.Files[f.Path] = why
		}
	}
	return dmg, nil
}

// OpenPublished opens a file of a published revision for reading.
func (s *Store) OpenPublished(name, revision, relPath string) (*os.File, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := CheckRevision(revision); err != nil {
		return nil, err
	}
	if err := CheckRelPath(relPath); err != nil {
		return nil, err
	}
	f, err := openOwn(s.root, filepath.Join(modelsDir, dirName(name), revision, filepath.FromSlash(relPath)), os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("nvme: %w", err)
	}
	return f, nil
}

// Unpublish takes a damaged revision back to staging so that its damaged
// files can be fetched again: the current link goes (readers must not open
// a revision known to be damaged), the revision directory moves to
// partial/, replacing any staged copy, and the files in drop are deleted
// there. The intact files stay, so a resumed download only re-reads them.
func (s *Store) Unpublish(name, revision string, drop []string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if err := CheckRevision(revision); err != nil {
		return err
	}
	for _, p := range drop {
		if err := CheckRelPath(p); err != nil {
			return err
		}
	}
	modelRel := filepath.Join(modelsDir, dirName(name))
	if cur, err := s.Current(name); err == nil && cur == revision || err != nil && !errors.Is(err, ErrNotFound) {
		if err := s.root.Remove(filepath.Join(modelRel, CurrentLink)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("nvme: unpublish %s: %w", name, err)
		}
	}
	stageRel := filepath.Join(partialDir, dirName(name), revision)
	if err := s.root.RemoveAll(stageRel); err != nil {
		return fmt.Errorf("nvme: unpublish %s: %w", name, err)
	}
	if err := s.root.MkdirAll(filepath.Dir(stageRel), 0o755); err != nil {
		return fmt.Errorf("nvme: unpublish %s: %w", name, err)
	}
	err := s.root.Rename(filepath.Join(modelRel, revision), stageRel)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("nvme: unpublish %s: %w", name, err)
	}
	for _, p := range drop {
		if err := s.root.RemoveAll(filepath.Join(stageRel, filepath.FromSlash(p))); err != nil {
			return fmt.Errorf("nvme: unpublish %s: %w", name, err)
		}
	}
	return nil
}
