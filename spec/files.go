package spec

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Bounds on a spec's file patterns, so a spec stays small on the wire.
const (
	MaxPatterns     = 32
	MaxPatternBytes = 256
)

// ValidateSource checks a model source: s3://bucket/prefix/,
// hf://org/model[@revision][/subdir] or a BitTorrent source (see
// TorrentSource).
func ValidateSource(s string) error {
	if IsTorrentSource(s) {
		_, err := ParseTorrentSource(s)
		return err
	}
	if strings.HasPrefix(s, "hf://") {
		_, err := ParseHFURL(s)
		return err
	}
	_, err := ParseS3URL(s)
	return err
}

// Keeps reports whether a model file, at path rel under the source, is
// one the spec asks for: it matches an Include pattern (or there are none)
// and no Exclude pattern. A pattern holding a '/' is matched (path.Match)
// against rel, one without against the file's base name: "*.safetensors"
// keeps every safetensors file, "onnx/*.onnx" only those in onnx/.
func (s Spec) Keeps(rel string) bool {
	return MatchFiles(rel, s.Include, s.Exclude)
}

// MatchFiles is Keeps for any pair of pattern lists.
func MatchFiles(rel string, include, exclude []string) bool {
	match := func(patterns []string) bool {
		for _, p := range patterns {
			name := rel
			if !strings.Contains(p, "/") {
				name = path.Base(rel)
			}
			if ok, _ := path.Match(p, name); ok {
				return true
			}
		}
		return false
	}
	return (len(include) == 0 || match(include)) && !match(exclude)
}

// ValidatePatterns checks a list of file patterns (what is "include" or
// "exclude" in messages).
func ValidatePatterns(what string, patterns []string) error {
	if len(patterns) > MaxPatterns {
		return fmt.Errorf("%s: %d patterns, at most %d", what, len(patterns), MaxPatterns)
	}
	var errs []error
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil || p == "" || len(p) > MaxPatternBytes || strings.ContainsAny(p, "\x00\r\n") {
			errs = append(errs, fmt.Errorf("%s pattern %q: want a path.Match pattern of 1..%d bytes on one line", what, p, MaxPatternBytes))
		}
	}
	return errors.Join(errs...)
}
