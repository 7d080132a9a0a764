package nvme

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// Staging is a revision being downloaded. Files are created at their final
// relative paths, preallocated to their full size, and written in place, so
// publishing is one rename.
type Staging struct {
	store    *Store
	name     string
	revision string
	rel      string
	root     *os.Root

	mu    sync.Mutex
	files []*os.File
}

// Dir is the staging directory's absolute path.
func (st *Staging) Dir() string { return filepath.Join(st.store.dir, st.rel) }

// Name and Revision identify what is being staged.
func (st *Staging) Name() string     { return st.name }
func (st *Staging) Revision() string { return st.revision }

// OpenFile opens (creating if needed) a file of the revision for writing at
// any offset, preallocated to size so that a full disk fails now, with a
// clear error, rather than in the middle of a download. Content from an
// earlier attempt is kept. The caller must not close the file; Close or
// Publish does.
func (st *Staging) OpenFile(relPath string, size int64) (*os.File, error) {
	if err := CheckRelPath(relPath); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, fmt.Errorf("file %q: negative size %d", relPath, size)
	}
	if dir := filepath.Dir(relPath); dir != "." {
		if err := st.root.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("nvme: %s: %w", relPath, err)
		}
	}
	f, err := openOwn(st.root, relPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nvme: %s: %w", relPath, err)
	}
	if err := preallocate(f, size); err != nil {
		f.Close()
		return nil, fmt.Errorf("nvme: %s: %w", relPath, err)
	}
	st.mu.Lock()
	st.files = append(st.files, f)
	st.mu.Unlock()
	return f, nil
}

// Allocated reports the bytes already on disk for the revision's files, so
// a resumed download asks for only what it still needs.
func (st *Staging) Allocated() (int64, error) {
	return allocatedUnder(st.root.FS(), ".")
}

// Close closes the staging's files without publishing; the staged content
// stays for a later resume.
func (st *Staging) Close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var errs []error
	for _, f := range st.files {
		errs = append(errs, f.Close())
	}
	st.files = nil
	errs = append(errs, st.root.Close())
	if err := errors.Join(errs...); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("nvme: %w", err)
	}
	return nil
}

// syncAll makes every file durable and closes it before the rename, then
// every directory of the revision: a file's data is durable after its
// fsync, but its name only after its directory's, so without them a crash
// after publishing could leave a ready revision with files missing.
func (st *Staging) syncAll() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var errs []error
	for _, f := range st.files {
		if err := f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", f.Name(), err))
		}
		errs = append(errs, f.Close())
	}
	st.files = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nvme: %w", err)
	}
	return st.syncDirs()
}

// syncDirs fsyncs every directory under the staging root, the root too.
func (st *Staging) syncDirs() error {
	return fs.WalkDir(st.root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		dir, err := st.root.Open(path)
		if err != nil {
			return fmt.Errorf("nvme: %w", err)
		}
		defer dir.Close()
		if err := dir.Sync(); err != nil {
			return fmt.Errorf("nvme: sync %s: %w", filepath.Join(st.rel, path), err)
		}
		return nil
	})
}

// preallocate reserves size bytes for f and makes it exactly size bytes
// long: a longer file left by an earlier attempt is cut, since verification
// reads only size bytes and would pass a stale tail. Where the file system
// cannot fallocate, the file is only extended (sparse), which still sets
// its size.
func preallocate(f *os.File, size int64) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > size {
		if err := f.Truncate(size); err != nil {
			return err
		}
	}
	if size == 0 {
		return nil
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("preallocate %d bytes: %w: %w", size, ErrNoSpace, err)
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
		if st.Size() >= size {
			return nil
		}
		return f.Truncate(size)
	default:
		return fmt.Errorf("preallocate %d bytes: %w", size, err)
	}
}
