package spec

import (
	"fmt"
	"regexp"
	"strings"
)

// HFURL is a parsed hf://org/model[@revision][/subdir] source: a model
// repository on a Hugging Face Hub (or a mirror speaking its protocol).
type HFURL struct {
	// Repo is the repository id, "org/model".
	Repo string
	// Revision is a branch, tag or commit; "main" when the URL names none.
	Revision string
	// Subdir is a folder inside the repository, without slashes at either
	// end; empty for the whole repository.
	Subdir string
}

// DefaultHFRevision is the branch a source without @revision follows.
const DefaultHFRevision = "main"

func (u HFURL) String() string {
	s := "hf://" + u.Repo
	if u.Revision != "" && u.Revision != DefaultHFRevision {
		s += "@" + u.Revision
	}
	if u.Subdir != "" {
		s += "/" + u.Subdir
	}
	return s
}

// The Hub's own rules: names of letters, digits, '.', '_' and '-' that do
// not start with a separator, at most 96 characters. A revision here cannot
// hold a '/' (it would be ambiguous with the subdir): branches like
// "refs/pr/1" are reached through their commit instead.
var (
	hfNameRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$`)
	hfRevisionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// ParseHFURL parses hf://org/model[@revision][/subdir].
func ParseHFURL(s string) (HFURL, error) {
	rest, ok := strings.CutPrefix(s, "hf://")
	if !ok {
		return HFURL{}, fmt.Errorf("source %q: want hf://org/model[@revision][/subdir]", s)
	}
	org, rest, _ := strings.Cut(rest, "/")
	repoAndRev, subdir, _ := strings.Cut(rest, "/")
	name, rev, hasRev := strings.Cut(repoAndRev, "@")
	if !hfNameRE.MatchString(org) || !hfNameRE.MatchString(name) || strings.Contains(org+"/"+name, "..") {
		return HFURL{}, fmt.Errorf("source %q: repository %q is not a valid Hub id (org/model)", s, org+"/"+name)
	}
	if !hasRev {
		rev = DefaultHFRevision
	} else if !hfRevisionRE.MatchString(rev) {
		return HFURL{}, fmt.Errorf("source %q: revision %q: want a branch, tag or commit of letters, digits, '.', '_', '-'", s, rev)
	}
	subdir = strings.TrimSuffix(subdir, "/")
	if subdir != "" {
		// '?' and '#' would end the path of the API URLs the subdir goes into.
		if err := checkFolder(subdir, `\?#`); err != nil {
			return HFURL{}, fmt.Errorf("source %q: subdir %q: %w", s, subdir, err)
		}
	}
	return HFURL{Repo: org + "/" + name, Revision: rev, Subdir: subdir}, nil
}
