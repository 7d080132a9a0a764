package nvme

import (
	"fmt"
	"strings"
)

// MaxRelPathLen bounds a file's path below a revision.
const MaxRelPathLen = 1024

// orgSeparator replaces the '/' of an "org/model" name in its directory name
// (as the Hugging Face cache does), so "org" and "org/model" never share a
// directory and every model is exactly one directory below models/.
const orgSeparator = "--"

// CheckSegment validates one path segment that becomes a directory or file
// name in the store.
func CheckSegment(seg string) error {
	switch {
	case seg == "":
		return fmt.Errorf("empty path segment")
	case seg == "." || seg == "..":
		return fmt.Errorf("path segment %q is not allowed", seg)
	case len(seg) > 255:
		return fmt.Errorf("path segment longer than 255 bytes")
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c < 0x20 || c == 0x7f || c == '/' || c == '\\' {
			return fmt.Errorf("path segment %q has a forbidden character %q", seg, c)
		}
	}
	return nil
}

// CheckRelPath validates a relative file path (from an object key below the
// source prefix) before it is joined to a revision directory: no absolute
// paths, no "." or ".." segments, no empty segments, no control characters or
// backslashes. os.Root enforces the same boundary again when the file is
// opened; this check exists to give a clear error first.
func CheckRelPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty file path")
	}
	if len(p) > MaxRelPathLen {
		return fmt.Errorf("file path longer than %d bytes", MaxRelPathLen)
	}
	if strings.HasPrefix(p, "/") {
		return fmt.Errorf("file path %q is absolute", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if err := CheckSegment(seg); err != nil {
			return fmt.Errorf("file path %q: %w", p, err)
		}
	}
	return nil
}

// CheckRevision validates a revision name: one path segment that cannot be
// mistaken for the current link or Publish's temporary link beside it.
func CheckRevision(rev string) error {
	if err := CheckSegment(rev); err != nil {
		return fmt.Errorf("revision: %w", err)
	}
	if rev == CurrentLink || strings.HasPrefix(rev, ".") {
		return fmt.Errorf("revision %q is reserved: not %q and not starting with '.'", rev, CurrentLink)
	}
	return nil
}

// CheckName validates a model name: "model" or "org/model", neither segment
// containing "--" (the separator of the directory name), the model part of
// "org/model" not starting with '-', and the directory name fitting in one
// path segment. The '-' rule keeps dirName one-to-one: "a-/b" and "a/-b"
// would both be "a---b", so removing one would delete the other.
func CheckName(name string) error {
	segs := strings.Split(name, "/")
	if len(segs) > 2 {
		return fmt.Errorf("model name %q: at most one '/'", name)
	}
	for _, seg := range segs {
		if err := CheckSegment(seg); err != nil {
			return fmt.Errorf("model name %q: %w", name, err)
		}
		if strings.Contains(seg, orgSeparator) || strings.HasPrefix(seg, ".") {
			return fmt.Errorf("model name %q: segments may not contain %q or start with '.'", name, orgSeparator)
		}
	}
	if len(segs) == 2 && strings.HasPrefix(segs[1], "-") {
		return fmt.Errorf("model name %q: the part after '/' may not start with '-'", name)
	}
	if err := CheckSegment(dirName(name)); err != nil {
		return fmt.Errorf("model name %q: %w", name, err)
	}
	return nil
}

// dirName is the directory of a model below models/ and partial/.
func dirName(name string) string { return strings.Replace(name, "/", orgSeparator, 1) }

// nameOfDir inverts dirName. The separator is the last "--": the org part
// may end in '-', but the model part neither contains "--" nor starts
// with '-'.
func nameOfDir(dir string) string {
	i := strings.LastIndex(dir, orgSeparator)
	if i < 0 {
		return dir
	}
	return dir[:i] + "/" + dir[i+len(orgSeparator):]
}
