package nvme

import (
	"errors"
	"os"
)

// openOwn opens a file the daemon reads for its own purposes (download,
// verification, serving peers) without updating its access time where the
// system allows it: a file's atime then says when something other than the
// daemon (an inference server loading the model) last read it, which is
// what eviction's least-recently-used order needs. With the usual relatime
// mount option, the daemon's own read-back after a download would otherwise
// take the one update a day a file gets. O_NOATIME needs the file's owner
// (or CAP_FOWNER); without it the file is opened as usual.
func openOwn(root *os.Root, name string, flag int, perm os.FileMode) (*os.File, error) {
	if oNoATime != 0 {
		f, err := root.OpenFile(name, flag|oNoATime, perm)
		if !errors.Is(err, os.ErrPermission) {
			return f, err
		}
	}
	return root.OpenFile(name, flag, perm)
}
